// Layout comparisons shared by the cases of Note [Strides: what eager gives], which this file
// holds (a written base keeps its strides, *_like ops take a wrapper's reported strides, values
// without views take eager's stride order, ...); whether a tensor is its whole storage (api/,
// AliasStorage); the meta twin of a tensor's geometry for replays on meta (kernels/). Spans:
// MemoryOverlap.h.
#pragma once

#include "core/MemoryOverlap.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_as_real.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

namespace tfz::detail {

// Note [Strides: what eager gives]
// Rule: a tensor that code can observe has the sizes, strides and storage offset eager's would
// have: a wrapper inside f reports them, and out= tensors, written inputs after the epilogue and
// (untraced) outputs have them; an op whose result layout or random draws follow its arguments'
// memory order reads them in eager's layout. An inner value need not have eager's strides: it is
// laid out as its functional op returns it (a *_copy is contiguous), and a wrapper may report
// eager's metadata beside it. A value is restrided only where one of the cases below reads its
// layout, and under a tracer only where the graph's contract needs it (written inputs, out=
// tensors, storage coordinates, random draws; a graph's results' strides are no part of it).
// Why: code branches on strides (reshape views a contiguous tensor and copies another;
// is_contiguous(); view(dtype) needs a last stride of 1), as_strided, as_strided_ and resize_
// name storage elements through them, TensorIterator lays a result out in its operands' stride
// order, and random fills draw in memory order: other strides mean other control flow, other
// elements or other numbers, silently.
// Cases (eager: eager's strides; how: how we get them; where: file and function):
//   "view wrappers" (without views)
//     eager: a view's strides over its base (x.t() of a (2, 3) x has (1, 3)).
//     how:   the view op runs once on a meta tensor laid out like its input, and the wrapper
//            reports that metadata while its value, the *_copy, keeps the shape (torch's own
//            pass does the same); resize_ sets it likewise.
//     where: kernels/ViewKernels.cpp meta_reference; FunctionalTensorImpl::set_reference_metadata_;
//            kernels/special/Resize.cpp resize_functional.
//   "value order" (without views, untraced)
//     eager: ops on a view lay their results out in its stride order (x.t_(); x.flip(0) is
//            transposed), and random ops fill it in that memory order.
//     how:   a wrapper reporting eager's metadata takes its value in eager's stride order: dense
//            strides in the order of the reported ones (a transposed view's exactly, a strided
//            slice's packed), copied once when the order differs. A view whose elements overlap
//            (x.unfold(1, 4, 1)) keeps its contiguous *_copy: no dense layout is eager's, and
//            infer_dense_strides' order for tied strides can move its last dimension outward.
//     where: FunctionalTensorImpl::in_reported_order_ (set_value_, set_reference_metadata_).
//   "op results" (without views)
//     eager: a result follows its arguments' strides (x.t().diagonal_scatter(s) is transposed;
//            the *_scatter ops keep their input's gaps), which values of another layout do not.
//     how:   when some argument reports other strides than its value, the functional op also runs
//            on meta twins of the reported geometry, and each fresh result reports the meta
//            result's strides (a view wrapper's way); its value keeps its layout. A fresh result
//            at offset 0 records them on its storage ("storage coordinates"); one at an offset
//            keeps its value's geometry, and a later resize_ of it is refused by name. One meta
//            call per such op, untraced too (gapped and overlapping values); graphs unchanged.
//            convolution's meta kernel lays out by CUDA's rule, so on CPU its result is made
//            channels-last where the CPU kernels make it so (a channels-last input or weight:
//            dropout after HF Segformer's decode-head convolution draws in that order).
//     where: kernels/BoxedKernel.cpp functional_kernel, reports_eager_strides_of_results,
//            adopt_eager_strides, convolution_on_cpu_layout; kernels/UnboxedKernels.cpp (one
//            flag read per wrapper first: FunctionalTensorImpl::has_reference_metadata).
//   "*_like templates" (without views)
//     eager: rand_like(x), empty_like(x) (dropout's mask) lay out like x, and draw in that order.
//     how:   self gives only its metadata, so it becomes an empty tensor of the wrapper's reported
//            sizes and strides where those differ from its value's (no copy of data).
//     where: kernels/BoxedKernel.cpp use_reported_strides.
//   "seeded arguments" (without views)
//     eager: seeded kernels may draw in their inputs' memory order (multinomial(p, 1) samples
//            through empty_like(p).exponential_()); a traced value keeps its *_copy layout.
//     how:   a seeded op's argument whose wrapper reports other strides than its value (elements
//            not sharing memory) is passed as copy(empty_strided(..), value), both functional.
//     where: kernels/BoxedKernel.cpp in_reported_strides_for_seeded.
//   "written base"
//     eager: a write is in place, so the written tensor keeps its strides (y.atan_() or
//            torch.neg(y, out=y) of a non-dense y), where the functional variant returns its own.
//     how:   a base wrapper (views regenerate from the base) whose new value differs in a
//            dimension of size > 1 receives it copied into its own geometry,
//            copy(empty_strided(..), value), in graphs too. With views kept, strides that differ
//            in dimensions of size 1 only are taken through a view of the value (x = b.t() of a
//            (6, 1) b has strides (1, 1), and view(dtype) checks the last stride even there).
//     where: kernels/MutationKernels.cpp write_back; with_size_one_strides_of below.
//   "inverted base"
//     eager: the base never moves in memory, while an inverse may hand it back in another layout
//            (x.t_(); torch.mm(a, b, out=x) inverts through the transpose step).
//     how:   a base whose elements do not share memory receives the inverted value copied
//            into its own strides where they differ (in a dimension of size > 1), in both modes,
//            gaps included: an input that keeps its own base (b[:, ::2] under make_fx) written
//            through its transpose would otherwise report and fill in the transpose's order (a
//            later uniform_ drew its numbers into other elements). Size-1 dims as "written base".
//     where: core/AliasStorage.cpp in_base_strides (AliasStorage::folded_).
//   "resized out="
//     eager: resize_output gives contiguous strides; structured kernels (TensorIterator ops,
//            matmuls, reductions) then restride out to the strides the op computes, which the
//            functional result has too (torch.floor(x.t(), out=y) leaves y transposed); others
//            (fft.*, cholesky, slice_scatter, linalg.tensorinv, abs of a complex tensor) keep
//            contiguous ones. Which kind an op has can depend on the dtype; over OpInfo's out=
//            samples with a transposed input (torch 2.13 CPU), 874 of 943 take the result's.
//     how:   a resized out= takes a dense value's strides where they fit the resized storage.
//            Which kind an op has only its out= kernel knows, so where out is resized that
//            kernel runs too (a second run of the op, paid only then): eagerly into a private
//            out of out's geometry, whose result is the value; traced (and untraced without
//            views when an argument reports other strides) hidden from the tracer, on real
//            copies of the arguments in their reported geometry, and a dense value is laid out
//            in the strides it gives (empty_strided + copy in the graph). On values that are not
//            real (fake, symbolic) or for seeded ops, the functional op on meta twins gives the
//            structured kernels' strides, without views only.
//     where: kernels/MutationKernels.cpp write_back (then_strides of resize_functional);
//            kernels/OutArguments.cpp rerun_out_eagerly, out_results_in_eager_strides.
//   "composite out="
//     eager: a composite out= op taken whole may restride out at its own size:
//            torch.matmul(v, m, out=y) of a 1-D v resizes y to (1, n) for mm_out, then squeezes
//            it, so a diagonal y (stride 7) ends with stride 1, written in its first n elements.
//     how:   the decomposition is replayed on meta twins first, and an out= that ends with its
//            own sizes but other strides or offset is restrided (as_strided_, a metadata
//            mutation) before the write, after growing its storage where the new geometry needs
//            more (an expanded out), as eager's resize grows it.
//     where: kernels/special/Composites.cpp restride_outs_as_eager.
//   "storage coordinates" (without views)
//     eager: as_strided, as_strided_ and resize_ read a fresh result's storage in its eager
//            strides, where its value keeps its op's layout (x.t().exp().as_strided(..) traced).
//     how:   the storage remembers eager's strides for such a base (AliasStorage's eager
//            geometry), and before a step in storage coordinates on it or a view of it the base
//            is replaced by a copy in those strides (empty_strided + copy in the graph); the
//            values are unchanged, and later writes keep the strides ("written base").
//     where: kernels/ViewKernels.cpp base_in_eager_strides; kernels/special/Resize.cpp.
//   "outputs" (without views, untraced)
//     eager: an output may have gaps (`return x1` of an input b[:, 1:] has (5, 1)), stride-0
//            dimensions (x.expand(3, 4)) or overlap (x.unfold(1, 2, 1)); a dense value has none.
//     how:   an output whose reported strides differ from its value's becomes a fresh tensor of
//            eager's sizes and strides (offset 0: a copy owns its storage) holding the value, each
//            storage element written once where elements share memory; one copy per such output,
//            at the end. A value that requires grad stays packed (a copy would cut its history).
//     where: api/AliasedOutputs.cpp output_in_eager_strides (from api/Call.cpp).
//   "empty views" (without views)
//     eager: an empty view keeps its base's strides (x.narrow(2, 4, 0) of a (1, 2, 4) x has
//            (8, 4, 1)), which view(dtype) accepts; the empty *_copy's (2, 1, 1) it does not.
//     how:   the view(dtype) step reads an empty tensor of the same sizes whose strides (all but
//            the last a multiple of 16, the largest ratio of two element sizes) any dtype takes.
//     where: core/ViewMeta.cpp ViewMeta::copy_input.
// Random fills of a strided written tensor: Note [Kernel: random fills of strided tensors].
// Rejected: every value in eager's exact strides (a slice's gaps need storage no *_copy has, and
// each op in a graph would carry a copy); contiguous strides wherever the functional op gives
// them (torch.func's answer; wrong in 296 of those 943 out= samples); eager's out= strides read
// off the out= op run on meta (meta's resize disagrees with CPU's for TensorIterator ops:
// abs(x.t(), out=) is (1, 4) on CPU, (3, 1) on meta); a list of the non-structured out= kernels
// (it varies with dtype and torch version); each view inverse returning its base's layout (every
// inverse would need the rule); reference strides beside a written base's value, as without
// views (later ops and the epilogue read the value's layout); for an overlapping view's value,
// infer_dense_strides' order (its view(dtype) then fails where eager's works); and giving every
// empty *_copy eager's strides (a view's strides may exceed the storage a fresh value has).

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
/// Note [Strides: what eager gives], case "written base".
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

/// A meta tensor with t's sizes, strides and storage offset (concrete), over a meta storage just
/// large enough: what eager's op would see of t's geometry, for replays on meta.
inline at::Tensor meta_twin(const at::Tensor& t) {
  const auto nbytes =
      at::detail::computeStorageNbytes(t.sizes(), t.strides(), 1, t.storage_offset());
  return at::empty({static_cast<int64_t>(nbytes)}, t.options().device(c10::kMeta))
      .as_strided(t.sizes(), t.strides(), t.storage_offset());
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

/// `t` (plain_strided) reaches the first and the last byte of its storage: its storage
/// coordinates follow from its sizes and strides alone.
inline bool spans_its_storage(const at::Tensor& t) {
  const Span span = span_of(t);
  return span.begin == 0 && span.end == static_cast<int64_t>(t.storage().nbytes());
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

/// `t` is read through a flat base of its storage when alone in it
/// (Note [Inputs: inputs that do not start their storage]): it is not its whole storage, and the
/// storage is small enough to scatter into whole.
inline bool flat_base_suits(const at::Tensor& t) {
  return plain_strided(t) && !is_whole_storage(t) && storage_is_small(t);
}

/// The whole storage of `t` (strided, no conjugate or negative bit, whose storage is a whole
/// number of its elements) as a 1-D uint8 view: what a byte base (Note [Inputs: aliased inputs])
/// stands for.
inline at::Tensor storage_as_bytes(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  at::Tensor whole = t.as_strided({static_cast<int64_t>(t.storage().nbytes()) / item}, {1}, 0);
  if (t.is_complex()) whole = at::view_as_real(whole).view(-1);
  return whole.view(c10::kByte);
}

}  // namespace tfz::detail
