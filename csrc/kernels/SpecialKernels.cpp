// Ops whose schema does not tell the whole truth, each with its own Note. Today: the hidden
// running-stat update of aten::native_batch_norm.
#include "kernels/Kernels.h"

#include "core/Conversions.h"

#include <ATen/core/grad_mode.h>
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

}  // namespace tfz::detail
