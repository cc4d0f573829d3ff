// tfz::capture and tfz::CapturedGraph (public API): a functionalized call run under a Recorder,
// its graph trimmed of dead nodes. See Note [Capture: how ops are recorded].
#include <torch_functionalize/functionalize.h>

#include "api/Call.h"
#include "core/FunctorchInterop.h"
#include "core/Graph.h"
#include "core/GraphPasses.h"
#include "core/Layer.h"
#include "core/Recorder.h"
#include "kernels/Registration.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

namespace tfz {

CapturedGraph::CapturedGraph(std::shared_ptr<const detail::Graph> graph)
    : graph_(std::move(graph)) {}

std::vector<at::Tensor> CapturedGraph::operator()(const std::vector<at::Tensor>& inputs) const {
  return detail::run_graph(*graph_, inputs);
}

std::string CapturedGraph::str() const {
  return detail::to_string(*graph_);
}

size_t CapturedGraph::num_nodes() const {
  return graph_->nodes.size();
}

namespace {

void check_capturable() {
  constexpr const char* kInstead = " Use make_fx(functionalize(f)) for such programs.";
  TORCH_CHECK(detail::current_layer() == nullptr && detail::suspended_layer() == nullptr,
              "capture: called inside a functionalized function; capture the outer function "
              "instead.");
  TORCH_CHECK_NOT_IMPLEMENTED(c10::impl::TorchDispatchModeTLS::stack_len() == 0,
                              "capture: a TorchDispatchMode (a tracer such as make_fx, or "
                              "FakeTensorMode) is active; capture records by itself.",
                              kInstead);
  TORCH_CHECK_NOT_IMPLEMENTED(
      !c10::impl::tls_local_dispatch_key_set().included_.has_any(detail::functorch_mode_keys()),
      "capture: a torch.func transform is active around the call.", kInstead);
  for (auto device : {at::kCPU, at::kCUDA}) {
    TORCH_CHECK_NOT_IMPLEMENTED(!at::autocast::is_autocast_enabled(device),
                                "capture: autocast is enabled; its casts happen below the key "
                                "capture records at.",
                                kInstead);
  }
}

}  // namespace

CapturedGraph capture(const TensorFn& fn, const std::vector<at::Tensor>& inputs, Remove remove) {
  detail::ensure_record_kernel();
  check_capturable();
  auto guards = detail::record_input_guards(inputs);
  detail::Recorder recorder(inputs);
  std::vector<at::Tensor> outputs;
  {
    detail::RecordingGuard recording(recorder);
    // Graph outputs never alias graph inputs (Note [Inputs: outputs that alias inputs]).
    outputs = detail::call_functionalized(inputs, remove, /*alias_outputs=*/false, fn);
  }
  auto graph = std::make_shared<detail::Graph>(recorder.take(outputs));
  graph->input_guards = std::move(guards);
  detail::drop_unread_gradient_edges(*graph);
  if (remove == Remove::Mutations) detail::narrow_epilogue_copies(*graph);
  detail::eliminate_dead_nodes(*graph);
  return CapturedGraph(std::move(graph));
}

}  // namespace tfz
