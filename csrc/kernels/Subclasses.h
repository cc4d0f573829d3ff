// Tensor subclasses that run above the layer (DTensor, any traceable wrapper subclass rebuilt by
// the Python API around wrappers): how the kernel recognizes one among an op's arguments and
// hands the op to the subclass's __torch_dispatch__. See Note [Kernel: wrapper subclasses].
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <optional>

namespace tfz::detail {

/// Answers whether a tensor with the Python key is a traceable wrapper subclass (has
/// __tensor_flatten__). Set by the Python module at import; unset (C++ API only), no tensor is.
using SubclassPredicate = bool (*)(const at::Tensor&);
void set_subclass_predicate(SubclassPredicate predicate);

/// True if `t` is not a wrapper, carries the Python key and the predicate calls it a traceable
/// wrapper subclass. Costs a key-set test for every other tensor.
bool is_wrapper_subclass(const at::Tensor& t);

/// The key set to redispatch an op on a wrapper subclass with: `ks` without our keys (the op has
/// reached us already), plus the Python keys the layer hides.
c10::DispatchKeySet subclass_dispatch_keys(c10::DispatchKeySet ks);

/// Scope of a subclass's __torch_dispatch__: the layer's TLS with the Python keys unhidden and
/// the thread's dispatch modes stashed (ModeStash.h; inner calls put them back); the layer stays
/// active, so the subclass's own calls on wrappers reach our kernel.
class SubclassCallGuard {
 public:
  SubclassCallGuard();
  ~SubclassCallGuard();
  SubclassCallGuard(const SubclassCallGuard&) = delete;
  SubclassCallGuard& operator=(const SubclassCallGuard&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_tls_;
  std::optional<c10::impl::TorchDispatchModeTLS> saved_stash_;
  bool stashed_ = false;
};

}  // namespace tfz::detail
