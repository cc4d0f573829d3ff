// Small edits of a recorded graph (core/Graph.h) that its passes share: a new value, an argument
// naming one value, renaming values, dropping unread nodes, and renumbering every value a node
// returns after nodes were inserted, replaced or removed. Used by core/GraphPasses.cpp and
// core/GraphReinplace.cpp.
#pragma once

#include "core/Graph.h"

#include <cstdint>
#include <functional>
#include <unordered_map>

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
void renumber_node_values(Graph& graph);

/// Replaces each value id `from` read by a node or an output with `to[from]` (followed through
/// chains of renames).
void rename_values(Graph& graph, const std::unordered_map<int64_t, int64_t>& to);

/// Removes every node none of whose results a kept node or an output reads, unless
/// `keep_anyway(node)` (an effect of its own), then renumbers the values.
void remove_unread_nodes(Graph& graph, const std::function<bool(const GraphNode&)>& keep_anyway);

}  // namespace tfz::detail
