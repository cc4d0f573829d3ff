// Graph utilities: printing and running a captured graph. See core/Graph.h.
#include "core/Graph.h"
#include "core/GraphRun.h"

#include "core/OpSchemaInfo.h"

#include <ATen/core/enum_tag.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace tfz::detail {

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

void push_node_args(const GraphNode& node, const std::vector<at::Tensor>& env,
                    torch::jit::Stack& stack) {
  auto value = [&](int64_t id) { return id < 0 ? at::Tensor() : env[id]; };
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
}

void store_node_returns(const GraphNode& node, const torch::jit::Stack& stack,
                        std::vector<at::Tensor>& env) {
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

std::vector<at::Tensor> run_graph(const Graph& graph, const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(inputs.size() == graph.inputs.size(), "tfz::capture: the graph takes ",
              graph.inputs.size(), " tensors, got ", inputs.size(), ".");
  if (!graph.input_guards.empty()) check_input_guards(graph.input_guards, inputs);
  std::vector<at::Tensor> env(graph.values.size());
  for (size_t i = 0; i < inputs.size(); ++i) env[graph.inputs[i]] = inputs[i];
  for (size_t id = 0; id < graph.values.size(); ++id) {
    const auto& v = graph.values[id];
    if (v.kind == ValueSource::Kind::kConstant) env[id] = graph.constants[v.index];
  }
  auto value = [&](int64_t id) { return id < 0 ? at::Tensor() : env[id]; };
  torch::jit::Stack stack;
  // See Note [Capture: grad mode].
  const bool ambient = c10::GradMode::is_enabled();
  for (const auto& node : graph.nodes) {
    c10::AutoGradMode grad_mode(node.grad_enabled == graph.grad_enabled ? ambient
                                                                        : node.grad_enabled);
    stack.clear();
    push_node_args(node, env, stack);
    node.op.callBoxed(stack);
    store_node_returns(node, stack, env);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(graph.outputs.size());
  for (const auto& out : graph.outputs) {
    outputs.push_back(out.kind == GraphArg::Kind::kValue ? value(out.values[0]) : at::Tensor());
  }
  return outputs;
}

}  // namespace tfz::detail
