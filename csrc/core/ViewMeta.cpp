// Forward replay and inversion of one recorded view step.
#include "core/ViewMeta.h"

#include <c10/util/Exception.h>

namespace tfz::detail {

std::string ViewMeta::name() const {
  const auto& n = op.operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

at::Tensor ViewMeta::forward(const at::Tensor& base) const {
  const bool use_copy = !reapply && copy_op.has_value();
  const auto& handle = use_copy ? *copy_op : op;
  torch::jit::Stack stack;
  stack.reserve(args.size() + 1);
  stack.emplace_back(base);
  stack.insert(stack.end(), args.begin(), args.end());
  handle.callBoxed(stack);
  TORCH_INTERNAL_ASSERT(stack.size() == 1, "view op ", name(), " returned ", stack.size(),
                        " values");
  if (out_index < 0) {
    return std::move(stack[0]).toTensor();
  }
  return stack[0].toTensorList().get(out_index);
}

at::Tensor ViewMeta::inverse(const at::Tensor& base, const at::Tensor& mutated_view) const {
  TORCH_CHECK_NOT_IMPLEMENTED(
      inverse_fn != nullptr, "functionalize: ", name(),
      ": writing through a view made by this op is not supported (it has no inverse). Clone the "
      "view before mutating it, or mutate the base directly.");
  return inverse_fn(base, mutated_view, *this);
}

}  // namespace tfz::detail
