// Reinplacing a captured program in C++ (public API): functional ops whose input buffer nothing
// reads afterwards write it in place, each decision checked on a meta-tensor run of the graph.
// The Python pass (torch_functionalize.reinplace) applies more rules. See
// Note [Reinplace: the C++ pass].
#pragma once

#include <torch_functionalize/functionalize.h>

#include <string>
#include <vector>

namespace tfz {

/// A copy of `graph` in which `out = op(a, ...)` becomes `op_(a, ...)` wherever no alias can tell
/// the difference; `graph` itself is unchanged. With `explain`, one line per candidate op: the
/// node, the op, and the rule that kept it or the in-place op that replaced it. A graph that
/// cannot be analysed (an op without a meta kernel) comes back unchanged, with the reason.
CapturedGraph reinplace(const CapturedGraph& graph, std::vector<std::string>* explain = nullptr);

}  // namespace tfz
