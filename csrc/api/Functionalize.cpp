// The public C++ API (include/torch_functionalize/functionalize.h): the whole-call transform,
// the guard, and the wrapper helpers, composed from core/ and the kernels' registration.
#include <torch_functionalize/functionalize.h>

#include "api/Call.h"
#include "api/Epilogue.h"
#include "api/InputGroups.h"
#include "core/Conversions.h"
#include "core/Layer.h"
#include "kernels/Registration.h"

#include <c10/util/Exception.h>

namespace tfz {

using detail::get_impl;
using detail::maybe_get_impl;

Remove parse_remove(const std::string& remove) {
  if (remove == "mutations") return Remove::Mutations;
  if (remove == "mutations_and_views") return Remove::MutationsAndViews;
  TORCH_CHECK_VALUE(false,
                    "functionalize: remove must be \"mutations\" or "
                    "\"mutations_and_views\"; got \"",
                    remove, "\".");
}

bool is_functional(const at::Tensor& t) {
  return maybe_get_impl(t) != nullptr;
}

at::Tensor to_functional(const at::Tensor& t) {
  auto* layer = detail::current_layer();
  TORCH_CHECK(layer != nullptr,
              "functionalize: to_functional: no functionalize call is active on this thread. "
              "Call it inside a function passed to functionalize, or while a FunctionalizeGuard "
              "(Python: torch_functionalize.enable()) is alive.");
  TORCH_CHECK(t.defined(), "functionalize: to_functional: got an undefined tensor.");
  if (auto* impl = maybe_get_impl(t)) {
    // at:: factories inside a layer already return wrappers (Note [Kernel: factories]), so
    // wrapping is idempotent for this layer's wrappers; another layer's wrapper escaped.
    TORCH_CHECK(impl->layer_id() == layer->id,
                "functionalize: to_functional: got a functional tensor that escaped the "
                "functionalize call that made it. Wrap plain tensors only.");
    return t;
  }
  return detail::make_fresh_wrapper(t, layer->id);
}

std::vector<at::Tensor> to_functional(const std::vector<at::Tensor>& ts) {
  auto* layer = detail::current_layer();
  TORCH_CHECK(layer != nullptr,
              "functionalize: to_functional: no functionalize call is active on this thread. "
              "Call it inside a function passed to functionalize, or while a FunctionalizeGuard "
              "(Python: torch_functionalize.enable()) is alive.");
  return detail::wrap_inputs(ts, *layer);
}

at::Tensor from_functional(const at::Tensor& t) {
  return detail::sync_and_unwrap(t);
}

void sync(const at::Tensor& t) {
  if (auto* impl = maybe_get_impl(t)) impl->sync_();
}

bool has_data_mutation(const at::Tensor& t) {
  return get_impl(t)->alias_storage().generation() > 0;
}

bool has_metadata_mutation(const at::Tensor& t) {
  return get_impl(t)->has_metadata_mutation();
}

// See Note [API: input epilogue] (api/Call.cpp).
void propagate_input_mutation(const at::Tensor& original, const at::Tensor& wrapper) {
  detail::write_back_inputs({original}, {wrapper});
}

void propagate_input_mutations(const std::vector<at::Tensor>& originals,
                               const std::vector<at::Tensor>& wrappers) {
  detail::write_back_inputs(originals, wrappers);
}

struct FunctionalizeGuard::State {
  explicit State(bool reapply_views) : layer(reapply_views) {}
  detail::LayerGuard layer;
};

namespace {
bool ensure_registered_then_true() {
  detail::ensure_registered();
  return true;
}
}  // namespace

FunctionalizeGuard::FunctionalizeGuard(Remove remove)
    : state_(
          (ensure_registered_then_true(), std::make_unique<State>(remove == Remove::Mutations))) {}

FunctionalizeGuard::~FunctionalizeGuard() = default;

at::Tensor wrap_fresh(const at::Tensor& t) {
  return is_functional(t) ? t : to_functional(t);
}

TensorFn functionalize(TensorFn fn, Remove remove) {
  return [fn = std::move(fn), remove](const std::vector<at::Tensor>& inputs) {
    return detail::call_functionalized(inputs, remove, remove == Remove::Mutations, fn);
  };
}

IValueFn functionalize(IValueFn fn, Remove remove) {
  return [fn = std::move(fn), remove](const std::vector<c10::IValue>& inputs) {
    // The tensors of the inputs, in walk order, are wrapped as one batch (aliases grouped); the
    // result's tensors, in walk order, are what the call unwraps.
    std::vector<at::Tensor> tensors;
    for (const auto& v : inputs) {
      detail::for_each_tensor(v, [&](const at::Tensor& t) { tensors.push_back(t); });
    }
    c10::IValue result;
    auto outputs = detail::call_functionalized(
        tensors, remove, remove == Remove::Mutations, [&](const std::vector<at::Tensor>& wrapped) {
          std::vector<c10::IValue> args = inputs;
          size_t next = 0;
          for (auto& v : args) {
            detail::transform_tensors(v, [&](const at::Tensor&) { return wrapped[next++]; });
          }
          result = fn(args);
          std::vector<at::Tensor> flat;
          detail::for_each_tensor(result, [&](const at::Tensor& t) { flat.push_back(t); });
          return flat;
        });
    size_t next = 0;
    detail::transform_tensors(result, [&](const at::Tensor&) { return outputs[next++]; });
    return result;
  };
}

}  // namespace tfz
