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

/// The plain tensor to return for output `out` (a synced wrapper, or a plain tensor passed
/// through). With `alias_inputs`, an output that is an input or a view of one is rebuilt on the
/// caller's original tensor, after write_back_inputs, so it aliases it as in eager
/// (Note [Inputs: outputs that alias inputs]); otherwise it is the wrapper's inner value.
at::Tensor unwrap_output(const at::Tensor& out, const std::vector<at::Tensor>& originals,
                         const std::vector<at::Tensor>& wrappers, bool alias_inputs);
/// Without views, outside tracers: `value` (the unwrapped output of `wrapper`) as a copy in the
/// strides `wrapper` reports, where they differ; otherwise `value` itself.
/// See Note [Inputs: outputs in eager's strides without views].
at::Tensor output_in_eager_strides(const at::Tensor& wrapper, const at::Tensor& value);

}  // namespace tfz::detail
