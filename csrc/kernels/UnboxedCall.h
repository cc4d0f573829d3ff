// One unboxed call's arguments, private to kernels/UnboxedKernels.cpp: the scan that picks the
// call's route and the routes served by typed redispatches (take_route), unwrapping and
// rewrapping (Call), and the hand-over to the boxed kernel for the rare cases
// (run_on_boxed_kernel). See Note [Kernel: unboxed fast path]; the kernels themselves are in
// UnboxedKernels.cpp.
#pragma once

#include "kernels/CallRoute.h"
#include "kernels/Registration.h"
#include "kernels/Subclasses.h"

#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Recorder.h"

#include <ATen/core/boxing/impl/boxing.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace tfz::detail::unboxed {

template <class T>
using Bare = std::remove_cv_t<std::remove_reference_t<T>>;

template <class T>
constexpr bool is_tensor_v = std::is_same_v<Bare<T>, at::Tensor>;
template <class T>
constexpr bool is_optional_tensor_v = std::is_same_v<Bare<T>, std::optional<at::Tensor>>;

// Tensor lists: ops taking them stay on the boxed kernel (Call does not unwrap lists).
template <class T>
constexpr bool is_tensor_list_v =
    std::is_same_v<Bare<T>, at::ITensorListRef> || std::is_same_v<Bare<T>, at::TensorList> ||
    std::is_same_v<Bare<T>, c10::List<std::optional<at::Tensor>>>;

// One call's view of its tensor arguments: the scan that decides its route, then unwrapping,
// remembering which inner value came from which wrapper (for results that are an argument itself).
template <size_t MaxTensors>
class Call {
 public:
  explicit Call(Layer* layer) : layer_(layer), scan_(layer) {}

  void scan(const at::Tensor& t) { scan_.scan(t); }
  void scan(const std::optional<at::Tensor>& t) {
    if (t.has_value()) scan_.scan(*t);
  }
  template <class T, std::enable_if_t<!is_tensor_v<T> && !is_optional_tensor_v<T>, int> = 0>
  void scan(const T& /*not a tensor*/) {}

  const ArgScan& scanned() const { return scan_; }

  const at::Tensor& unwrap(const at::Tensor& t) {
    auto* impl = maybe_get_impl(t);
    if (impl == nullptr) {
      // See Note [Autograd: saved outputs under a tracer] and
      // Note [Autograd: formula temporaries written in place].
      if (C10_UNLIKELY(
              (t.unsafeGetTensorImpl()->autograd_meta() != nullptr || ops_are_recorded()) &&
              held_count_ < MaxTensors)) {
        if (auto traced = traced_saved_output(t)) {
          held_[held_count_] = *std::move(traced);
          return held_[held_count_++];
        }
      }
      return t;
    }
    impl->sync_();
    // A mutable op may unwrap twice (the in-place attempt, then the functional variant); only
    // Unboxed's single pass reads seen_ back (wrap), so later entries are not kept.
    if (count_ < MaxTensors) seen_[count_++] = {impl->value().unsafeGetTensorImpl(), &t};
    return impl->value();
  }
  std::optional<at::Tensor> unwrap(const std::optional<at::Tensor>& t) {
    if (!t.has_value()) return t;
    return unwrap(*t);
  }
  template <class T, std::enable_if_t<!is_tensor_v<T> && !is_optional_tensor_v<T>, int> = 0>
  T&& unwrap(T&& x) {
    return std::forward<T>(x);
  }

  at::Tensor wrap(at::Tensor&& out) const {
    if (!out.defined()) return std::move(out);
    for (size_t i = 0; i < count_; ++i) {
      if (out.unsafeGetTensorImpl() == seen_[i].inner) return *seen_[i].wrapper;
    }
    return make_fresh_wrapper(out, layer_->id);
  }
  template <class... Ts>
  std::tuple<Ts...> wrap(std::tuple<Ts...>&& outs) const {
    return std::apply([&](auto&&... o) { return std::tuple<Ts...>(wrap(std::move(o))...); },
                      std::move(outs));
  }

 private:
  struct Seen {
    const c10::TensorImpl* inner;
    const at::Tensor* wrapper;
  };
  Layer* layer_;
  ArgScan scan_;
  std::array<Seen, MaxTensors> seen_{};
  size_t count_ = 0;
  std::array<at::Tensor, MaxTensors> held_;  // traced tensors handed out in place of plain ones
  size_t held_count_ = 0;
};

inline bool any_requires_grad(const at::Tensor& t) {
  return t.requires_grad();
}
inline bool any_requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->requires_grad();
}
template <class T, std::enable_if_t<!is_tensor_v<T> && !is_optional_tensor_v<T>, int> = 0>
bool any_requires_grad(const T& /*not a tensor*/) {
  return false;
}

// A tensor argument as an IValue for the shared boxed helpers; other arguments as None.
inline c10::IValue as_ivalue(const at::Tensor& t) {
  return c10::IValue(t);
}
inline c10::IValue as_ivalue(const std::optional<at::Tensor>& t) {
  return t.has_value() ? c10::IValue(*t) : c10::IValue();
}
template <class T, std::enable_if_t<!is_tensor_v<T> && !is_optional_tensor_v<T>, int> = 0>
c10::IValue as_ivalue(const T& /*not a tensor*/) {
  return c10::IValue();
}

// An op's results on plain values under a tracer, the create_graph case of
// See Note [Autograd: saved outputs under a tracer].
inline void note_plain_results(const at::Tensor& t) {
  note_traced_plain_output(t);
}
template <class... T>
void note_plain_results(const std::tuple<T...>& results) {
  std::apply([](const auto&... r) { (note_plain_results(r), ...); }, results);
}
template <class T, std::enable_if_t<!is_tensor_v<T>, int> = 0>
void note_plain_results(const T& /*not a tensor*/) {}

// The boxed kernel on these arguments, for the rare cases a listed op hands back to it; the
// stack holds the op's returns afterwards.
template <class OpT, class... A>
torch::jit::Stack run_on_boxed_kernel(c10::DispatchKeySet ks, A&&... args) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow(OpT::name, OpT::overload_name);
  static const KernelPlan plan = plan_for_kernel(op);
  torch::jit::Stack stack;
  torch::jit::push(stack, std::forward<A>(args)...);
  run_boxed_kernel(plan, op, ks, &stack);
  return stack;
}

// The route (Note [Kernel: one route into every call]) as both fast paths take it: the routes
// that need nothing of the op are served here by typed redispatches; `to_boxed()` hands the call
// to the boxed kernel, `on_plain()` and `on_wrappers()` are the op's own handling.
template <class Ret, class OpT, class CallT, class ToBoxed, class OnPlain, class OnWrappers,
          class... A>
Ret take_route(c10::DispatchKeySet ks, Layer* layer, CallT& call, const std::string& (*name)(),
               ToBoxed&& to_boxed, OnPlain&& on_plain, OnWrappers&& on_wrappers, A&... args) {
  if (const auto early = route_before_scan(layer)) {
    if (*early == Route::Autograd) return OpT::redispatch(autograd_delegate_keys(ks), args...);
    return to_boxed();
  }
  (call.scan(args), ...);
  switch (route_after_scan(call.scanned(), ks, layer, name, /*is_view=*/false)) {
    case Route::Subclass: {
      SubclassCallGuard guard;
      return OpT::redispatch(subclass_dispatch_keys(ks), args...);
    }
    case Route::ZeroTensor:
      return OpT::redispatch(zero_tensor_keys(), args...);
    case Route::PlainUntraced: {
      MetaComputeGuard guard;
      return OpT::call(args...);
    }
    case Route::Plain:
      return on_plain();
    case Route::Wrappers:
      return on_wrappers();
    case Route::Autograd:  // (decided before the scan, with TracerInside)
    case Route::TracerInside:
    case Route::LiftClosure:
      break;
  }
  return to_boxed();
}

}  // namespace tfz::detail::unboxed
