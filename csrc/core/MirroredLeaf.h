// The leaf a leaf wrapper's autograd reads as (its MirroredLeafMeta, in FunctionalTensorImpl.cpp):
// where hooks on the wrapper must go for the autograd engine to run them.
// See Note [Autograd: hooks on leaf wrappers].
#pragma once

#include <ATen/core/Tensor.h>

namespace tfz::detail {

/// The leaf tensor whose gradient accumulator and .grad leaf wrapper `t` mirrors; undefined for
/// a plain tensor or a wrapper that is not a leaf requiring grad.
at::Tensor mirrored_leaf(const at::Tensor& t);

}  // namespace tfz::detail
