// The batch-norm row: native_batch_norm, cudnn_batch_norm and miopen_batch_norm, whose schemas
// hide the training-mode write of the running stats.
// See Note [Kernel: native_batch_norm].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/Recorder.h"
#include "core/Recording.h"
#include "core/ViewInverses.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

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
// of the stats; a forward-only trace stays clone-free. Rejected: running it generically, as
// torch.func.functionalize does (the hole above).
// Running stats that are plain tensors (a module from outside the function, called in training
// mode) are not values of the function: eagerly, the op runs on them as eager runs it, writing
// them in place (the function's own tensors are unwrapped, its outputs wrapped). No graph can
// write a tensor it does not take, so under a tracer or a capture such a call is refused by name.
// Rejected: refusing it eagerly too (functionalize(model)(x) of a BatchNorm model in training
// mode failed, where eager and torch.func update the module's stats).

// Note [Kernel: cudnn_batch_norm and miopen_batch_norm]
// On CUDA (ROCm) tensors, batch_norm dispatches to cudnn_batch_norm (miopen_batch_norm) instead of
// native_batch_norm when the backend library takes the case. Both have native_batch_norm's
// arguments (momentum is called exponential_average_factor) and the same hidden write of the
// running stats in training mode (BatchNorm training on CUDA). They take the same row: in training
// mode with both stats, the call becomes _native_batch_norm_legit_functional plus a commit of the
// new stats, so the stats reach the input epilogue and the traced graph is functional. Outputs:
// (out, save_mean, save_invstd) are the same quantities (the backend's "saved inverse variance" is
// 1/sqrt(var + eps)); cudnn's fourth output, its reserve space, is returned empty (uint8, size 0):
// it only feeds cudnn_batch_norm_backward, which our graph never calls since the functional op
// carries its own derivative. Values agree with the backend to rounding, not bitwise (another
// kernel computes them). Rejected: calling the backend op on clones of the stats and committing the
// clones: the outputs would be the backend's bit for bit, but the graph would keep an op that
// writes an intermediate behind the compiler's back, which is the hole this row exists to close.
// These ops have no CPU kernel; test_hidden_writes.py registers CPU stand-ins that write the stats
// as the backends do and compares with eager. Eval mode and missing stats have no hidden write: the
// backend op is called as it is.

bool is_batch_norm_with_hidden_stats(const c10::OperatorHandle& op) {
  return named(op, "aten::native_batch_norm", "") || named(op, "aten::cudnn_batch_norm", "") ||
         named(op, "aten::miopen_batch_norm", "");
}

void plan_batch_norm(const c10::OperatorHandle& /*op*/, OpInfo& info) {
  info.functional_op =
      c10::Dispatcher::singleton().findOp({"aten::_native_batch_norm_legit_functional", ""});
  TORCH_INTERNAL_ASSERT(info.functional_op.has_value(),
                        "aten::_native_batch_norm_legit_functional is not registered");
}

void batch_norm_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const Layer& layer) {
  constexpr size_t kNumArgs = 8, kRunningMean = 3, kRunningVar = 4, kTraining = 5;
  auto args = torch::jit::last(*stack, kNumArgs);
  const bool training = args[kTraining].toBool();
  const auto& mean = args[kRunningMean];
  const auto& var = args[kRunningVar];
  const bool has_stats =
      mean.isTensor() && mean.toTensor().defined() && var.isTensor() && var.toTensor().defined();
  if (!training || !has_stats) return functional_kernel(info, op, stack, layer);
  const bool plain_mean = maybe_get_impl(mean.toTensor()) == nullptr;
  const bool plain_var = maybe_get_impl(var.toTensor()) == nullptr;
  if (plain_mean && plain_var && !calls_may_be_traced() &&
      !mean.toTensor().key_set().has_any(c10::python_ks) &&
      !var.toTensor().key_set().has_any(c10::python_ks)) {
    const at::Tensor plain_stats[] = {mean.toTensor(), var.toTensor()};
    run_on_values_eagerly(op, stack, layer, {});
    // The write bumps no version: views of the stats regenerate when told.
    if (Layer* current = current_layer()) {
      for (const auto& stat : plain_stats) note_unseen_write_of_captured(*current, stat);
    }
    return;
  }
  TORCH_CHECK(!plain_mean && !plain_var, "functionalize: ", info.name,
              ": training-mode batch norm updates its running stats in place, and ",
              plain_mean && plain_var
                  ? "they are plain tensors (created outside the function), which a traced or "
                    "captured graph cannot write"
                  : "one is a plain tensor (created outside the function) and the other the "
                    "function's own, which it cannot write together",
              ". Pass them to the function as inputs (e.g. functionalize the module call with "
              "its buffers as arguments: torch.func.functional_call).");
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
  const at::Tensor input = inner[0].toTensor();
  torch::jit::Stack fstack(inner.begin(), inner.end());
  info.functional_op->callBoxed(fstack);  // out, save_mean, save_invstd, new_mean, new_var
  for (const auto& [wrapper, index] : {std::pair{mean_wrapper, 3}, std::pair{var_wrapper, 4}}) {
    auto* impl = unsafe_get_impl(wrapper);
    impl->replace_(fstack[index].toTensor());
    impl->commit_update_(/*counts_version=*/false);  // eager's kernel writes them unseen
    impl->sync_();
  }
  for (size_t i = 0; i < 3; ++i) {
    torch::jit::push(*stack, make_fresh_wrapper(fstack[i].toTensor(), layer.id));
  }
  if (op.schema().returns().size() == 4) {  // cudnn's reserve space, see above
    torch::jit::push(
        *stack, make_fresh_wrapper(at::empty({0}, input.options().dtype(at::kByte)), layer.id));
  }
}

}  // namespace tfz::detail
