// Conversions between wrappers and plain tensors over IValues: one walker that visits every
// tensor inside an IValue (Tensor, Tensor[], Tensor?[], tuples, dicts) and may replace it.
// Used by the kernel (op stacks) and the public API (arguments and results of user functions).
#pragma once

#include "core/FunctionalTensorImpl.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

namespace tfz::detail {

/// Calls `fn(const at::Tensor&) -> at::Tensor` on every defined tensor in `v` and stores the
/// results back. Lists are rebuilt, never modified in place (they may be shared with a caller).
template <typename Fn>
void transform_tensors(c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (t.defined()) v = fn(t);
  } else if (v.isTensorList()) {
    auto in = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(in.size());
    for (const at::Tensor& t : in) out.push_back(t.defined() ? fn(t) : t);
    v = std::move(out);
  } else if (v.isList()) {
    auto in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) {
      c10::IValue copy = e;
      transform_tensors(copy, fn);
      out.push_back(std::move(copy));
    }
    v = std::move(out);
  } else if (v.isTuple()) {
    std::vector<c10::IValue> elems(v.toTupleRef().elements().begin(),
                                   v.toTupleRef().elements().end());
    for (auto& e : elems) transform_tensors(e, fn);
    v = c10::ivalue::Tuple::create(std::move(elems));
  } else if (v.isGenericDict()) {
    auto in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    for (const auto& kv : in) {
      c10::IValue value = kv.value();
      transform_tensors(value, fn);
      out.insert(kv.key(), std::move(value));
    }
    v = std::move(out);
  }
}

/// Calls `fn(const at::Tensor&)` on every defined tensor in `v` (read only).
template <typename Fn>
void for_each_tensor(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined()) fn(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) for_each_tensor(e, fn);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) for_each_tensor(e, fn);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) for_each_tensor(kv.value(), fn);
  }
}

/// A new base wrapper around plain `value` for layer `layer_id`.
at::Tensor make_fresh_wrapper(const at::Tensor& value, int64_t layer_id);

/// A new view wrapper of `base` (a wrapper) whose current value is `view_value`.
at::Tensor make_view_wrapper(const at::Tensor& view_value, const at::Tensor& base,
                             std::shared_ptr<const ViewMeta> step);

/// Plain tensors pass through; wrappers are synced and their inner value returned.
at::Tensor sync_and_unwrap(const at::Tensor& t);

/// Whether `t` is a wrapper of the layer user code runs under on this thread.
bool is_current_layer_wrapper(const at::Tensor& t);

}  // namespace tfz::detail
