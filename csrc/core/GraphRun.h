// Running one node of a recorded graph (core/Graph.h) through the dispatcher: its arguments
// pushed from an environment of values, its returns stored back. Shared by run_graph and the
// meta-tensor run of the C++ reinplacing pass (core/GraphReinplace.h).
#pragma once

#include "core/Graph.h"

#include <ATen/core/stack.h>

#include <vector>

namespace tfz::detail {

/// Calls f(id) for each value id an argument (or return) holds; None elements (-1) are skipped.
template <typename F>
void for_each_value(const GraphArg& arg, F&& f) {
  if (arg.kind == GraphArg::Kind::kConstant) return;
  for (int64_t id : arg.values) {
    if (id >= 0) f(id);
  }
}

/// Pushes `node`'s arguments onto `stack`, each value read from `env` (by value id).
void push_node_args(const GraphNode& node, const std::vector<at::Tensor>& env,
                    torch::jit::Stack& stack);

/// Stores `node`'s returns, left on `stack` by callBoxed, into `env`.
void store_node_returns(const GraphNode& node, const torch::jit::Stack& stack,
                        std::vector<at::Tensor>& env);

}  // namespace tfz::detail
