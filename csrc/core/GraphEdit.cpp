// Small edits of a recorded graph shared by its passes. See core/GraphEdit.h.
#include "core/GraphEdit.h"

#include "core/GraphRun.h"

#include <functional>
#include <utility>
#include <vector>

namespace tfz::detail {

void renumber_node_values(Graph& graph) {
  for (auto& v : graph.values) {
    if (v.kind == ValueSource::Kind::kNode) v.index = -1;
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const auto& returns = graph.nodes[n].returns;
    for (size_t r = 0; r < returns.size(); ++r) {
      if (returns[r].kind == GraphArg::Kind::kConstant) continue;
      int64_t k = 0;
      for (int64_t id : returns[r].values) {
        if (id >= 0) {
          auto& v = graph.values[id];
          v.kind = ValueSource::Kind::kNode;
          v.index = static_cast<int64_t>(n);
          v.position = static_cast<int64_t>(r);
          v.element = returns[r].kind == GraphArg::Kind::kValueList ? k : -1;
        }
        ++k;
      }
    }
  }
}

void rename_values(Graph& graph, const std::unordered_map<int64_t, int64_t>& to) {
  if (to.empty()) return;
  auto rename_all = [&](std::vector<GraphArg>& args) {
    for (auto& a : args) {
      if (a.kind == GraphArg::Kind::kConstant) continue;
      for (int64_t& id : a.values) {
        for (auto it = to.find(id); id >= 0 && it != to.end(); it = to.find(id)) id = it->second;
      }
    }
  };
  for (auto& node : graph.nodes) rename_all(node.args);
  rename_all(graph.outputs);
}

void remove_unread_nodes(Graph& graph, const std::function<bool(const GraphNode&)>& keep_anyway) {
  std::vector<char> read(graph.values.size(), 0);
  for (const auto& o : graph.outputs) for_each_value(o, [&](int64_t id) { read[id] = 1; });
  std::vector<char> keep(graph.nodes.size(), 0);
  for (size_t k = graph.nodes.size(); k-- > 0;) {
    const GraphNode& node = graph.nodes[k];
    bool needed = keep_anyway(node);
    for (const auto& r : node.returns) {
      for_each_value(r, [&](int64_t id) { needed = needed || read[id] != 0; });
    }
    if (!needed) continue;
    keep[k] = 1;
    for (const auto& a : node.args) for_each_value(a, [&](int64_t id) { read[id] = 1; });
  }
  std::vector<GraphNode> kept;
  kept.reserve(graph.nodes.size());
  for (size_t k = 0; k < graph.nodes.size(); ++k) {
    if (keep[k] != 0) kept.push_back(std::move(graph.nodes[k]));
  }
  graph.nodes = std::move(kept);
  renumber_node_values(graph);
}

}  // namespace tfz::detail
