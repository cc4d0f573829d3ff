// Forward replay and inversion of one recorded view step.
#include "core/ViewMeta.h"

#include "core/ViewInverses.h"

#include <c10/util/Exception.h>

namespace tfz::detail {

std::shared_ptr<const ViewMeta> ViewMeta::as_strided(c10::SymIntArrayRef sizes,
                                                     c10::SymIntArrayRef strides,
                                                     const c10::SymInt& offset, bool reapply) {
  auto& d = c10::Dispatcher::singleton();
  static const auto view = d.findSchemaOrThrow("aten::as_strided", "");
  static const auto copy = d.findOp({"aten::as_strided_copy", ""});
  static const auto inverse = find_inverse(view.operator_name());
  std::vector<c10::IValue> args{c10::IValue(sizes), c10::IValue(strides), c10::IValue(offset)};
  return std::make_shared<const ViewMeta>(view, copy, std::move(args), -1, reapply, inverse);
}

std::shared_ptr<const ViewMeta> ViewMeta::of(const c10::OperatorName& view_op,
                                             std::vector<c10::IValue> args, bool reapply) {
  auto& d = c10::Dispatcher::singleton();
  auto op = d.findOp(view_op);
  TORCH_INTERNAL_ASSERT(op.has_value(), c10::toString(view_op), " is not registered");
  auto copy = d.findOp({view_op.name + "_copy", view_op.overload_name});
  const InverseFn inverse = find_inverse(view_op);
  TORCH_INTERNAL_ASSERT(inverse != nullptr, c10::toString(view_op), " has no inverse");
  return std::make_shared<const ViewMeta>(*op, copy, std::move(args), -1, reapply, inverse);
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
