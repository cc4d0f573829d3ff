// Reinplacing a captured program in C++ (public API): functional ops whose input buffer nothing
// reads afterwards write it in place, scatters write through their view, and results the program
// copies into an input are computed there; each decision checked on a meta-tensor run of the
// graph. The Python pass (torch_functionalize.reinplace) sees exact regions. See
// Note [Reinplace: the C++ pass].
#pragma once

#include <torch_functionalize/functionalize.h>

#include <string>
#include <vector>

namespace tfz {

/// A copy of `graph` in which `out = op(a, ...)` becomes `op_(a, ...)`, `slice_scatter(b, src,
/// ...)` a copy_ through `slice(b, ...)`, and `op(...)` copied into an input `op.out(...,
/// out=input)`, wherever no alias can tell the difference; `graph` itself is unchanged. With
/// `explain`, one line per candidate op: the node, the op, and the rule that kept it or the rewrite
/// made (an epilogue copy_ made redundant is listed as removed). A graph that cannot be analysed
/// (an op without a meta kernel) comes back unchanged, with the reason.
CapturedGraph reinplace(const CapturedGraph& graph, std::vector<std::string>* explain = nullptr);

}  // namespace tfz
