// One run of a recorded graph (core/Graph.h) on meta tensors: which values share memory, and each
// value's geometry, dtype and device, as ATen computes them, without computing the program. Used
// by the C++ reinplacing pass (core/GraphReinplace.h).
// See Note [Reinplace: storages from a meta run].
#pragma once

#include "core/Graph.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

namespace tfz::detail {

/// Each value of a graph as a meta tensor (values sharing memory share a meta storage), and its
/// device; by value id.
struct MetaRun {
  std::vector<at::Tensor> values;
  std::vector<std::optional<at::Device>> devices;
};

/// Runs `graph` on meta tensors built from its input guards. Where it cannot (no guards, an op
/// that runs neither on meta tensors nor on zero-filled CPU ones), returns nothing, with `why`
/// ("not analysed: ...") and the op in `failed_op`.
std::optional<MetaRun> run_on_meta_tensors(const Graph& graph, std::string& why,
                                           std::string& failed_op);

}  // namespace tfz::detail
