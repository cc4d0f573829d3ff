// Graph utilities: dead-node removal, printing, and running a captured graph. See core/Graph.h.
#include "core/Graph.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace tfz::detail {

namespace {

bool writes_an_argument(const c10::OperatorHandle& op) {
  for (const auto& a : op.schema().arguments()) {
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  }
  return false;
}

template <typename F>
void for_each_value(const GraphArg& arg, F&& f) {
  if (arg.kind == GraphArg::Kind::kConstant) return;
  for (int64_t id : arg.values) {
    if (id >= 0) f(id);
  }
}

}  // namespace

bool is_default_arg(const c10::Argument& schema_arg, const GraphArg& arg) {
  return arg.kind == GraphArg::Kind::kConstant && schema_arg.default_value().has_value() &&
         *schema_arg.default_value() == arg.constant;
}

size_t num_positional_shown(const GraphNode& node) {
  const auto& schema_args = node.op.schema().arguments();
  size_t n = 0;
  while (n < schema_args.size() && !schema_args[n].kwarg_only()) ++n;
  while (n > 0 && is_default_arg(schema_args[n - 1], node.args[n - 1])) --n;
  return n;
}

// Note [Capture: dead nodes]
// The recorder sees every op the functionalized program runs on inner values, including views
// nobody reads (the select behind a `y = x[0]` whose y is then only written through, replayed
// views the write-back no longer needs) and the functional results of writes that were later
// overwritten. A node stays if one of its results reaches an output or a kept node, or if it has
// an effect of its own: it writes an argument (the input epilogue's copy_, as_strided_, resize_)
// or draws from a random generator (removing a dead `rand` would hand its numbers to the next
// random op, and the graph would no longer replay eager's stream). Rejected: FX's
// eliminate_dead_code, which only knows the first rule; and doing it in Python, which would leave
// C++ users with the fat graph.
void eliminate_dead_nodes(Graph& graph) {
  std::vector<char> live(graph.values.size(), 0);
  for (const auto& out : graph.outputs) for_each_value(out, [&](int64_t id) { live[id] = 1; });
  std::vector<char> keep(graph.nodes.size(), 0);
  for (size_t n = graph.nodes.size(); n-- > 0;) {
    const GraphNode& node = graph.nodes[n];
    bool needed = writes_an_argument(node.op) || node.op.hasTag(at::Tag::nondeterministic_seeded);
    for (const auto& r : node.returns) {
      for_each_value(r, [&](int64_t id) { needed = needed || live[id] != 0; });
    }
    if (!needed) continue;
    keep[n] = 1;
    for (const auto& a : node.args) for_each_value(a, [&](int64_t id) { live[id] = 1; });
  }
  std::vector<int64_t> new_index(graph.nodes.size(), -1);
  std::vector<GraphNode> kept;
  kept.reserve(graph.nodes.size());
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (keep[n] == 0) continue;
    new_index[n] = static_cast<int64_t>(kept.size());
    kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
  for (auto& v : graph.values) {
    if (v.kind == ValueSource::Kind::kNode) v.index = new_index[v.index];  // -1: removed
  }
}

namespace {

void print_arg(std::ostream& out, const GraphArg& arg) {
  switch (arg.kind) {
    case GraphArg::Kind::kConstant:
      out << arg.constant;
      return;
    case GraphArg::Kind::kValue:
      out << '%' << arg.values[0];
      return;
    case GraphArg::Kind::kValueList:
      out << '[';
      for (size_t i = 0; i < arg.values.size(); ++i) {
        if (i > 0) out << ", ";
        if (arg.values[i] < 0) {
          out << "None";
        } else {
          out << '%' << arg.values[i];
        }
      }
      out << ']';
      return;
  }
}

}  // namespace

std::string to_string(const Graph& graph) {
  std::ostringstream out;
  out << "graph(";
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    out << (i > 0 ? ", " : "") << '%' << graph.inputs[i];
  }
  out << "):\n";
  for (size_t c = 0; c < graph.constants.size(); ++c) {
    for (size_t id = 0; id < graph.values.size(); ++id) {
      const auto& v = graph.values[id];
      if (v.kind == ValueSource::Kind::kConstant && v.index == static_cast<int64_t>(c)) {
        const auto& t = graph.constants[c];
        out << "  %" << id << " = constant(" << t.scalar_type() << t.sizes() << ")\n";
      }
    }
  }
  for (const auto& node : graph.nodes) {
    out << "  ";
    for (size_t r = 0; r < node.returns.size(); ++r) {
      out << (r > 0 ? ", " : "");
      print_arg(out, node.returns[r]);
    }
    out << (node.returns.empty() ? "" : " = ") << c10::toString(node.op.operator_name()) << '(';
    const auto& schema_args = node.op.schema().arguments();
    bool first = true;
    const size_t shown = num_positional_shown(node);
    for (size_t a = 0; a < node.args.size(); ++a) {
      const bool kwarg = schema_args[a].kwarg_only();
      if (kwarg ? is_default_arg(schema_args[a], node.args[a]) : a >= shown) continue;
      out << (first ? "" : ", ");
      first = false;
      if (schema_args[a].kwarg_only()) out << schema_args[a].name() << '=';
      print_arg(out, node.args[a]);
    }
    out << ")\n";
  }
  out << "  return (";
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    out << (i > 0 ? ", " : "");
    print_arg(out, graph.outputs[i]);
  }
  out << ")\n";
  return out.str();
}

std::vector<at::Tensor> run_graph(const Graph& graph, const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == graph.inputs.size(), "tfz::capture: the graph takes ",
              graph.inputs.size(), " tensors, got ", inputs.size(), ".");
  std::vector<at::Tensor> env(graph.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[graph.inputs[i]] = inputs[i];
  for (size_t id = 0; id < graph.values.size(); ++id) {
    const auto& v = graph.values[id];
    if (v.kind == ValueSource::Kind::kConstant) env[id] = graph.constants[v.index];
  }
  auto value = [&](int64_t id) { return id < 0 ? at::Tensor() : env[id]; };
  torch::jit::Stack stack;
  for (const auto& node : graph.nodes) {
    stack.clear();
    for (const auto& arg : node.args) {
      switch (arg.kind) {
        case GraphArg::Kind::kConstant:
          stack.emplace_back(arg.constant);
          break;
        case GraphArg::Kind::kValue:
          stack.emplace_back(value(arg.values[0]));
          break;
        case GraphArg::Kind::kValueList:
          if (arg.optional_elements) {
            c10::List<std::optional<at::Tensor>> list;
            for (int64_t id : arg.values) {
              list.push_back(id < 0 ? std::nullopt : std::optional<at::Tensor>(env[id]));
            }
            stack.emplace_back(std::move(list));
          } else {
            c10::List<at::Tensor> list;
            for (int64_t id : arg.values) list.push_back(value(id));
            stack.emplace_back(std::move(list));
          }
          break;
      }
    }
    node.op.callBoxed(stack);
    for (size_t r = 0; r < node.returns.size(); ++r) {
      const GraphArg& ret = node.returns[r];
      if (ret.kind == GraphArg::Kind::kValue) {
        env[ret.values[0]] = stack[r].toTensor();
      } else if (ret.kind == GraphArg::Kind::kValueList) {
        auto list = stack[r].toTensorVector();
        for (size_t k = 0; k < list.size(); ++k) env[ret.values[k]] = list[k];
      }
    }
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(graph.outputs.size());
  for (const auto& out : graph.outputs) {
    outputs.push_back(out.kind == GraphArg::Kind::kValue ? value(out.values[0]) : at::Tensor());
  }
  return outputs;
}

}  // namespace tfz::detail
