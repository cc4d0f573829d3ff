// The C++ reinplacing pass over a recorded graph: a meta-tensor run gives each value its storage,
// then each functional op with an in-place twin is checked against the rules below and rewritten.
// See core/GraphReinplace.h.
#include "core/GraphReinplace.h"

#include "core/GraphRun.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace tfz::detail {

// Note [Reinplace: the C++ pass]
// tfz::reinplace(graph) gives C++ programs what reinplace(gm) gives Python ones, for the most
// common case: `out = op(a, ...)` becomes `op_(a, ...)` (out is then a itself) when
//   1. op has an in-place twin with the same overload and arguments, draws no random numbers (a
//      random op's in-place form may draw differently), and autograd records nothing (the node
//      ran with grad mode off, or no input of the graph requires grad: an in-place write could
//      change a tensor saved for backward);
//   2. out has a's dtype, sizes, strides and device, a addresses each element once, and out is
//      a fresh allocation;
//   3. no other operand of the node lies in a's storage S (stricter than the Python pass, which
//      lets a pointwise op read exactly the region it writes);
//   4. no later node, and no output, reads a value of S defined before the node (S's old
//      bytes); reads of out and of views made from it later read the new bytes, as they would;
//   5. S is not a constant's storage, nor an input's unless the program wrote that input with
//      out: its epilogue holds `copy_(x, out)` for an input x that is a itself and shares memory
//      with no other input; then out is computed into x, nothing else reads x's old bytes after
//      the node, out is not returned (the caller would see an output share the input's memory
//      where eager's may not), and the copy_, now of x onto itself, is removed. (The Python pass
//      also writes views of inputs, scatters and out= forms.)
// Storages come from one run of the graph on meta tensors built from its input guards (sizes,
// strides, offsets, dtype; inputs that shared memory share a meta storage), so which values
// alias is ATen's own answer (an op without a meta kernel in this process, which a LibTorch
// program lacks for ops whose meta kernels torch registers from Python, runs on zero-filled CPU
// tensors of the same geometry, if its results are new tensors); devices follow ATen's rule (the
// device of the first operand that is not a 0-dim CPU tensor). After a rewrite, out's storage is S
// for the decisions that follow. A graph the meta run cannot execute (an op without a meta kernel,
// a value read into a guard) is left as it is, and says why. Rejected: calling the Python pass (a
// LibTorch program has no Python), and porting its exact-region analysis (which decides the scatter
// and out= rewrites) before a C++ user needs those: the rules here are a subset of its rules, which
// the tests check decision by decision.
namespace {

using Storage = const c10::StorageImpl*;

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

// The in-place twin of a functional op: `name_` with the same overload, whose first argument is
// written and whose other arguments have the same types.
std::optional<c10::OperatorHandle> in_place_twin(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.is_mutable() || schema.returns().size() != 1 ||
      schema.returns()[0].alias_info() != nullptr || schema.arguments().empty() ||
      !schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get())) {
    return std::nullopt;
  }
  auto twin = c10::Dispatcher::singleton().findOp({schema.name() + "_", schema.overload_name()});
  if (!twin) return std::nullopt;
  const auto& args = schema.arguments();
  const auto& twin_args = twin->schema().arguments();
  if (twin_args.size() != args.size() || twin_args[0].alias_info() == nullptr ||
      !twin_args[0].alias_info()->isWrite()) {
    return std::nullopt;
  }
  for (size_t a = 0; a < args.size(); ++a) {
    if (*args[a].type() != *twin_args[a].type() || args[a].name() != twin_args[a].name()) {
      return std::nullopt;
    }
  }
  return twin;
}

std::string op_name(const c10::OperatorHandle& op) {
  return c10::toString(op.operator_name());
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

std::vector<ReinplaceDecision> reinplace_graph(Graph& graph) {
  std::vector<ReinplaceDecision> report;
  std::string why;
  auto inputs = meta_inputs(graph, why);
  if (!inputs) {
    report.push_back({-1, "", false, why});
    return report;
  }
  // The meta run: every value's meta tensor, and its device.
  std::vector<at::Tensor> env(graph.values.size());
  std::vector<std::optional<at::Device>> devices(graph.values.size());
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    env[graph.inputs[i]] = (*inputs)[i];
    if (graph.input_guards[i].defined) devices[graph.inputs[i]] = graph.input_guards[i].device;
  }
  for (size_t id = 0; id < graph.values.size(); ++id) {
    const auto& v = graph.values[id];
    if (v.kind != ValueSource::Kind::kConstant) continue;
    const at::Tensor& c = graph.constants[v.index];
    if (!c.defined()) continue;
    env[id] = at::empty_strided(c.sizes(), c.strides(), c.options().device(at::kMeta));
    devices[id] = c.device();
  }
  {
    c10::AutoGradMode no_grad(false);
    torch::jit::Stack stack;
    for (const auto& node : graph.nodes) {
      stack.clear();
      push_node_args(node, env, stack);
      try {
        if (!run_on_meta(node, stack)) run_on_zeros(node, stack);
      } catch (const std::exception& e) {
        std::string what = e.what();
        what = what.substr(0, what.find('\n'));
        report.push_back(
            {-1, op_name(node.op), false,
             "not analysed: " + op_name(node.op) + " does not run on meta tensors (" + what + ")"});
        return report;
      }
      // A factory (arange, zeros) makes a real tensor even here: its meta twin stands for it.
      for (auto& v : stack) {
        if (v.isTensor() && v.toTensor().defined() && !v.toTensor().is_meta()) {
          const at::Tensor& t = v.toTensor();
          v = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
        }
      }
      store_node_returns(node, stack, env);
      const auto device = output_device(node, env, devices);
      for (const auto& r : node.returns)
        for_each_value(r, [&](int64_t id) { devices[id] = device; });
    }
  }
  // Each value's storage (redirected after rewrites), the values in each storage, where each
  // value is defined and last read (the outputs read at the end), and the storages of inputs and
  // constants.
  std::unordered_map<Storage, Storage> moved;
  auto storage_of = [&](int64_t id) -> Storage {
    const at::Tensor& t = env[id];
    if (!t.defined() || !t.unsafeGetTensorImpl()->has_storage()) return nullptr;
    Storage s = t.storage().unsafeGetStorageImpl();
    for (auto it = moved.find(s); it != moved.end(); it = moved.find(s)) s = it->second;
    return s;
  };
  const auto num_nodes = static_cast<int64_t>(graph.nodes.size());
  std::vector<int64_t> defined_at(graph.values.size(), -1);
  std::vector<std::vector<int64_t>> readers(
      graph.values.size());  // node indices; num_nodes: output
  std::unordered_map<Storage, std::vector<int64_t>> members;
  std::unordered_set<Storage> outside;
  for (size_t id = 0; id < graph.values.size(); ++id) {
    const Storage s = storage_of(static_cast<int64_t>(id));
    if (s == nullptr) continue;
    members[s].push_back(static_cast<int64_t>(id));
    if (graph.values[id].kind != ValueSource::Kind::kNode) outside.insert(s);
  }
  for (int64_t n = 0; n < num_nodes; ++n) {
    const GraphNode& node = graph.nodes[n];
    for (const auto& r : node.returns) for_each_value(r, [&](int64_t id) { defined_at[id] = n; });
    for (const auto& arg : node.args) {
      for_each_value(arg, [&](int64_t id) { readers[id].push_back(n); });
    }
  }
  for (const auto& o : graph.outputs) {
    for_each_value(o, [&](int64_t id) { readers[id].push_back(num_nodes); });
  }
  std::vector<char> removed(graph.nodes.size(), 0);
  // Whether a value of S defined before node `n` is read after it, by a node other than `except`.
  auto old_bytes_read = [&](Storage s, int64_t n, int64_t except) {
    for (int64_t id : members[s]) {
      if (defined_at[id] >= n) continue;
      for (int64_t r : readers[id]) {
        if (r > n && r != except && (r == num_nodes || removed[r] == 0)) return true;
      }
    }
    return false;
  };
  // What each value is at run time: after a rewrite, out is the tensor its first argument is.
  std::vector<int64_t> identity(graph.values.size());
  for (size_t id = 0; id < identity.size(); ++id) identity[id] = static_cast<int64_t>(id);
  // The epilogue node `copy_(x, v)` after node `n` that writes input x whole: the program's
  // write-back of x, if it has one.
  auto epilogue_copy = [&](int64_t x, int64_t n) -> int64_t {
    for (int64_t r : readers[x]) {
      if (r <= n || r == num_nodes || removed[r] != 0) continue;
      const GraphNode& c = graph.nodes[r];
      if (c.op.operator_name().name == "aten::copy_" && c.args[0].kind == GraphArg::Kind::kValue &&
          c.args[0].values[0] == x && c.args[1].kind == GraphArg::Kind::kValue &&
          c.args[1].values[0] >= 0) {
        return r;
      }
    }
    return -1;
  };
  auto shares_memory_with_another_input = [&](int64_t a) {
    for (size_t i = 0; i < graph.inputs.size(); ++i) {
      if (graph.inputs[i] != a) continue;
      for (size_t j = 0; j < graph.inputs.size(); ++j) {
        if (j != i && graph.input_guards[j].defined &&
            graph.input_guards[j].alias_group == graph.input_guards[i].alias_group) {
          return true;
        }
      }
    }
    return false;
  };
  bool any_requires_grad = false;
  for (const auto& g : graph.input_guards) any_requires_grad |= g.requires_grad;
  for (const auto& c : graph.constants) any_requires_grad |= c.defined() && c.requires_grad();

  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    GraphNode& node = graph.nodes[n];
    const auto twin = in_place_twin(node.op);
    if (!twin || node.returns.size() != 1 || node.returns[0].kind != GraphArg::Kind::kValue ||
        node.args[0].kind != GraphArg::Kind::kValue || node.args[0].values[0] < 0) {
      continue;  // not a candidate
    }
    const int64_t a = node.args[0].values[0], out = node.returns[0].values[0];
    const std::string name = op_name(node.op);
    auto decide = [&](bool in_place, std::string rule) {
      report.push_back({static_cast<int64_t>(n), name, in_place, std::move(rule)});
    };
    if (node.op.hasTag(at::Tag::nondeterministic_seeded)) {
      decide(false, "rule 1: a random op");
      continue;
    }
    // A node recorded in the graph's starting grad mode replays in the caller's, which may be on
    // (Note [Capture: grad mode]).
    if (any_requires_grad && (node.grad_enabled || node.grad_enabled == graph.grad_enabled)) {
      decide(false,
             "rule 1: autograd may record it (an input requires grad, and the node may "
             "run with grad mode on)");
      continue;
    }
    const at::Tensor &ta = env[a], &tout = env[out];
    const Storage s = storage_of(a);
    if (!ta.defined() || !tout.defined() || s == nullptr || ta.dtype() != tout.dtype() ||
        ta.sizes() != tout.sizes() || ta.strides() != tout.strides() || !devices[a] ||
        devices[a] != devices[out] || !ta.is_non_overlapping_and_dense() || storage_of(out) == s) {
      decide(false,
             "rule 2: the result differs from its first argument in dtype, geometry or "
             "device, or that argument addresses an element twice");
      continue;
    }
    bool overlaps = false;
    for (size_t k = 1; k < node.args.size(); ++k) {
      for_each_value(node.args[k], [&](int64_t id) { overlaps |= storage_of(id) == s; });
    }
    if (overlaps) {
      decide(false, "rule 3: another operand lies in the written storage");
      continue;
    }
    const auto here = static_cast<int64_t>(n);
    const Storage fresh = storage_of(out);
    int64_t copy_back = -1;
    if (outside.count(s) != 0) {
      const int64_t x = identity[a];
      if (graph.values[x].kind != ValueSource::Kind::kInput) {
        decide(false, "rule 5: the written storage is a constant's or a view of an input's");
        continue;
      }
      copy_back = epilogue_copy(x, here);
      if (copy_back < 0) {
        decide(false, "rule 5: the program does not write this input");
        continue;
      }
      if (shares_memory_with_another_input(x)) {
        decide(false, "rule 5: the input shares memory with another input");
        continue;
      }
      // The epilogue then copies v over x whole. Unless v is out itself, out's bytes are gone
      // after it: nothing may read them there (an output included), and v may not be one of them.
      const int64_t v = graph.nodes[copy_back].args[1].values[0];
      if (identity[v] != out) {
        const auto& in_fresh = members[fresh];
        const bool read_after = std::any_of(in_fresh.begin(), in_fresh.end(), [&](int64_t id) {
          return id == v || std::any_of(readers[id].begin(), readers[id].end(),
                                        [&](int64_t r) { return r > copy_back; });
        });
        if (read_after || storage_of(v) == s) {
          decide(false, "rule 4: the result is read after the epilogue overwrites the input");
          continue;
        }
      } else if (std::find(readers[v].begin(), readers[v].end(), num_nodes) != readers[v].end()) {
        decide(false, "rule 4: the result is returned, and would share the input's memory");
        continue;
      }
    }
    if (old_bytes_read(s, here, copy_back)) {
      decide(false, "rule 4: the old value is read afterwards (a later op or an output)");
      continue;
    }
    node.op = *twin;
    identity[out] = identity[a];
    auto& joined = members[fresh];
    members[s].insert(members[s].end(), joined.begin(), joined.end());
    joined.clear();
    moved[fresh] = s;
    if (copy_back < 0) {
      decide(true, "in place as " + op_name(*twin));
      continue;
    }
    // Where the epilogue copies out itself, it now copies the input onto itself: removed, unless
    // its result is read.
    const GraphNode& c = graph.nodes[copy_back];
    bool copy_read = identity[c.args[1].values[0]] != identity[a];
    for (const auto& r : c.returns) {
      for_each_value(r, [&](int64_t id) { copy_read |= !readers[id].empty(); });
    }
    if (!copy_read) removed[copy_back] = 1;
    decide(true, "in place as " + op_name(*twin) + " into the input the program writes" +
                     (copy_read ? "" : "; its epilogue copy_ removed"));
  }
  std::vector<GraphNode> kept;
  kept.reserve(graph.nodes.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (removed[n] == 0) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
  return report;
}

}  // namespace tfz::detail
