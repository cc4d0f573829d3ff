// The passes over a recorded graph (core/Graph.h) that capture runs before handing it out:
// region-precise epilogue copies, then dead-node elimination. Later passes (reinplacing) go here.
// See Note [Capture: dead nodes] and Note [Capture: region-precise epilogue].
#pragma once

#include "core/Graph.h"

namespace tfz::detail {

/// Rewrites each input epilogue `copy_(x, new_x)` whose new value is a chain of *_scatter ops
/// over x itself into copies of just the written regions, through views of x. Call before
/// eliminate_dead_nodes, which then drops the scatters nobody else reads. Only for graphs that
/// keep views (remove="mutations"). See Note [Capture: region-precise epilogue].
void narrow_epilogue_copies(Graph& graph);

/// A `*_scatter` op and the view it writes its source through: the view takes the scatter's
/// arguments after (self, src).
struct ScatterView {
  const char* scatter;
  const char* view;
  const char* view_overload;
};

/// The view `op` writes through, if it is a scatter op (default overload); else nullptr.
const ScatterView* scatter_view_of(const c10::OperatorHandle& op);

/// Whether `op` is one of the guard ops the recorder adds (Note [Capture: guards on values read]).
bool is_guard(const c10::OperatorHandle& op);

/// Makes each epilogue copy_ that runs without grad read the value a tfz::_with_gradient_of node
/// gives its input, when nothing else reads the node's result (it is dead then). Call before
/// narrow_epilogue_copies. See Note [Graphs: writes autograd does not see].
void drop_unread_gradient_edges(Graph& graph);

/// Removes every node no output needs, except nodes that write an argument (the epilogue's
/// copy_, as_strided_, resize_) or draw random numbers (dropping one would shift the generator
/// for the random ops after it). See Note [Capture: dead nodes].
void eliminate_dead_nodes(Graph& graph);

}  // namespace tfz::detail
