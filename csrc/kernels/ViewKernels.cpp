// View ops and in-place view ops on wrappers: run the view (or its *_copy twin) on the inner
// value and record a ViewMeta so the view can be regenerated from, and written back to, its base.
#include "kernels/Kernels.h"

#include "core/Conversions.h"

#include <c10/util/Exception.h>

namespace tfz::detail {

// Note [Kernel: views are not synced]
// A view op does not bring its input up to date first: it runs on the (possibly stale) inner
// value and the new wrapper inherits the input's generation, so its first real use regenerates
// it from the base by replaying the whole chain. This is what torch.func.functionalize does, and
// it keeps our traced graphs op-for-op equal to its graphs (test_traces.py).

namespace {

std::vector<c10::IValue> args_after_self(const torch::jit::Stack& stack, size_t num_args) {
  return std::vector<c10::IValue>(stack.end() - static_cast<std::ptrdiff_t>(num_args) + 1,
                                  stack.end());
}

FunctionalTensorImpl* self_wrapper(const OpInfo& info, const torch::jit::Stack& stack,
                                   size_t num_args) {
  const auto& self = (stack.end() - static_cast<std::ptrdiff_t>(num_args))->toTensor();
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK(impl != nullptr, "functionalize: ", info.name,
              ": the viewed tensor is a plain tensor but another argument is functional; "
              "views of tensors created outside the function cannot be functionalized.");
  return impl;
}

}  // namespace

void view_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  auto* impl = self_wrapper(info, *stack, num_args);
  const at::Tensor self = (stack->end() - static_cast<std::ptrdiff_t>(num_args))->toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(
      layer.reapply_views || info.copy_op.has_value(), "functionalize: ", info.name,
      ": remove=\"mutations_and_views\" needs a *_copy variant of this view op and torch has "
      "none. Use remove=\"mutations\".");
  auto extra = args_after_self(*stack, num_args);

  InnerCallGuard guard;
  auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  *first = impl->value();
  for (auto it = first + 1; it != stack->end(); ++it) transform_tensors(*it, sync_and_unwrap);
  (layer.reapply_views ? op : *info.copy_op).callBoxed(stack);

  c10::IValue out = torch::jit::pop(*stack);
  auto make_step = [&](int64_t out_index) {
    return std::make_shared<const ViewMeta>(op, info.copy_op, extra, out_index,
                                            layer.reapply_views, info.inverse);
  };
  if (out.isTensor()) {
    torch::jit::push(*stack, make_view_wrapper(out.toTensor(), self, make_step(-1)));
    return;
  }
  auto views = out.toTensorList();
  c10::List<at::Tensor> wrapped;
  wrapped.reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    wrapped.push_back(make_view_wrapper(views.get(i), self, make_step(static_cast<int64_t>(i))));
  }
  torch::jit::push(*stack, std::move(wrapped));
}

void inplace_view_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                         torch::jit::Stack* stack, const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  auto* impl = self_wrapper(info, *stack, num_args);
  c10::IValue self = *(stack->end() - static_cast<std::ptrdiff_t>(num_args));
  auto extra = args_after_self(*stack, num_args);
  auto step = std::make_shared<const ViewMeta>(*info.view_op, info.copy_op, extra, -1,
                                               layer.reapply_views, info.inverse);
  impl->mutate_view_meta_(std::move(step), MetadataMutation{op, std::move(extra)});
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, std::move(self));
}

}  // namespace tfz::detail
