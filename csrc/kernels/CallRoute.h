// The first decision of every kernel of ours, boxed or unboxed: where a call goes before any
// op-specific handling, from the thread's state and one scan of the tensor arguments. Header-only:
// the unboxed fast paths inline it. See Note [Kernel: one route into every call].
#pragma once

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/FunctorchInterop.h"
#include "core/Layer.h"
#include "kernels/Handlers.h"
#include "kernels/Subclasses.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>

namespace tfz::detail {

// Note [Kernel: one route into every call]
// A call reaching our key goes one of eight ways before the op's own handling, decided in this
// order (the first that holds):
//   Autograd       a torch.func transform pushed inside the layer is processing the op: it is
//                  autograd's (Note [Functorch: torch.func transforms]);
//   TracerInside   make_fx started inside the layer sees the op on wrappers first
//                  (Note [Layer: tracers started inside]);
//   LiftClosure    a wrapper of an enclosing layer, in a control-flow branch that lifts closures
//                  (Note [Control flow: closures]); a foreign wrapper anywhere else raises here,
//                  naming why (report_foreign_wrapper);
//   Subclass       a wrapper subclass among the arguments (Note [Kernel: wrapper subclasses]);
//   PlainUntraced  no wrapper of ours, inside torch's untraced region
//                  (Note [Layer: torch's untraced regions]);
//   Plain          no wrapper of ours;
//   ZeroTensor     an efficient zero tensor among them (Note [Kernel: efficient zero tensors]);
//   Wrappers       wrappers of the current layer: the op's own handling.
// The boxed kernel (every op) and the unboxed fast paths (Note [Kernel: unboxed fast path]) both
// take this decision from route_before_scan and route_after_scan, so the fast paths follow the
// boxed kernel's order by construction: they differ only in how they act on a route (a typed
// redispatch where the boxed kernel pushes a stack), and hand the routes they do not serve
// themselves to the boxed kernel. The boxed kernel's own refinements of a route (a plain view
// lifted without views, a plain write into a backward formula's temporary) concern ops or cases
// the fast paths never take or hand back.
// Rejected: each kernel restating the checks, as the fast paths did first: one of them (the
// untraced region) was missing there, a drift no test could see until an op of the list ran in
// such a region.
enum class Route : uint8_t {
  Autograd,
  TracerInside,
  LiftClosure,
  Subclass,
  PlainUntraced,
  Plain,
  ZeroTensor,
  Wrappers,
};

/// The routes decided before looking at the arguments, or nullopt.
inline std::optional<Route> route_before_scan(const Layer* layer) {
  if (C10_UNLIKELY(functorch_processing())) return Route::Autograd;
  if (C10_UNLIKELY(tracer_started_inside(layer))) return Route::TracerInside;
  return std::nullopt;
}

/// One pass over a call's tensor arguments: are any ours, of which layer, and do they carry what
/// the routes and the fast paths ask about.
class ArgScan {
 public:
  explicit ArgScan(const Layer* layer) : layer_(layer) {}

  void scan(const at::Tensor& t) {
    auto* impl = maybe_get_impl(t);
    if (impl == nullptr) {
      subclass_ = subclass_ || (layer_ != nullptr && is_wrapper_subclass(t));
      return;
    }
    any_ = true;
    reference_ = reference_ || impl->has_reference_metadata();
    if (foreign_ == nullptr && (layer_ == nullptr || impl->layer_id() != layer_->id)) {
      foreign_ = impl;
    }
  }

  /// Some argument is a wrapper of ours.
  bool any() const { return any_; }
  /// Some wrapper reports other metadata than its value's (without views): a fast path checks
  /// Note [Strides: what eager gives], case "op results".
  bool reference() const { return reference_; }
  bool subclass() const { return subclass_; }
  /// The first wrapper of another layer (or of none), or nullptr.
  const FunctionalTensorImpl* foreign() const { return foreign_; }

 private:
  const Layer* layer_;
  bool any_ = false;
  bool reference_ = false;
  bool subclass_ = false;
  const FunctionalTensorImpl* foreign_ = nullptr;
};

/// The route after the scan; raises for a foreign wrapper outside a layer that lifts closures,
/// naming the op `op_name()` returns (called only then: the fast paths build no name per call).
/// `is_view`: view ops do not take the ZeroTensor route (see its Note).
template <class OpName>
Route route_after_scan(const ArgScan& scan, c10::DispatchKeySet ks, const Layer* layer,
                       const OpName& op_name, bool is_view) {
  if (C10_UNLIKELY(scan.foreign() != nullptr)) {
    if (lifts_closures(layer)) return Route::LiftClosure;
    report_foreign_wrapper(op_name(), *scan.foreign(), layer);
  }
  if (C10_UNLIKELY(scan.subclass())) return Route::Subclass;
  if (!scan.any()) {
    return layer != nullptr && C10_UNLIKELY(in_untraced_region(*layer)) ? Route::PlainUntraced
                                                                        : Route::Plain;
  }
  if (C10_UNLIKELY(ks.has(c10::DispatchKey::ZeroTensor)) && !is_view) return Route::ZeroTensor;
  return Route::Wrappers;
}

}  // namespace tfz::detail
