// tfz::reinplace (public API): the C++ reinplacing pass (core/GraphReinplace.h) on a copy of a
// captured graph, with its decisions as text. See Note [Reinplace: the C++ pass].
#include <torch_functionalize/reinplace.h>

#include "core/GraphReinplace.h"

#include <memory>

namespace tfz {

CapturedGraph reinplace(const CapturedGraph& graph, std::vector<std::string>* explain) {
  auto copy = std::make_shared<detail::Graph>(graph.graph());
  const auto decisions = detail::reinplace_graph(*copy);
  if (explain != nullptr) {
    explain->clear();
    for (const auto& d : decisions) {
      explain->push_back((d.node < 0 ? std::string("(graph)") : "node " + std::to_string(d.node)) +
                         (d.op.empty() ? "" : " " + d.op) + ": " + (d.in_place ? "" : "kept, ") +
                         d.rule);
    }
  }
  return CapturedGraph(std::move(copy));
}

}  // namespace tfz
