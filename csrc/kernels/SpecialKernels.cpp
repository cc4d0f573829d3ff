// Ops with bespoke rules, each with its own Note: the hidden running-stat update of
// aten::native_batch_norm, and resize_ / resize_as_, which change a tensor's storage.
#include "kernels/Kernels.h"

#include "core/Conversions.h"

#include <ATen/core/grad_mode.h>
#include "core/ViewInverses.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

// Note [Kernel: native_batch_norm]
// native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps) is
// declared functional, yet with training=True it updates running_mean/running_var in place.
// Run generically, it would write straight into the inner tensors (for inputs: the user's own
// buffers) and the traced graph would show a "functional" op with a side effect and no
// write-back; torch.func.functionalize has exactly that hole. Here, in training mode with both
// running stats given, we call _native_batch_norm_legit_functional, which returns the new stats,
// and commit them like any mutation, so the graph shows the functional op and the input epilogue
// writes the buffers back. Its outputs (out, save_mean, save_invstd) match native_batch_norm's.
// Everything else (eval mode, missing stats) has no hidden write and goes the functional path.
// When autograd records the call (grad mode on, and input, weight or bias requires grad), the
// functional op's backward node saves its running-stat arguments; for inputs those are the
// caller's buffers, which the epilogue's copy_ then bumps, and backward would fail its version
// check (eager never bumps them: its write is hidden). So in that case only, the node gets clones
// of the stats; a forward-only trace stays clone-free.

void native_batch_norm_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                              torch::jit::Stack* stack, const Layer& layer) {
  constexpr size_t kNumArgs = 8, kRunningMean = 3, kRunningVar = 4, kTraining = 5;
  auto args = torch::jit::last(*stack, kNumArgs);
  const bool training = args[kTraining].toBool();
  const auto& mean = args[kRunningMean];
  const auto& var = args[kRunningVar];
  const bool has_stats = mean.isTensor() && mean.toTensor().defined() && var.isTensor() &&
                         var.toTensor().defined();
  if (!training || !has_stats) return functional_kernel(op, stack, layer);
  for (const auto* stat : {&mean, &var}) {
    TORCH_CHECK(maybe_get_impl(stat->toTensor()) != nullptr, "functionalize: ", info.name,
                ": training-mode batch norm updates its running stats in place, and they are "
                "plain tensors (created outside the function). Pass them to the function as "
                "inputs (e.g. functionalize the module call with its buffers as arguments).");
  }
  std::vector<c10::IValue> inner(args.begin(), args.end());
  const at::Tensor mean_wrapper = mean.toTensor(), var_wrapper = var.toTensor();
  torch::jit::drop(*stack, kNumArgs);

  InnerCallGuard guard;
  for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
  bool records_autograd = false;
  for (size_t i = 0; i < 3 && at::GradMode::is_enabled(); ++i) {
    for_each_tensor(inner[i], [&](const at::Tensor& t) { records_autograd |= t.requires_grad(); });
  }
  if (records_autograd) {
    inner[kRunningMean] = inner[kRunningMean].toTensor().clone();
    inner[kRunningVar] = inner[kRunningVar].toTensor().clone();
  }
  torch::jit::Stack fstack(inner.begin(), inner.end());
  info.functional_op->callBoxed(fstack);  // out, save_mean, save_invstd, new_mean, new_var
  for (const auto& [wrapper, index] : {std::pair{mean_wrapper, 3}, std::pair{var_wrapper, 4}}) {
    auto* impl = unsafe_get_impl(wrapper);
    impl->replace_(fstack[index].toTensor());
    impl->commit_update_();
    impl->sync_();
  }
  for (size_t i = 0; i < 3; ++i) {
    torch::jit::push(*stack, make_fresh_wrapper(fstack[i].toTensor(), layer.id));
  }
}

// Note [Kernel: resize_]
// Eager resize_ keeps the storage while the new size fits in it (shrinking, or growing back into
// elements the storage still holds) and only reallocates, copying the old storage, past its end.
// Program:                         Functionalized:
//   x = torch.arange(4.)             x0 = arange(4)
//   x.resize_(2); x.resize_(4)       x1 = as_strided(x0, [2], [1], 0); x2 = as_strided(x0, [4], [1], 0)
//   return x + 1                     add(x2, 1)          (eager: [1, 2, 3, 4], old elements back)
// So a resize_ that fits is a view step: as_strided(size, strides, base offset) of the alias
// storage's base at the tensor's own offset, replacing the wrapper's chain (views included: the
// step restates the view over the storage). Past the end of
// the storage, a non-view wrapper (the storage's only user: other live aliases would diverge
// from eager, so they are refused) moves to a new storage whose base is aten::resize of the whole
// old storage. Either way the input epilogue replays the resize_ call on the caller's tensor.
// Rejected: the functional aten::resize of the current value alone: it drops the elements past
// the current size that eager keeps, so a shrink followed by a grow gave garbage.
void resize_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  const at::Tensor self = args[0].toTensor();
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK(impl != nullptr, "functionalize: ", info.name,
              ": cannot resize a plain tensor (created outside the function) inside it. Pass it "
              "to the function as an input.");
  TORCH_CHECK_NOT_IMPLEMENTED(!self.unsafeGetTensorImpl()->has_symbolic_sizes_strides(),
                              "functionalize: ", info.name, ": symbolic sizes are not supported.");
  const bool is_resize_as = op.schema().name() == "aten::resize_as_";
  const std::vector<int64_t> size =
      is_resize_as ? args[1].toTensor().sizes().vec() : args[1].toIntVector();
  const auto format = args[2].isNone() ? c10::MemoryFormat::Contiguous : args[2].toMemoryFormat();
  if (self.sizes() == c10::IntArrayRef(size) && args[2].isNone()) {
    torch::jit::drop(*stack, num_args);  // same size: eager changes nothing, strides included
    torch::jit::push(*stack, self);
    return;
  }
  std::vector<int64_t> strides;
  {
    MetaComputeGuard guard;  // eager's strides for this size and memory format
    strides = at::empty(size, self.options().device(c10::kMeta).memory_format(format)).strides().vec();
  }
  int64_t needed = 1;
  for (size_t d = 0; d < size.size(); ++d) needed += (size[d] - 1) * strides[d];
  for (int64_t s : size) needed = s == 0 ? 0 : needed;

  impl->sync_();
  static const auto as_strided = c10::Dispatcher::singleton().findSchemaOrThrow("aten::as_strided", "");
  static const auto as_strided_copy = c10::Dispatcher::singleton().findOp({"aten::as_strided_copy", ""});
  const at::Tensor base = impl->alias_storage().base();
  // The wrapper's own offset is eager's (mirrored, or the reference metadata without views), and
  // the storage's base starts where eager's storage does, so it is an offset into the base.
  const int64_t offset = self.storage_offset();
  const int64_t capacity = static_cast<int64_t>(base.storage().nbytes() / base.itemsize()) - offset;
  int64_t view_offset = offset;
  if (needed > capacity) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->is_resizable_base(), "functionalize: ", info.name,
        ": growing a view past the end of its storage is not supported (eager would reallocate "
        "the storage it shares). Resize the base tensor, or clone the view first.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->storage().use_count() == 1, "functionalize: ", info.name,
        ": growing a tensor past its storage while views of it are alive is not supported (the "
        "views would no longer match eager). Resize before taking views, or clone first.");
    at::Tensor grown;
    {
      InnerCallGuard guard;
      const at::Tensor old = layer.reapply_views ? base.as_strided({capacity}, {1}, offset)
                                                 : at::as_strided_copy(base, {capacity}, {1}, offset);
      grown = at::resize(old, {needed});
    }
    impl->replace_storage_(grown);
    view_offset = 0;
  }
  auto step = std::make_shared<const ViewMeta>(
      as_strided, as_strided_copy,
      std::vector<c10::IValue>{c10::IValue(size), c10::IValue(strides), c10::IValue(view_offset)},
      -1, layer.reapply_views, find_inverse(as_strided.operator_name()));
  // Replayed on the caller's tensor as resize_(size, memory_format): resize_as_'s template may be
  // a wrapper, which must not reach the epilogue.
  static const auto resize = c10::Dispatcher::singleton().findSchemaOrThrow("aten::resize_", "");
  impl->resize_chain_(std::move(step),
                      MetadataMutation{resize, {c10::IValue(size), args[2]}});
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, self);
}

}  // namespace tfz::detail
