// A function's outputs as the caller receives them: an output that is an input or a view of one is
// rebuilt on the caller's tensor (so it aliases it as in eager), and without views an output takes
// the strides eager gives it. See Note [Inputs: outputs that alias inputs].
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace tfz::detail {

/// The plain tensor to return for output `out` (a synced wrapper, or a plain tensor passed
/// through). With `alias_inputs`, an output that is an input or a view of one is rebuilt on the
/// caller's original tensor, after write_back_inputs, so it aliases it as in eager
/// (Note [Inputs: outputs that alias inputs]); otherwise it is the wrapper's inner value.
at::Tensor unwrap_output(const at::Tensor& out, const std::vector<at::Tensor>& originals,
                         const std::vector<at::Tensor>& wrappers, bool alias_inputs);
/// Without views, outside tracers: `value` (the unwrapped output of `wrapper`) as a copy in the
/// strides `wrapper` reports, where they differ; otherwise `value` itself.
/// See Note [Strides: what eager gives], case "outputs".
at::Tensor output_in_eager_strides(const at::Tensor& wrapper, const at::Tensor& value);

}  // namespace tfz::detail
