// A function's inputs: wrapping them (inputs that share storage get one alias storage) and the
// epilogue that writes their mutations back to the caller's tensors.
// See Note [Inputs: aliased inputs] and Note [API: input epilogue].
#pragma once

#include "core/Layer.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace tfz::detail {

/// Wraps `inputs` for `layer`. Undefined tensors stay undefined; wrappers of `layer` are kept.
/// Inputs sharing a storage become views of one synthetic base wrapper (one AliasStorage).
std::vector<at::Tensor> wrap_inputs(const std::vector<at::Tensor>& inputs, const Layer& layer);

/// Replays on each original input what its wrapper went through: in-place view ops, a resize_,
/// then the data. Inputs sharing an alias storage are written back together. Call with synced
/// wrappers, after the layer is gone.
void write_back_inputs(const std::vector<at::Tensor>& originals,
                       const std::vector<at::Tensor>& wrappers);

}  // namespace tfz::detail
