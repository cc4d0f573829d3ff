// Wrapping a function's inputs: inputs that share a storage become views of one base (one alias
// storage), and inputs that start inside a larger storage get a base that keeps storage
// coordinates. See Note [Inputs: aliased inputs].
#pragma once

#include "core/Layer.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace tfz::detail {

/// Wraps `inputs` for `layer`. Undefined tensors stay undefined; wrappers of `layer` are kept.
/// Inputs sharing a storage become views of one synthetic base wrapper (one AliasStorage).
std::vector<at::Tensor> wrap_inputs(const std::vector<at::Tensor>& inputs, const Layer& layer);

/// The member of `group` (indices into `tensors`) that is the same tensor object as `t`, if any:
/// one tensor passed twice is one input (Note [Inputs: one tensor passed twice]).
std::optional<size_t> same_object(const std::vector<at::Tensor>& tensors,
                                  c10::ArrayRef<size_t> group, const at::Tensor& t);

}  // namespace tfz::detail
