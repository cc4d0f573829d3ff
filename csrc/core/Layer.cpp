// Thread-local layer state and the TLS arithmetic of LayerGuard / InnerCallGuard.
// See Note [Layer: TLS scheme].
#include "core/Layer.h"

#include "core/AliasStorage.h"
#include "core/DispatchKey.h"
#include "core/ModeStash.h"
#include "core/Recorder.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace tfz::detail {

// Note [Layer: TLS scheme]
// While user code runs inside functionalize, the thread's dispatch TLS is:
//   included = entry.included - {PreDispatch} | {AutogradPrivateUse3, DeferredInit}
//   excluded = entry.excluded | {Python, PythonTLSSnapshot}
// Including our keys makes tensor-free ops (torch.zeros, at::arange, the lift_fresh behind
// torch.tensor) reach our kernel, so their results can be wrapped (Note [Which dispatch key]).
// Hiding Python keeps TorchDispatchModes (make_fx's proxy mode) from ever seeing a wrapper, and
// keeps PythonTLSSnapshot from snapshotting a TLS that still includes our key. Every redispatch on
// inner tensors runs under InnerCallGuard, which undoes exactly these changes on top of whatever
// the TLS is *now*, so the tracer below sees the caller's keys. Only full snapshot/restore is used
// (_force_tls_local_dispatch_key_set): our included key carries the PrivateUse3 *backend* bit,
// which DispatchKeySet::operator- does not clear, so the delta-based
// Include/ExcludeDispatchKeyGuard would leak it into the thread forever. Rejected: a
// functorch-style DynamicLayer front/back key pair. Those keys belong to functorch and its
// interpreter stack; borrowing them would entangle us with torch.func transforms.

// Note [Layer: TorchScript fusion groups read data pointers]
// A torch.jit.script function is profiled on its first calls and then optimized: its pointwise
// ops become fusion groups, kernels TorchScript generates (for CUDA by default) that take their
// arguments' data_ptr() outside the dispatcher. A wrapper's storage holds no memory, so its data
// pointer is null (and must stay readable: torch code compares data pointers, e.g.
// nn.RNN.flatten_parameters), and a fusion group built inside f reads and writes address 0 on the
// GPU: an illegal memory access, which poisons the process's CUDA context. So while a layer is
// active the thread runs TorchScript unoptimized (TorchScript's own setting for that is
// thread-local): a script function first called inside f runs the plan every op of which
// dispatches, to our kernel, and is optimized on its first calls outside f as usual. A function
// (or a script module's method) whose optimized plan was made before f ran would keep it inside f
// (torch returns a made plan before it reads the setting), so from Python its first call in each
// layer drops its plans (torchscript_plans.py: _debug_flush_compilation_cache), and it makes the
// unoptimized one; it optimizes again after f. C++ callers of torch::jit modules are not covered.
// Rejected: switching off the tensor-expression fuser alone (the profiling executor then hands
// the same graphs to the legacy fuser, whose kernels read data pointers too, and the switch is
// process-wide), and a storage whose data pointer throws (it breaks the RNN check above).

namespace {
// One thread_local object rather than two: in a dlopen'ed library every access to a distinct
// thread_local is a __tls_get_addr call, and the guards below run on every op.
struct ThreadState {
  Layer* layer = nullptr;      // the layer user code runs under
  Layer* suspended = nullptr;  // the layer an enclosing InnerCallGuard suspended
  int64_t joined_id = 0;       // id of another thread's layer this thread joined, or 0
};
thread_local ThreadState tls_state;
std::atomic<int64_t> next_layer_id{1};

// Note [Layer: threads that carry a layer's TLS]
// Autograd runs the backward of CUDA tensors on a device thread of its own, under the
// ThreadLocalState of the thread that called backward() or autograd.grad: the dispatch TLS that
// includes our keys comes along, but a layer is a thread_local of the thread that entered it. So
// the device thread would meet the layer's wrappers with no layer and call them escaped: every
// torch.autograd.grad, torch.func.grad and .backward() inside f on CUDA would fail. Code that moves
// work with at::ThreadLocalStateGuard does the same on any device. Such a thread joins the layer:
// when our key is in its TLS and it has no layer of its own, it takes the one layer active in the
// process, with the recorder that layer's thread had (capture), and keeps it while that layer lives
// and the thread's TLS still includes our key. With several layers active at once (threads
// functionalizing concurrently) the choice is ambiguous: the thread joins none, and the wrappers it
// meets get the escaped-tensor error. The layer's thread waits in backward() meanwhile; a backward
// graph with both CPU and CUDA nodes runs the CPU ones on that thread at the same time, and the
// layer's structures take no lock for that (docs/cuda.md).
// Rejected: carrying the layer in c10::ThreadLocalDebugInfo, which ThreadLocalState propagates too
// (its slots are a fixed enum in torch 2.11, so it would take version-dependent code, and a
// thread would still hold the layer after the layer ended), and locking every layer structure.
struct ActiveLayer {
  Layer* layer;
  int64_t id;
  Recorder* recorder;
};
std::mutex active_layers_mutex;
std::vector<ActiveLayer> active_layers;

Layer* join_or_leave_layer(ThreadState& state) {
  std::lock_guard<std::mutex> lock(active_layers_mutex);
  const bool carries = c10::impl::tls_is_dispatch_key_included(kAutogradKey);
  if (state.joined_id != 0) {
    if (state.layer == nullptr) return nullptr;  // inside an inner call of the joined layer
    const bool alive = std::any_of(active_layers.begin(), active_layers.end(),
                                   [&](const ActiveLayer& a) { return a.id == state.joined_id; });
    if (carries && alive) return state.layer;
    state.layer = nullptr;
    state.joined_id = 0;
    set_active_recorder(nullptr);
  }
  if (!carries || active_layers.size() != 1) return nullptr;
  const ActiveLayer& only = active_layers.front();
  state.layer = only.layer;
  state.joined_id = only.id;
  set_active_recorder(only.recorder);
  return state.layer;
}
}  // namespace

std::optional<c10::impl::TorchDispatchModeTLS>& stashed_dispatch_modes() {
  thread_local std::optional<c10::impl::TorchDispatchModeTLS> stash;
  return stash;
}

namespace {
// Whether the InnerCallGuard now open put stashed modes back. Inner calls of a layer do not nest
// (an inner call suspends the layer), so one flag per thread is enough.
thread_local bool inner_restored_modes = false;
}  // namespace

Layer* current_layer() {
  ThreadState& state = tls_state;
  if (C10_LIKELY(state.joined_id == 0)) {
    if (C10_LIKELY(state.layer != nullptr)) return state.layer;
    if (C10_LIKELY(!c10::impl::tls_is_dispatch_key_included(kAutogradKey))) return nullptr;
  }
  // See Note [Layer: threads that carry a layer's TLS]
  return join_or_leave_layer(state);
}

Layer* suspended_layer() {
  return tls_state.suspended;
}

const at::Tensor* substitute_for(const Layer& layer, const c10::TensorImpl* foreign) {
  for (const auto& [impl, wrapper] : layer.substitutes) {
    if (impl == foreign) return &wrapper;
  }
  return nullptr;
}

void lift_closures(const std::vector<at::Tensor>& outer, const std::vector<at::Tensor>& inner) {
  Layer* layer = current_layer();
  TORCH_CHECK(layer != nullptr && outer.size() == inner.size(),
              "lift_closures: called outside a layer, or with unpaired tensors");
  layer->lifts_closures = true;
  layer->substitutes.clear();
  for (size_t i = 0; i < outer.size(); ++i) {
    layer->substitutes.emplace_back(outer[i].unsafeGetTensorImpl(), inner[i]);
  }
}

namespace {
thread_local at::Tensor tls_foreign_wrapper;
}  // namespace

void note_foreign_wrapper(at::Tensor foreign) {
  tls_foreign_wrapper = std::move(foreign);
}

at::Tensor take_foreign_wrapper() {
  return std::exchange(tls_foreign_wrapper, at::Tensor());
}

// Note [Layer: torch's untraced regions]
// torch.tensor(data) builds its tensor in a scope that hides it from every transform: it excludes
// the Python key (so make_fx's mode does not see it) and functorch's FuncTorchDynamicLayerFrontMode
// (so torch.func does not), calls at::empty, and fills the memory with a raw copy no op records.
// Our factory key is not among the excluded keys, so that at::empty would reach us, and our inner
// call unhide Python: with deterministic fill of uninitialized memory on, empty's own fill_ would
// then reach make_fx, and the graph refill the constant with the fill value at every replay.
// Python cannot tell us apart (the layer hides it too), but the functorch key can: when the
// thread excludes FuncTorchDynamicLayerFrontMode and the layer's entry TLS did not, torch is in
// such a scope, and a call with only plain tensors runs as if no layer were active, neither
// traced nor wrapped (the lift_fresh that follows wraps the finished tensor). Rejected: a
// torch.tensor special case in Python (the C++ API and torch.as_tensor take the same path).
bool in_untraced_region(const Layer& layer) {
  constexpr auto key = c10::DispatchKey::FuncTorchDynamicLayerFrontMode;
  return c10::impl::tls_is_dispatch_key_excluded(key) && !layer.entry_tls.excluded_.has(key);
}

// Note [Layer: tracers started inside]
// make_fx active when the layer is entered (make_fx(functionalize(f))) is hidden from user code
// and sees the functionalized ops on values, which it traced. A make_fx that user code starts
// inside the layer (make_fx called in f, torch.func.linearize's make_fx of its jvp) was hidden
// the same way and saw only those inner ops, on values it had never tracked: it held them as
// constants and its graph was silently wrong on other inputs (torch.func's functionalize the
// same). Eager gives such a tracer the program's own ops on the tensors it tracks, so while one
// is active the kernel sends each op on wrappers to the Python key first: the tracer records
// the op on wrappers and runs it again with itself set aside (its infra slot empty), and then
// the op reaches our kernel as usual. Only make_fx's mode is routed so: other dispatch modes
// user code pushes inside f (FlopCounterMode, allow_mutation_on_saved_tensors' clone mode) read
// or change values, for which the inner ops are right, and allow_mutation_on_saved_tensors lost
// its gradients when its ops were routed (its clones then ran below our autograd-level kernel).
// Rejected: routing every mode pushed inside (that last case), and refusing make_fx inside f by
// name (it is ordinary client code, and routing makes it trace as eager).
namespace {
// The Python object of make_fx's active mode, or null. (Not the TLS slot's holder, which is a
// new one each time make_fx puts a mode back: an inner make_fx's exit restores the outer's.)
const void* active_tracer() {
  const auto& mode =
      c10::impl::TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::PROXY);
  if (!mode.has_value() || *mode == nullptr) return nullptr;
  return (*mode)->ptr(&(*mode)->pyinterpreter());
}
}  // namespace

bool tracer_started_inside(const Layer* layer) {
  if (layer == nullptr) return false;
  const void* tracer = active_tracer();
  return tracer != nullptr && tracer != layer->tracer_on_entry;
}

LayerGuard::LayerGuard(bool reapply_views) {
  if (tls_state.joined_id != 0) current_layer();  // forget a joined layer that has ended
  TORCH_CHECK(
      tls_state.layer == nullptr,
      "functionalize: nested functionalize calls on one thread are not supported (a layer is "
      "already active). Functionalize the outer function only; the inner one is then "
      "functionalized as part of it.");
  auto entry = c10::impl::tls_local_dispatch_key_set();
  const auto ours = layer_included_keys();
  // torch.func transforms active here are outside our layer: user code must not see them
  // (Note [Functorch: torch.func transforms]).
  layer_.functorch = take_functorch_stack(entry);
  auto hidden_included = c10::DispatchKeySet(c10::DispatchKey::PreDispatch);
  if (layer_.functorch) hidden_included = hidden_included | functorch_mode_keys();
  layer_.id = next_layer_id.fetch_add(1);
  layer_.reapply_views = reapply_views;
  layer_.entry_tls = entry;
  layer_.entered_under_modes = c10::impl::TorchDispatchModeTLS::stack_len() > 0;
  layer_.tracer_on_entry = active_tracer();
  layer_.added_included = raw_minus(ours, entry.included_);
  layer_.removed_included = entry.included_ & hidden_included;
  layer_.added_excluded = layer_hidden_keys() - entry.excluded_;

  c10::impl::LocalDispatchKeySet inside = entry;
  inside.included_ = raw_union(entry.included_ - hidden_included, ours);
  inside.excluded_ = entry.excluded_ | layer_hidden_keys();
  c10::impl::_force_tls_local_dispatch_key_set(inside);
  tls_state.layer = &layer_;
  std::lock_guard<std::mutex> lock(active_layers_mutex);
  active_layers.push_back({&layer_, layer_.id, active_recorder()});
  // See Note [Layer: TorchScript fusion groups read data pointers].
  layer_.script_optimization_on_entry = torch::jit::getGraphExecutorOptimize();
  torch::jit::setGraphExecutorOptimize(false);
}

LayerGuard::~LayerGuard() {
  torch::jit::setGraphExecutorOptimize(layer_.script_optimization_on_entry);
  c10::impl::_force_tls_local_dispatch_key_set(layer_.entry_tls);
  // Transforms user code pushed are popped by their own scopes; what is left is ours to restore.
  if (layer_.functorch) swap_functorch_stack(*layer_.functorch);
  tls_state.layer = nullptr;
  std::lock_guard<std::mutex> lock(active_layers_mutex);
  active_layers.erase(std::find_if(active_layers.begin(), active_layers.end(),
                                   [&](const ActiveLayer& a) { return a.id == layer_.id; }));
}

InnerCallGuard::InnerCallGuard() : saved_tls_(c10::impl::tls_local_dispatch_key_set()) {
  ThreadState& state = tls_state;
  saved_layer_ = state.layer;
  saved_suspended_ = state.suspended;
  c10::impl::LocalDispatchKeySet inner = saved_tls_;
  if (saved_layer_ != nullptr) {
    inner.included_ = raw_union(raw_minus(saved_tls_.included_, saved_layer_->added_included),
                                saved_layer_->removed_included);
    inner.excluded_ = saved_tls_.excluded_ - saved_layer_->added_excluded;
    // Inside a wrapper subclass's dispatch: the tracer below us gets its modes back
    // (Note [Kernel: wrapper subclasses]).
    auto& stash = stashed_dispatch_modes();
    if (C10_UNLIKELY(stash.has_value()) && c10::impl::TorchDispatchModeTLS::stack_len() == 0) {
      c10::impl::TorchDispatchModeTLS::set_state(*stash);
      inner_restored_modes = true;
      inner.included_ = inner.included_ | python_keys();
      inner.excluded_ = inner.excluded_ - python_keys();
    }
  } else {
    // No layer (or already inside an inner call): just make sure our key is gone.
    inner.included_ = raw_minus(saved_tls_.included_, layer_included_keys());
  }
  c10::impl::_force_tls_local_dispatch_key_set(inner);
  if (saved_layer_ != nullptr) {
    state.suspended = saved_layer_;
    if (saved_layer_->functorch) swap_functorch_stack(*saved_layer_->functorch);
  }
  state.layer = nullptr;
}

InnerCallGuard::~InnerCallGuard() {
  if (saved_layer_ != nullptr && C10_UNLIKELY(inner_restored_modes)) {
    inner_restored_modes = false;
    c10::impl::TorchDispatchModeTLS::set_state({});
  }
  c10::impl::_force_tls_local_dispatch_key_set(saved_tls_);
  if (saved_layer_ != nullptr && saved_layer_->functorch) {
    swap_functorch_stack(*saved_layer_->functorch);
  }
  ThreadState& state = tls_state;
  state.layer = saved_layer_;
  state.suspended = saved_suspended_;
}

MetaComputeGuard::MetaComputeGuard()
    : saved_layer_(tls_state.layer), saved_tls_(c10::impl::tls_local_dispatch_key_set()) {
  c10::impl::LocalDispatchKeySet inner = saved_tls_;
  inner.included_ = raw_minus(saved_tls_.included_, layer_included_keys());
  inner.excluded_ = saved_tls_.excluded_ | layer_hidden_keys();
  c10::impl::_force_tls_local_dispatch_key_set(inner);
  tls_state.layer = nullptr;
}

MetaComputeGuard::~MetaComputeGuard() {
  c10::impl::_force_tls_local_dispatch_key_set(saved_tls_);
  tls_state.layer = saved_layer_;
}

void remember_captured_storage(Layer& layer, const c10::Storage& storage) {
  auto& storages = layer.captured_storages;
  // Pruned of dead storages whenever the count reaches a power of two (a loop inside the function
  // lifts the same parameters on every step).
  if (storages.size() >= 64 && (storages.size() & (storages.size() - 1)) == 0) {
    storages.erase(std::remove_if(storages.begin(), storages.end(),
                                  [](const auto& weak) { return weak.expired(); }),
                   storages.end());
  }
  storages.emplace_back(storage.getWeakStorageImpl());
}

void note_unseen_write_of_captured(Layer& layer, const at::Tensor& plain) {
  if (!plain.unsafeGetTensorImpl()->has_storage()) return;
  const c10::StorageImpl* written = plain.storage().unsafeGetStorageImpl();
  for (const auto& weak : layer.captured_storages) {
    auto storage = weak.lock();
    if (!storage) continue;
    auto* alias = static_cast<AliasStorage*>(storage.get());
    const at::Tensor& base = alias->base();
    if (base.unsafeGetTensorImpl()->has_storage() &&
        base.storage().unsafeGetStorageImpl() == written) {
      alias->mark_captured_base_written();
    }
  }
}

namespace {
Layer* active_or_suspended_layer() {
  Layer* layer = current_layer();
  return layer != nullptr ? layer : suspended_layer();
}
}  // namespace

void note_leaf_made_inside(const at::Tensor& leaf) {
  Layer* layer = active_or_suspended_layer();
  if (layer == nullptr || !ops_are_recorded()) return;
  layer->leaves_made_inside.emplace_back(
      c10::weak_intrusive_ptr<c10::TensorImpl>(leaf.getIntrusivePtr()));
}

bool is_leaf_made_inside(const c10::TensorImpl* leaf) {
  const Layer* layer = active_or_suspended_layer();
  if (layer == nullptr) return false;
  for (const auto& weak : layer->leaves_made_inside) {
    if (weak._unsafe_get_target() == leaf) return true;
  }
  return false;
}

}  // namespace tfz::detail
