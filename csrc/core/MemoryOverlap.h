// Where a tensor's elements lie in its storage, from sizes, strides, offset and item size alone
// (never data, so it holds for wrappers, meta tensors and plain tensors alike): the bytes a tensor
// spans, whether its elements overlap each other, and whether two tensors of one storage share an
// element. The rules that use it: kernels/WriteChecks.cpp (writes), core/Layout.h (layouts).
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

namespace tfz::detail {

struct Span {
  int64_t begin, end;  // byte offsets [begin, end) in the storage
};

/// The bytes of its storage that `t` can reach, from its offset to its last element (strided,
/// concrete sizes).
inline Span span_of(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  const auto extent = at::detail::computeStorageNbytes(t.sizes(), t.strides(), item);
  return {t.storage_offset() * item, t.storage_offset() * item + static_cast<int64_t>(extent)};
}

/// Whether a tensor of these sizes and strides may address one element twice (an expand, unfold
/// with size > step, an overlapping as_strided): false when, with its dimensions of size > 1
/// ordered by stride, each stride passes the extent of the smaller ones (a sufficient test for no
/// overlap; torch's own answers "too hard" for any tensor that is not dense). No element, no
/// overlap.
inline bool may_self_overlap(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  // (|stride|, size), inline up to 8 dimensions: no heap allocation in the checks that ask
  c10::SmallVector<std::pair<int64_t, int64_t>, 8> dims;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return false;
    if (sizes[d] > 1) dims.emplace_back(std::abs(strides[d]), sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 0;  // the largest offset the smaller dimensions reach
  for (const auto& [stride, size] : dims) {
    if (stride <= extent) return true;
    extent += (size - 1) * stride;
  }
  return false;
}

/// The sorted byte offsets of `t`'s elements in its storage (numel entries).
std::vector<int64_t> element_byte_offsets(const at::Tensor& t);

/// Above this many elements (both tensors together) elements_overlap answers true without
/// comparing elements: a refusal then, never a wrong number.
constexpr int64_t kExactOverlapLimit = int64_t{1} << 20;

/// Whether `a` and `b`, taken to lie in one storage, have elements whose bytes meet: exact (the
/// elements' byte intervals are compared, so x[0::2] and x[1::2] do not meet) up to
/// kExactOverlapLimit elements, conservative above it. Concrete sizes only.
bool elements_overlap(const at::Tensor& a, const at::Tensor& b);

/// Whether every element of `inner` is an element of `outer` (same item size, one storage):
/// exact up to kExactOverlapLimit elements, false above it (a refusal then, never a wrong number).
/// Concrete sizes only.
bool elements_within(const at::Tensor& inner, const at::Tensor& outer);

/// elements_overlap after the cheap test on their spans; false when either has no element.
bool spans_and_elements_overlap(const at::Tensor& a, const at::Tensor& b);

/// Same item size, offset, sizes and strides: the two name the same elements the same way.
bool same_geometry(const at::Tensor& a, const at::Tensor& b);

}  // namespace tfz::detail
