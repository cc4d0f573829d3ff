// Small edits of a recorded graph (core/Graph.h) that its passes share: a new value, an argument
// naming one value, and renumbering every value a node returns after nodes were inserted,
// replaced or removed. Used by core/GraphPasses.cpp and core/GraphReinplace.cpp.
#pragma once

#include "core/Graph.h"

#include <cstdint>

namespace tfz::detail {

/// A new value id, to be returned by a node the caller adds; renumber_node_values gives it its
/// node.
inline int64_t new_node_value(Graph& graph) {
  const auto id = static_cast<int64_t>(graph.values.size());
  graph.values.push_back({ValueSource::Kind::kNode, -1});
  return id;
}

/// An argument (or return) holding the one value `id`.
inline GraphArg value_arg(int64_t id) {
  GraphArg a;
  a.kind = GraphArg::Kind::kValue;
  a.values.push_back(id);
  return a;
}

/// Points every value a node returns at that node's current index (and return position), and
/// marks values whose node is gone (index -1). Call after changing `graph.nodes`.
inline void renumber_node_values(Graph& graph) {
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

}  // namespace tfz::detail
