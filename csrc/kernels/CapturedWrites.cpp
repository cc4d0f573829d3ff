// Writes of the function's values into tensors it captures (a module's buffers and weights, a
// global), when the call runs eagerly: eager's op on those tensors.
// See Note [Kernel: writes into captured tensors].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/Layer.h"
#include "core/Recording.h"

#include <vector>

namespace tfz::detail {

// Note [Kernel: writes into captured tensors]
// An in-place or out= op whose written tensors are all plain (captured by the function: a
// module's buffer or weight, a global) and whose other arguments include the function's values
// (nn.Embedding(max_norm=)'s embedding_renorm_ by f's indices, spectral norm's out= power
// iteration, an EMA buffer updated from f's activations) writes memory no wrapper owns. Run
// eagerly, the op runs on those tensors as eager runs it: the function's tensors are unwrapped to
// their values, the captured ones are written in place (their views, lifted or not, see it:
// Note [Alias: captured bases written in place]), and results that are not a written tensor are
// wrapped. Under a tracer or a capture no graph can write a tensor it does not take, so the
// write is refused by name (check_writable), as are writes that mix captured and functional
// written tensors. Rejected: refusing it eagerly too (eager and, for batch norm's stats,
// torch.func run it; the refusal made functionalize(model)(x) fail for such models); writing the
// captured tensors back at the end like inputs (a side effect of a graph that no input carries).
bool write_captured_eagerly(const OpInfo& info, const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  const auto args = torch::jit::last(*stack, num_args);
  bool all_plain = true, any_written = false;
  for (const auto& w : info.written) {  // the common case, a wrapper written, ends here
    for_each_tensor(args[w.index], [&](const at::Tensor& t) {
      any_written = any_written || t.defined();
      all_plain = all_plain && t.defined() && maybe_get_impl(t) == nullptr &&
                  !t.key_set().has_any(c10::python_ks);
    });
  }
  if (!any_written || !all_plain || calls_may_be_traced()) return false;
  std::vector<at::Tensor> written;
  for (const auto& w : info.written) {
    for_each_tensor(args[w.index], [&](const at::Tensor& t) { written.push_back(t); });
  }
  run_on_values_eagerly(op, stack, layer, written);
  return true;
}

void run_on_values_eagerly(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const Layer& layer, const std::vector<at::Tensor>& written) {
  const size_t num_args = op.schema().arguments().size();
  InnerCallGuard guard;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    transform_tensors(*it, sync_and_unwrap);
  }
  op.callBoxed(*stack);
  const size_t num_returns = op.schema().returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end();
       ++it) {
    transform_tensors(*it, [&](const at::Tensor& t) {
      for (const auto& w : written) {
        if (t.is_same(w)) return t;
      }
      return make_fresh_wrapper(t, layer.id);
    });
  }
}

}  // namespace tfz::detail
