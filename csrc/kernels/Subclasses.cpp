// Recognizing wrapper subclasses among an op's arguments, and the key set and TLS their
// __torch_dispatch__ runs under. See Note [Kernel: wrapper subclasses].
#include "kernels/Subclasses.h"

#include "core/DispatchKey.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/ModeStash.h"

#include <atomic>

namespace tfz::detail {

// Note [Kernel: wrapper subclasses]
// A traceable wrapper subclass (DTensor, or any subclass with __tensor_flatten__ /
// __tensor_unflatten__) passed to functionalize(f) stays that subclass inside f: the Python API
// flattens it at the boundary, wraps its inner tensors like any input, and rebuilds it around the
// wrappers with __tensor_unflatten__ (Note [API: wrapper subclasses] in api.py). An op on the
// rebuilt subclass must then run the subclass's __torch_dispatch__ *above* our layer, so that the
// ops it calls on its inner tensors (the local program) are functionalized by our kernel. But our
// keys sit above Python, and the layer hides Python while f runs (Note [Layer: TLS scheme]), so
// the op reaches our kernel first, with a non-wrapper argument that carries the Python key. The
// kernel recognizes it (is_wrapper_subclass: a key-set test, then, only for tensors with the
// Python key, the predicate the Python module installs) and redispatches the op below our keys
// with Python and PythonTLSSnapshot added back (subclass_dispatch_keys), under SubclassCallGuard:
// the Python keys unhidden, the layer still active, and the thread's dispatch modes (a tracer's)
// stashed (ModeStash.h). Two facts of torch force the stash: inside __torch_dispatch__ torch
// excludes every key above Python, ours included, so the subclass's calls on the inner wrappers
// reach our kernel at the backend key PrivateUse3, which is *below* Python; with make_fx's mode on
// the stack it would record those calls on our wrappers as constants before we see them. With
// the modes stashed they reach us, and InnerCallGuard puts the modes back for its inner call, so
// the tracer records the functional op on plain tensors as for any wrapper. Limits: ops the
// subclass's dispatch runs on plain tensors it makes itself (not on the inner wrappers) are
// neither functionalized nor traced (under a tracer they become constants); FakeTensor and other
// subclasses without __tensor_flatten__ keep the old path (values inside our wrappers, or
// captured constants). Rejected: unhiding Python for all of f (a tracer's mode would then see
// every op on our wrappers, the very thing the TLS scheme prevents); a TorchDispatchMode that runs
// subclasses (cannot serve the C++ API and costs every op, Note [Which dispatch key]); keeping the
// subclass as our wrapper's inner value (its dispatch then runs below our layer: values right,
// but f sees a plain tensor and a tracer records subclass-level ops).

namespace {
std::atomic<SubclassPredicate> subclass_predicate{nullptr};
}  // namespace

void set_subclass_predicate(SubclassPredicate predicate) {
  subclass_predicate.store(predicate);
}

bool is_wrapper_subclass(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(c10::DispatchKey::Python)) return false;
  if (maybe_get_impl(t) != nullptr) return false;
  SubclassPredicate predicate = subclass_predicate.load();
  return predicate != nullptr && predicate(t);
}

c10::DispatchKeySet subclass_dispatch_keys(c10::DispatchKeySet ks) {
  // Below our autograd key (the subclass's own autograd key goes too: autograd runs on the inner
  // tensors, as for wrappers), without our backend bit and factory key, plus the Python keys.
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kAutogradKey);
  return raw_minus(below, layer_included_keys()) | python_keys();
}

SubclassCallGuard::SubclassCallGuard() : saved_tls_(c10::impl::tls_local_dispatch_key_set()) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    auto& stash = stashed_dispatch_modes();
    saved_stash_ = std::move(stash);
    stash = c10::impl::TorchDispatchModeTLS::get_state();
    c10::impl::TorchDispatchModeTLS::set_state({});  // also drops the modes' Python keys
    stashed_ = true;
  }
  auto tls = c10::impl::tls_local_dispatch_key_set();
  tls.excluded_ = tls.excluded_ - python_keys();
  c10::impl::_force_tls_local_dispatch_key_set(tls);
}

SubclassCallGuard::~SubclassCallGuard() {
  if (stashed_) {
    auto& stash = stashed_dispatch_modes();
    c10::impl::TorchDispatchModeTLS::set_state(*stash);
    stash = std::move(saved_stash_);
  }
  c10::impl::_force_tls_local_dispatch_key_set(saved_tls_);
}

}  // namespace tfz::detail
