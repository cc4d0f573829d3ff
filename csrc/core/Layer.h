// The thread-local functionalize layer and the two RAII guards that change dispatch TLS:
// LayerGuard (enter/exit a layer) and InnerCallGuard (run an op on inner tensors).
// Knows nothing about registration or about wrappers.
#pragma once

#include "core/FunctorchInterop.h"
#include "core/LayerAutograd.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace tfz::detail {

/// One active functionalize call on this thread.
struct Layer {
  int64_t id = 0;  // unique per process; wrappers remember the id of the layer that made them
  bool reapply_views = true;  // remove="mutations" (true) or "mutations_and_views" (false)
  c10::impl::LocalDispatchKeySet entry_tls =  // the TLS to restore exactly on exit
      c10::impl::tls_local_dispatch_key_set();
  c10::DispatchKeySet added_included;    // raw bits this layer added to the included set
  c10::DispatchKeySet removed_included;  // keys this layer took out of the included set
  c10::DispatchKeySet added_excluded;    // keys this layer added to the excluded set
  // torch.func transforms active on entry, moved out while user code runs and swapped back in
  // for inner calls; null when there were none.
  // See Note [Functorch: torch.func transforms].
  FunctorchStashPtr functorch;
  // Created on the first wrapper value with autograd history; removes its hooks on exit.
  // See Note [Autograd: .backward() inside the function].
  std::unique_ptr<LayerAutograd> autograd;
  // A layer that runs a control-flow branch under a tracer: wrappers of enclosing layers it meets
  // are reported for lifting (note_foreign_wrapper), and those already lifted stand for the
  // wrappers of this layer they were passed in as. See Note [Control flow: closures].
  bool lifts_closures = false;
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> substitutes;
  // A dispatch mode (make_fx's tracer) was active on entry: inner calls made while user code
  // set it aside are not traced. See Note [Graphs: views taken with the tracer set aside].
  bool entered_under_modes = false;
  // TorchScript's thread-local optimization setting before entry, restored on exit
  // (Note [Layer: TorchScript fusion groups read data pointers]).
  bool script_optimization_on_entry = true;
  // make_fx's tracer (the PROXY infra mode) on entry, or null: another one active later was
  // started by user code inside the layer. See Note [Layer: tracers started inside].
  const void* tracer_on_entry = nullptr;
  // Storages lifted from captured tensors without views, told when an op writes their plain base
  // unseen. See Note [Alias: captured bases written in place].
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> captured_storages;
  // Under a tracer, the values made leaves inside the layer (requires_grad_ on a wrapper, a
  // parameter built in f): a graph has them as no input that requires grad
  // (Note [Graphs: writes autograd does not see]). Weak references pin the addresses.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> leaves_made_inside;
};

/// Whether user code started a make_fx tracer inside `layer` that is still active: it must see
/// the program's ops on wrappers. See Note [Layer: tracers started inside].
bool tracer_started_inside(const Layer* layer);

// Note [Alias: captured bases written in place]: a storage lifted from a captured tensor, and an
// op that wrote captured plain tensors without bumping their versions (every view of them is
// regenerated at its next read).
void remember_captured_storage(Layer& layer, const c10::Storage& storage);
void note_unseen_write_of_captured(Layer& layer, const at::Tensor& plain);

/// Under a tracer, remembers `leaf`, a value made a leaf that requires grad inside the active
/// layer; is_leaf_made_inside asks. No-ops outside layers and tracers.
void note_leaf_made_inside(const at::Tensor& leaf);
bool is_leaf_made_inside(const c10::TensorImpl* leaf);

/// The wrapper of `layer` that stands for `foreign` (a wrapper of an enclosing layer a branch
/// closes over), or nullptr.
const at::Tensor* substitute_for(const Layer& layer, const c10::TensorImpl* foreign);

/// Makes the current layer lift closures, with `inner[i]` standing for `outer[i]`.
void lift_closures(const std::vector<at::Tensor>& outer, const std::vector<at::Tensor>& inner);

/// Remembers `foreign`, a wrapper of another layer met inside a layer that lifts closures, for
/// the caller that retries with it lifted (take_foreign_wrapper hands it over once).
void note_foreign_wrapper(at::Tensor foreign);
at::Tensor take_foreign_wrapper();

/// The layer user code is running under on this thread, or nullptr (no layer, or we are inside
/// an inner call).
Layer* current_layer();

/// The layer an enclosing InnerCallGuard suspended on this thread, or nullptr. A wrapper of it
/// reaching the kernel means some code captured wrappers into an inner call (torch.func.grad
/// inside the function does), which the engine cannot serve.
Layer* suspended_layer();

/// True while torch runs one of its own tensor constructions that transforms must not see
/// (torch.tensor's data copy): see Note [Layer: torch's untraced regions].
bool in_untraced_region(const Layer& layer);

/// Enters a layer: includes our key, hides Python-level keys, stashes torch.func transforms.
/// Refuses nesting. The destructor restores the thread's dispatch TLS (and functorch's stack)
/// exactly as they were on entry.
class LayerGuard {
 public:
  explicit LayerGuard(bool reapply_views);
  ~LayerGuard();
  LayerGuard(const LayerGuard&) = delete;
  LayerGuard& operator=(const LayerGuard&) = delete;
  const Layer& layer() const { return layer_; }
  /// The layer's autograd bookkeeping, to finish after the input epilogue (may be null).
  std::unique_ptr<LayerAutograd> take_autograd() { return std::move(layer_.autograd); }

 private:
  Layer layer_;
};

/// Scope in which ops are called on inner (plain) tensors: undoes the current layer's TLS changes
/// (computed from the *current* TLS, so guards user code entered meanwhile, such as
/// inference_mode, stay in force), swaps in the torch.func transforms stashed on entry, and
/// suspends the layer. Idempotent when nested.
class InnerCallGuard {
 public:
  InnerCallGuard();
  ~InnerCallGuard();
  InnerCallGuard(const InnerCallGuard&) = delete;
  InnerCallGuard& operator=(const InnerCallGuard&) = delete;
  /// The layer that was active when the guard was entered (nullptr if none).
  Layer* suspended_layer() const { return saved_layer_; }

 private:
  c10::impl::LocalDispatchKeySet saved_tls_;
  Layer* saved_layer_;
  Layer* saved_suspended_;
};

/// Scope for bookkeeping ops on meta tensors (eager-stride references): removes our key like an
/// inner call but keeps the layer's Python keys hidden, so tracers never record these ops.
class MetaComputeGuard {
 public:
  MetaComputeGuard();
  ~MetaComputeGuard();
  MetaComputeGuard(const MetaComputeGuard&) = delete;
  MetaComputeGuard& operator=(const MetaComputeGuard&) = delete;

 private:
  Layer* saved_layer_;
  c10::impl::LocalDispatchKeySet saved_tls_;
};

}  // namespace tfz::detail
