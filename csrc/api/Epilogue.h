// The input epilogue: after the function, what each input's wrapper went through (in-place view
// ops, resizes, writes of data) is replayed on the caller's tensor, inputs sharing a storage
// together. See Note [Inputs: metadata epilogue] and Note [Inputs: version counters].
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tfz::detail {

/// Replays on each original input what its wrapper went through: in-place view ops, a resize_,
/// then the data. Inputs sharing an alias storage are written back together. Call with synced
/// wrappers, after the layer is gone.
void write_back_inputs(const std::vector<at::Tensor>& originals,
                       const std::vector<at::Tensor>& wrappers);

}  // namespace tfz::detail
