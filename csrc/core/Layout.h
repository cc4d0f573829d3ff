// Layout comparisons shared by the rules that keep eager's memory layout: a written base keeps
// its strides (kernels/MutationKernels.cpp, core/AliasStorage.cpp) and *_like ops take a wrapper's
// reported strides (kernels/BoxedKernel.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace tfz::detail {

/// Both strided with concrete, equal sizes, and their strides differ in a dimension of size > 1
/// (dimensions of size 1 or less have no memory order to differ in).
inline bool same_sizes_other_strides(const at::Tensor& a, const at::Tensor& b) {
  if (a.layout() != c10::kStrided || b.layout() != c10::kStrided ||
      a.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      b.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || a.sizes() != b.sizes()) {
    return false;
  }
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return true;
  }
  return false;
}

}  // namespace tfz::detail
