// Layout comparisons shared by the rules that keep eager's memory layout: a written base keeps
// its strides (kernels/MutationKernels.cpp, core/AliasStorage.cpp) and *_like ops take a wrapper's
// reported strides (kernels/BoxedKernel.cpp), and values without views take eager's stride order
// (core/FunctionalTensorImpl.cpp); and where a tensor lies in its storage (core/Inputs.cpp,
// core/AliasStorage.cpp); the meta twin of a tensor's geometry for replays on meta (kernels/).
#pragma once

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

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

/// `value` seen with `like`'s strides (a view) when both are strided with concrete, equal sizes
/// and their strides differ only in dimensions of size 1, which address no other element: eager's
/// view(dtype) checks the last stride even there. Otherwise `value` itself. See
/// Note [Kernel: writes keep the written tensor's strides].
inline at::Tensor with_size_one_strides_of(const at::Tensor& like, const at::Tensor& value) {
  if (like.layout() != c10::kStrided || value.layout() != c10::kStrided ||
      like.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      value.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || like.sizes() != value.sizes() ||
      like.strides() == value.strides() || like.numel() == 0 ||
      strides_differ(like.sizes(), like.strides(), value.strides())) {
    return value;
  }
  return value.as_strided(value.sizes(), like.strides(), value.storage_offset());
}

/// Whether a tensor of these sizes and strides may address one element twice: false when, with
/// its dimensions of size > 1 ordered by stride, each stride passes the extent of the smaller
/// ones (a sufficient test for no overlap; torch's own answers "too hard" for any tensor that is
/// not dense).
inline bool may_self_overlap(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
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

/// A meta tensor with t's sizes, strides and storage offset (concrete), over a meta storage just
/// large enough: what eager's op would see of t's geometry, for replays on meta.
inline at::Tensor meta_twin(const at::Tensor& t) {
  const auto nbytes =
      at::detail::computeStorageNbytes(t.sizes(), t.strides(), 1, t.storage_offset());
  return at::empty({static_cast<int64_t>(nbytes)}, t.options().device(c10::kMeta))
      .as_strided(t.sizes(), t.strides(), t.storage_offset());
}

struct Span {
  int64_t begin, end;  // byte offsets [begin, end) in the storage
};

/// The bytes of its storage that `t` can reach (strided, concrete sizes).
inline Span span_of(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  const auto extent = at::detail::computeStorageNbytes(t.sizes(), t.strides(), item);
  return {t.storage_offset() * item, t.storage_offset() * item + static_cast<int64_t>(extent)};
}

/// Strided, concrete sizes, with a storage and at least one element.
inline bool plain_strided(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
         t.has_storage() && t.numel() != 0;
}

/// `t` (plain_strided) is its whole storage, densely from offset 0 (any dense strides): element i
/// of the storage is one of t's elements, and stays at the same place in every value a write
/// gives t.
inline bool is_whole_storage(const at::Tensor& t) {
  const Span span = span_of(t);
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         span.end == static_cast<int64_t>(t.storage().nbytes());
}

/// Slack allowed by storage_is_small.
constexpr int64_t kSmallStorageSlackBytes = 4096;

/// The storage of `t` (plain_strided) is at most twice t's extent plus 4 KiB: small enough to be
/// copied or scattered whole when t is written. See
/// Note [Inputs: inputs that do not start their storage].
inline bool storage_is_small(const at::Tensor& t) {
  const Span span = span_of(t);
  const auto storage_bytes = static_cast<int64_t>(t.storage().nbytes());
  return storage_bytes <= 2 * (span.end - span.begin) + kSmallStorageSlackBytes;
}

}  // namespace tfz::detail
