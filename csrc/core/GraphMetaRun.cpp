// One run of a recorded graph on meta tensors: each value's storage, geometry, dtype and device,
// without computing anything. See core/GraphMetaRun.h.
#include "core/GraphMetaRun.h"

#include "core/GraphRun.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <unordered_map>

namespace tfz::detail {

// Note [Reinplace: storages from a meta run]
// A graph pass that must know which values share memory (the C++ reinplacing pass) runs the
// graph once on meta tensors built from its input guards (sizes, strides, offsets, dtype; inputs
// that shared memory share a meta storage), so which values alias is ATen's own answer: a view's
// meta tensor shares its base's meta storage, a functional result gets a new one. An op without
// a meta kernel in this process (a LibTorch program lacks the ones torch registers from Python,
// such as index_select's) runs on zero-filled CPU tensors of the same geometry, if its results
// are new tensors (zeros: an index is then in range; its results only give sizes, strides and
// dtypes). Devices follow ATen's rule: the device of the first operand that is not a 0-dim CPU
// tensor. Rejected: tracking aliases by hand per op (every view op's rule restated), and real
// tensors (the pass would compute the program).
namespace {

std::string op_name(const c10::OperatorHandle& op) {
  return c10::toString(op.operator_name());
}

int64_t extent(const InputGuard& g) {
  int64_t end = g.storage_offset + 1;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.sizes[d] == 0) return g.storage_offset;
    end += (g.sizes[d] - 1) * g.strides[d];
  }
  return end;
}

// Meta tensors standing for the graph's inputs: one meta storage per alias group.
std::optional<std::vector<at::Tensor>> meta_inputs(const Graph& graph, std::string& why) {
  const auto& guards = graph.input_guards;
  if (guards.size() != graph.inputs.size()) {
    why = "not analysed: the graph has no input guards to build meta inputs from";
    return std::nullopt;
  }
  std::unordered_map<int64_t, at::Tensor> bases;
  for (size_t i = 0; i < guards.size(); ++i) {
    if (!guards[i].defined || guards[i].alias_group < 0) continue;
    int64_t numel = 0;
    for (size_t j = 0; j < guards.size(); ++j) {
      if (guards[j].defined && guards[j].alias_group == guards[i].alias_group) {
        if (guards[j].dtype != guards[i].dtype) {
          why = "not analysed: inputs of different dtypes share memory";
          return std::nullopt;
        }
        numel = std::max(numel, extent(guards[j]));
      }
    }
    if (bases.count(guards[i].alias_group) == 0) {
      bases.emplace(
          guards[i].alias_group,
          at::empty({numel}, at::TensorOptions().dtype(guards[i].dtype).device(at::kMeta)));
    }
  }
  std::vector<at::Tensor> inputs(guards.size());
  for (size_t i = 0; i < guards.size(); ++i) {
    const auto& g = guards[i];
    if (!g.defined) continue;
    if (g.alias_group < 0) {
      why = "not analysed: an input has no storage";
      return std::nullopt;
    }
    inputs[i] = bases.at(g.alias_group).as_strided(g.sizes, g.strides, g.storage_offset);
  }
  return inputs;
}

// ATen's device rule for an op's outputs: the first tensor operand that is not a 0-dim CPU
// tensor, else the first tensor operand, else a `device` argument, else the CPU.
std::optional<at::Device> output_device(const GraphNode& node, const std::vector<at::Tensor>& env,
                                        const std::vector<std::optional<at::Device>>& devices) {
  std::optional<at::Device> first;
  bool unknown = false;
  for (const auto& arg : node.args) {
    for_each_value(arg, [&](int64_t id) {
      if (!devices[id]) {
        unknown = true;
        return;
      }
      const bool cpu_scalar = env[id].defined() && env[id].dim() == 0 && devices[id]->is_cpu();
      if (!first || (first->is_cpu() && !cpu_scalar && !devices[id]->is_cpu())) first = devices[id];
    });
  }
  if (unknown) return std::nullopt;
  if (first) return first;
  const auto& schema_args = node.op.schema().arguments();
  for (size_t a = 0; a < schema_args.size() && a < node.args.size(); ++a) {
    if (schema_args[a].name() == "device" && node.args[a].kind == GraphArg::Kind::kConstant &&
        node.args[a].constant.isDevice()) {
      return node.args[a].constant.toDevice();
    }
  }
  return at::Device(at::kCPU);
}

// Runs `node` on the meta tensors on `stack`; false (stack untouched) where the op has no meta
// kernel in this process (a LibTorch program lacks the ones torch registers from Python).
bool run_on_meta(const GraphNode& node, torch::jit::Stack& stack) {
  const torch::jit::Stack args = stack;
  try {
    node.op.callBoxed(stack);
    return true;
  } catch (const c10::NotImplementedError&) {
    stack = args;
    return false;
  }
}

// Runs `node` on zero-filled CPU tensors of its arguments' geometry instead (zeros: an index is
// then in range), for an op whose results are new tensors: its results only give sizes, strides
// and dtypes, and a view's storage would not be its argument's, so a view op raises.
void run_on_zeros(const GraphNode& node, torch::jit::Stack& stack) {
  for (const auto& r : node.op.schema().returns()) {
    TORCH_CHECK(r.alias_info() == nullptr, op_name(node.op), " returns a view");
  }
  auto real = [](const at::Tensor& t) {
    if (!t.defined() || !t.is_meta()) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU)).zero_();
  };
  for (auto& v : stack) {
    if (v.isTensor()) {
      v = real(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(real(t));
      v = std::move(list);
    } else if (v.isList()) {  // Tensor?[]
      c10::List<std::optional<at::Tensor>> list;
      const c10::List<c10::IValue> elements = v.toList();
      for (size_t k = 0; k < elements.size(); ++k) {
        const c10::IValue e = elements.get(k);
        list.push_back(e.isTensor() ? std::optional<at::Tensor>(real(e.toTensor())) : std::nullopt);
      }
      v = std::move(list);
    }
  }
  node.op.callBoxed(stack);
}

}  // namespace

std::optional<MetaRun> run_on_meta_tensors(const Graph& graph, std::string& why,
                                           std::string& failed_op) {
  auto inputs = meta_inputs(graph, why);
  if (!inputs) return std::nullopt;
  MetaRun run;
  run.values.assign(graph.values.size(), at::Tensor());
  run.devices.assign(graph.values.size(), std::nullopt);
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    run.values[graph.inputs[i]] = (*inputs)[i];
    if (graph.input_guards[i].defined) run.devices[graph.inputs[i]] = graph.input_guards[i].device;
  }
  for (size_t id = 0; id < graph.values.size(); ++id) {
    const auto& v = graph.values[id];
    if (v.kind != ValueSource::Kind::kConstant) continue;
    const at::Tensor& c = graph.constants[v.index];
    if (!c.defined()) continue;
    run.values[id] = at::empty_strided(c.sizes(), c.strides(), c.options().device(at::kMeta));
    run.devices[id] = c.device();
  }
  {
    c10::AutoGradMode no_grad(false);
    torch::jit::Stack stack;
    for (const auto& node : graph.nodes) {
      stack.clear();
      push_node_args(node, run.values, stack);
      try {
        if (!run_on_meta(node, stack)) run_on_zeros(node, stack);
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        failed_op = op_name(node.op);
        why = "not analysed: " + failed_op + " does not run on meta tensors (" + what + ")";
        return std::nullopt;
      }
      // A factory (arange, zeros) makes a real tensor even here: its meta twin stands for it.
      for (auto& v : stack) {
        if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_meta()) {
          const at::Tensor& t = v.toTensor();
          v = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
        }
      }
      store_node_returns(node, stack, run.values);
      const auto device = output_device(node, run.values, run.devices);
      for (const auto& r : node.returns)
        for_each_value(r, [&](int64_t id) { run.devices[id] = device; });
    }
  }
  return run;
}

}  // namespace tfz::detail
