// Reinplacing a recorded graph (core/Graph.h) in C++: functional ops whose first argument's
// storage nothing reads afterwards become their in-place twins (add -> add_), scatters write
// through their view, and results copied into an input are computed there with out=; each
// decision proved from one meta-tensor run of the graph, with coarser regions than the Python
// pass's (python/torch_functionalize/reinplace.py). See Note [Reinplace: the C++ pass].
#pragma once

#include "core/Graph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tfz::detail {

/// What the pass did with one candidate node, and the rule that decided it. `node` is the index
/// of the node in the graph (-1: the whole graph, when it could not be analysed).
struct ReinplaceDecision {
  int64_t node = -1;
  std::string op;
  bool in_place = false;
  std::string rule;
};

/// Rewrites `graph` in place and returns one decision per candidate, in graph order.
std::vector<ReinplaceDecision> reinplace_graph(Graph& graph);

}  // namespace tfz::detail
