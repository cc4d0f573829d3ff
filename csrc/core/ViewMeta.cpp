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

// Note [View: *_copy ops without a derivative]
// torch gives some *_copy ops no derivative where their views have one: _conj_copy and
// view_as_complex_copy for complex outputs (x.conj() of a complex intermediate, Meta-Llama's
// rotary embedding), _make_dual_copy outside inference mode (an internal assert) and
// _fw_primal_copy in forward mode (torch.autograd.forward_ad's make_dual and unpack_dual).
// Without views, a program that differentiates through them got torch's error where eager's
// view is differentiable. Each has a functional form with the same values and derivatives:
//
//   *_copy op                           stands in, when
//   _conj_copy(x)                       conj_physical(x), x requires grad (neither result
//                                       carries the conjugate bit)
//   view_as_complex_copy(x)             complex(select_copy(x, -1, 0), select_copy(x, -1, 1)),
//                                       x requires grad and passes view_as_complex's checks
//   _make_dual_copy(p, t, level)        _make_dual(p.clone(), t, level), always
//   _fw_primal_copy(x, level)           clone(x) with forward grads off, x has a tangent
//
// The conditions keep graphs of programs without gradients on the one op; view_as_complex's
// checks (a last dimension of size 2 and stride 1, even strides and offset, a floating dtype) are
// left to torch by calling the op itself when they fail. Rejected: registering derivatives for
// the *_copy ops (torch's autograd keys belong to torch, and the registration would change them
// for every program in the process, not only ours).
namespace {
void replace_top(torch::jit::Stack* stack, size_t num_args, at::Tensor out) {
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, std::move(out));
}

bool has_tangent(const at::Tensor& t, int64_t level) {
  return t.unsafeGetTensorImpl()->autograd_meta() != nullptr &&
         t._fw_grad(static_cast<uint64_t>(level)).defined();
}

bool stands_in_for_copy_op(const c10::OperatorName& name, torch::jit::Stack* stack) {
  static const c10::OperatorName conj_copy{"aten::_conj_copy", ""};
  static const c10::OperatorName as_complex_copy{"aten::view_as_complex_copy", ""};
  static const c10::OperatorName make_dual_copy{"aten::_make_dual_copy", ""};
  static const c10::OperatorName fw_primal_copy{"aten::_fw_primal_copy", ""};
  if (C10_LIKELY(name != conj_copy && name != as_complex_copy && name != make_dual_copy &&
                 name != fw_primal_copy)) {
    return false;
  }
  if (name == make_dual_copy) {
    (*stack)[stack->size() - 3] = (*stack)[stack->size() - 3].toTensor().clone();
    static const auto make_dual =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::_make_dual", "");
    make_dual.callBoxed(stack);
    return true;
  }
  if (name == fw_primal_copy) {
    const at::Tensor self = (*stack)[stack->size() - 2].toTensor();
    if (!has_tangent(self, stack->back().toInt())) return false;
    c10::AutoFwGradMode no_forward_grad(false);
    replace_top(stack, 2, at::clone(self));
    return true;
  }
  const at::Tensor& self = stack->back().toTensor();
  if (!at::GradMode::is_enabled() || !self.requires_grad()) return false;
  if (name == conj_copy) {
    replace_top(stack, 1, at::conj_physical(self));
    return true;
  }
  const auto dtype = self.scalar_type();
  if (dtype != c10::kFloat && dtype != c10::kDouble && dtype != c10::kHalf) return false;
  if (self.dim() == 0 || self.sym_size(-1) != 2 || self.sym_stride(-1) != 1 ||
      self.sym_storage_offset() % 2 != 0) {
    return false;
  }
  for (int64_t d = 0; d + 1 < self.dim(); ++d) {
    if (self.sym_stride(d) % 2 != 0) return false;
  }
  replace_top(stack, 1, at::complex(at::select_copy(self, -1, 0), at::select_copy(self, -1, 1)));
  return true;
}
}  // namespace

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
  // See Note [View: *_copy ops without a derivative].
  if (C10_UNLIKELY(stands_in_for_copy_op(handle.operator_name(), stack))) return;
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
