// Layout comparisons shared by the rules that keep eager's memory layout: a written base keeps
// its strides (kernels/MutationKernels.cpp, core/AliasStorage.cpp) and *_like ops take a wrapper's
// reported strides (kernels/BoxedKernel.cpp), and values without views take eager's stride order
// (core/FunctionalTensorImpl.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace tfz::detail {

/// Strides `a` and `b` of a tensor of `sizes` differ in a dimension of size > 1 (dimensions of
/// size 1 or less have no memory order to differ in).
inline bool strides_differ(c10::IntArrayRef sizes, c10::IntArrayRef a, c10::IntArrayRef b) {
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 1 && a[d] != b[d]) return true;
  }
  return false;
}

/// Both strided with concrete, equal sizes, and their strides differ (strides_differ).
inline bool same_sizes_other_strides(const at::Tensor& a, const at::Tensor& b) {
  if (a.layout() != c10::kStrided || b.layout() != c10::kStrided ||
      a.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      b.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || a.sizes() != b.sizes()) {
    return false;
  }
  return strides_differ(a.sizes(), a.strides(), b.strides());
}

}  // namespace tfz::detail
