// Whether two tensors of one storage have elements whose bytes meet. See core/MemoryOverlap.h;
// the rules that use it are in kernels/WriteChecks.cpp.
#include "core/MemoryOverlap.h"

#include <algorithm>

namespace tfz::detail {

std::vector<int64_t> element_byte_offsets(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  std::vector<int64_t> offsets{t.storage_offset() * item};
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t step = t.stride(d) * item;
    const size_t n = offsets.size();
    offsets.reserve(n * static_cast<size_t>(t.size(d)));
    for (int64_t k = 1; k < t.size(d); ++k) {
      for (size_t i = 0; i < n; ++i) offsets.push_back(offsets[i] + k * step);
    }
    if (t.size(d) == 0) offsets.clear();
  }
  std::sort(offsets.begin(), offsets.end());
  return offsets;
}

bool elements_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() + b.numel() > kExactOverlapLimit) return true;
  const auto oa = element_byte_offsets(a), ob = element_byte_offsets(b);
  const auto ia = static_cast<int64_t>(a.itemsize()), ib = static_cast<int64_t>(b.itemsize());
  // Two sorted lists of intervals [o, o + item): walk both, advancing the one that ends first.
  size_t i = 0, j = 0;
  while (i < oa.size() && j < ob.size()) {
    if (oa[i] + ia <= ob[j]) {
      ++i;
    } else if (ob[j] + ib <= oa[i]) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

bool elements_within(const at::Tensor& inner, const at::Tensor& outer) {
  if (inner.numel() == 0) return true;
  if (inner.itemsize() != outer.itemsize()) return false;
  const Span si = span_of(inner), so = span_of(outer);
  if (si.begin < so.begin || si.end > so.end) return false;
  if (outer.is_non_overlapping_and_dense()) return true;  // every byte of its span is its own
  if (inner.numel() + outer.numel() > kExactOverlapLimit) return false;
  const auto oi = element_byte_offsets(inner), oo = element_byte_offsets(outer);
  return std::includes(oo.begin(), oo.end(), oi.begin(), oi.end());
}

bool spans_and_elements_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const Span sa = span_of(a), sb = span_of(b);
  if (!(sa.begin < sb.end && sb.begin < sa.end)) return false;
  return elements_overlap(a, b);
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  // The symbolic forms: under dynamic shapes (torch.compile(dynamic=True), make_fx's symbolic
  // mode) the concrete accessors raise; comparing symbols guards on the answer.
  return a.itemsize() == b.itemsize() && a.sym_storage_offset() == b.sym_storage_offset() &&
         a.sym_sizes() == b.sym_sizes() && a.sym_strides() == b.sym_strides();
}

}  // namespace tfz::detail
