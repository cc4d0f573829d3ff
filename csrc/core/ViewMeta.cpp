// Forward replay and inversion of one recorded view step.
#include "core/ViewMeta.h"

#include "core/Recording.h"
#include "core/ViewInverses.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace tfz::detail {

// Note [View: detach without views]
// With remove="mutations_and_views", x.detach() becomes detach_copy(x), which torch gives no
// derivative: autograd refuses it on a value that requires grad ("derivative for
// aten::detach_copy is not implemented"), where eager's detach simply cuts the graph. Its
// meaning is a copy with no history, so it runs with grad mode off: the result is a fresh
// tensor that does not require grad, as eager's detach, and the trace still shows detach_copy.
// Rejected: keeping aten::detach in the graph (a view left in mutations_and_views), or a
// clone().detach() pair (two ops where torch.func emits one).
void ViewMeta::call_view_op(const c10::OperatorHandle& handle, torch::jit::Stack* stack) {
  static const c10::OperatorName detach_copy{"aten::detach_copy", ""};
  if (C10_UNLIKELY(handle.operator_name() == detach_copy)) {
    at::AutoGradMode no_grad(false);
    handle.callBoxed(stack);
    return;
  }
  handle.callBoxed(stack);
}

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

// See Note [Strides: what eager gives], case "empty views".
namespace {
at::Tensor empty_for_dtype_view(const at::Tensor& base) {
  std::vector<int64_t> strides(base.dim(), 1);
  int64_t stride = 16;
  for (int64_t d = base.dim() - 2; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(base.size(d), 1);
  }
  return at::empty_strided(base.sizes(), strides, base.options());
}
}  // namespace

bool ViewMeta::is_dtype_view(const c10::OperatorHandle& view_op) {
  static const c10::OperatorName view_dtype{"aten::view", "dtype"};
  return view_op.operator_name() == view_dtype;
}

at::Tensor ViewMeta::copy_input(const c10::OperatorHandle& view_op, const at::Tensor& base) {
  if (C10_UNLIKELY(!base.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && base.numel() == 0 &&
                   base.dim() >= 2 && base.layout() == c10::kStrided) &&
      is_dtype_view(view_op)) {
    return empty_for_dtype_view(base);
  }
  return base;
}

// See Note [Kernel: bool views of other bytes], case "v without views".
std::optional<at::Tensor> ViewMeta::bool_view_keeping_bytes(const c10::OperatorHandle& view_op,
                                                            const at::Tensor& base,
                                                            const c10::IValue& dtype) {
  if (C10_LIKELY(!dtype.isInt() || dtype.toScalarType() != c10::kBool) ||
      base.scalar_type() == c10::kBool || !is_dtype_view(view_op) ||
      base.layout() != c10::kStrided || ops_are_recorded()) {
    return std::nullopt;
  }
  return at::view_copy(base, c10::kByte).view(c10::kBool);
}

at::Tensor ViewMeta::forward(const at::Tensor& base) const {
  if (reapply || !copy_op.has_value()) return replay(op, base);
  if (!args.empty()) {
    if (auto value = bool_view_keeping_bytes(op, base, args[0])) return *std::move(value);
  }
  return replay(*copy_op, copy_input(op, base));
}

at::Tensor ViewMeta::forward_as_view(const at::Tensor& base) const {
  return replay(op, base);
}

at::Tensor ViewMeta::replay(const c10::OperatorHandle& handle, const at::Tensor& base) const {
  torch::jit::Stack stack;
  stack.reserve(args.size() + 1);
  stack.emplace_back(base);
  stack.insert(stack.end(), args.begin(), args.end());
  call_view_op(handle, &stack);
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
