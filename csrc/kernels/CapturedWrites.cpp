// Writes of the function's values into tensors it captures (a module's buffers and weights, a
// global), when the call runs eagerly: eager's op on those tensors.
// See Note [Kernel: writes into captured tensors].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/Recording.h"
#include "core/ViewMeta.h"

#include <utility>
#include <vector>

namespace tfz::detail {

// Note [Kernel: writes into captured tensors]
// An in-place or out= op whose written tensors are all captured by the function (a module's
// buffer or weight, a global; without views, also a view of one, lifted into a wrapper by
// Note [Kernel: views of captured tensors]) and whose other arguments include the function's
// values (nn.Embedding(max_norm=)'s embedding_renorm_ by f's indices, spectral norm's out= power
// iteration, an EMA buffer updated from f's activations) writes memory no wrapper owns. Run
// eagerly, the op runs on those tensors as eager runs it: the function's tensors are unwrapped to
// their values, the captured ones are written in place (a lifted view through the captured
// tensor's own view along its chain; views of them, lifted or not, see the write:
// Note [Alias: captured bases written in place]), a written tensor comes back as itself, and
// other results are wrapped. Under a tracer or a capture no graph can write a tensor it does not
// take, so the write is refused by name (check_writable), as are writes that mix captured and
// functional written tensors. Rejected: refusing it eagerly too (eager and, for batch norm's
// stats, torch.func run it; the refusal made functionalize(model)(x) fail for such models);
// writing the captured tensors back at the end like inputs (a side effect of a graph that no
// input carries).

namespace {

// Whether a write of `t` can run eagerly: a plain tensor (not a Python one), or a wrapper of this
// layer lifted from a captured tensor (without views, Note [Kernel: views of captured tensors]).
bool is_captured(const at::Tensor& t, const Layer& layer) {
  if (!t.defined() || t.key_set().has_any(c10::python_ks)) return false;
  const auto* impl = maybe_get_impl(t);
  return impl == nullptr || (impl->alias_storage().captured() && impl->layer_id() == layer.id &&
                             !impl->has_metadata_mutation());
}

// What a write of the captured `t` writes: a plain tensor itself, a lifted wrapper the captured
// tensor's own view along the wrapper's chain.
at::Tensor captured_target(const at::Tensor& t) {
  const auto* impl = maybe_get_impl(t);
  if (impl == nullptr) return t;
  InnerCallGuard guard;
  at::Tensor view = impl->alias_storage().base();
  for (const ViewMeta* step : impl->chain().steps()) view = step->forward_as_view(view);
  return view;
}

}  // namespace

bool write_captured_eagerly(const OpInfo& info, const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  const auto args = torch::jit::last(*stack, num_args);
  bool all_captured = true, any_written = false;
  for (const auto& w : info.written) {  // the common case, a wrapper of f's written, ends here
    for_each_tensor(args[w.index], [&](const at::Tensor& t) {
      any_written = any_written || t.defined();
      all_captured = all_captured && is_captured(t, layer);
    });
  }
  if (!any_written || !all_captured || calls_may_be_traced()) return false;
  std::vector<std::pair<at::Tensor, at::Tensor>> targets;  // (what is written, what is returned)
  for (const auto& w : info.written) {
    transform_tensors(*(stack->end() - static_cast<std::ptrdiff_t>(num_args) + w.index),
                      [&](const at::Tensor& t) {
                        targets.emplace_back(captured_target(t), t);
                        return targets.back().first;
                      });
  }
  run_on_values_eagerly(op, stack, layer, targets);
  return true;
}

void run_on_values_eagerly(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const Layer& layer,
                           const std::vector<std::pair<at::Tensor, at::Tensor>>& returned_as) {
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
      for (const auto& [written, returned] : returned_as) {
        if (t.is_same(written)) return returned;
      }
      return make_fresh_wrapper(t, layer.id);
    });
  }
}

}  // namespace tfz::detail
