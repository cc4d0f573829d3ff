// The view-inverse table. Each <op>_inverse rebuilds the base that, viewed through <op> with the
// recorded arguments, gives the mutated view. With views kept (reapply) an
// inverse may return a view; with views removed it must return a fresh tensor (the *_copy ops).
#include "core/ViewInverses.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Functions.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/grad_mode.h>

#include <unordered_map>

namespace tfz::detail {

// Note [Alias: as_strided_scatter's gradient]
// A write through an as_strided or unfold view of a value that requires grad is scattered back
// with as_strided_scatter. Its derivative for `self` in torch (2.13 checked) is wrong: it hands
// the gradient to the written elements, where eager's is zero, and none to the others, where
// eager's passes through. Its derivative for `src` is right. So when
// autograd records the scatter, it is built as where(mask, as_strided_scatter(zeros, src), base)
// with the mask made without grad: each operand's derivative is then eager's. For a base that is
// not dense the where would lay the result out densely, so such bases keep the plain op.
// Rejected: a custom autograd node for the scatter (tracers would record it as an opaque call).
at::Tensor strided_scatter(const at::Tensor& base, const at::Tensor& src, c10::SymIntArrayRef sizes,
                           c10::SymIntArrayRef strides, std::optional<c10::SymInt> offset) {
  const bool grad = c10::GradMode::is_enabled() && (base.requires_grad() || src.requires_grad());
  if (!grad || !base.is_non_overlapping_and_dense()) {
    return at::as_strided_scatter_symint(base, src, sizes, strides, std::move(offset));
  }
  at::Tensor mask;
  {
    at::NoGradGuard no_grad;
    mask = at::as_strided_scatter_symint(at::zeros_like(base, at::kBool),
                                         at::ones_like(src, at::kBool), sizes, strides, offset);
  }
  const at::Tensor placed =
      at::as_strided_scatter_symint(at::zeros_like(base), src, sizes, strides, std::move(offset));
  return at::where(mask, placed, base);
}

namespace {

using at::Tensor;

std::optional<c10::SymInt> opt_symint(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return v.toSymInt();
}

Tensor as_strided_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return strided_scatter(base, mv, m.arg(0).toSymIntVector(), m.arg(1).toSymIntVector(),
                         opt_symint(m.arg(2)));
}

Tensor diagonal_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return at::diagonal_scatter(base, mv, m.arg(0).toInt(), m.arg(1).toInt(), m.arg(2).toInt());
}

// Writing through an expanded view is only defined (and only allowed by eager) when no element
// is repeated; summing the broadcast dims back is then the identity on each element. sum_to sums
// integer and bool tensors into int64 (torch.sum's promotion: an int32 x written through
// x.expand(1, 2) would come back int64 without views), so the sum is cast back to the written
// dtype, exactly (no summed dimension has more than one element).
Tensor expand_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  Tensor summed = at::sum_to(mv, base.sym_sizes(), /*always_return_non_view=*/!m.reapply);
  return summed.scalar_type() == mv.scalar_type() ? summed : summed.to(mv.scalar_type());
}

Tensor permute_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  auto dims = m.arg(0).toIntVector();
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[c10::maybe_wrap_dim(dims[i], static_cast<int64_t>(dims.size()))] =
        static_cast<int64_t>(i);
  }
  return m.reapply ? mv.permute(inverse) : at::permute_copy(mv, inverse);
}

// view, _reshape_alias and every squeeze overload only regroup elements in row-major order, so the
// base is the mutated view read back in the base's shape. With views kept the mutated value may
// have strides view() cannot regroup (v = x.view(2, 15); v.t_(); v.cumprod_(1): the transpose's
// inverse hands back a transposed value): reshape copies it then.
Tensor view_like_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return m.reapply ? mv.reshape_symint(base.sym_sizes())
                   : at::view_copy_symint(mv, base.sym_sizes());
}

Tensor view_dtype_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return m.reapply ? mv.view(base.scalar_type()) : at::view_copy(mv, base.scalar_type());
}

Tensor select_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return at::select_scatter_symint(base, mv, m.arg(0).toInt(), m.arg(1).toSymInt());
}

Tensor slice_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  std::optional<c10::SymInt> end = opt_symint(m.arg(2));
  // vmap's slice_scatter rule (torch 2.13) builds arange(start, end) from the end as given, so the
  // end=INT64_MAX of `x[1:]` fails inside vmap(functionalize(f)) and hessian(functionalize(f))
  // (torch.func fails the same way). For a base wrapped by a torch.func transform (batched, or a
  // grad wrapper that a vmap below may batch) the end is clamped to the dimension's size, which
  // slices the same elements; plain bases keep the end as given, so graphs stay torch.func's.
  const auto functorch_keys = c10::DispatchKeySet(
      {c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  if (end && base.key_set().has_any(functorch_keys) && !end->is_heap_allocated()) {
    const int64_t dim = c10::maybe_wrap_dim(m.arg(0).toInt(), base.dim());
    const c10::SymInt size = base.sym_size(dim);
    if (!size.is_heap_allocated() && end->as_int_unchecked() > size.as_int_unchecked()) end = size;
  }
  return at::slice_scatter_symint(base, mv, m.arg(0).toInt(), opt_symint(m.arg(1)), end,
                                  m.arg(3).toSymInt());
}

// Output k of split(size, dim) is the slice [k*size, k*size + its length) along dim.
Tensor split_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t dim = c10::maybe_wrap_dim(m.arg(1).toInt(), base.dim());
  const c10::SymInt start = m.arg(0).toSymInt() * m.out_index;
  const c10::SymInt end = start + mv.sym_size(dim);
  return at::slice_scatter_symint(base, mv, dim, start, end, 1);
}

Tensor split_with_sizes_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t dim = c10::maybe_wrap_dim(m.arg(1).toInt(), base.dim());
  const auto sizes = m.arg(0).toSymIntVector();
  c10::SymInt start = 0;
  for (int64_t i = 0; i < m.out_index; ++i) start = start + sizes[i];
  return at::slice_scatter_symint(base, mv, dim, start, start + sizes[m.out_index], 1);
}

Tensor unbind_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return at::select_scatter(base, mv, m.arg(0).toInt(), m.out_index);
}

Tensor unsqueeze_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t dim = m.arg(0).toInt();
  return m.reapply ? mv.squeeze(dim) : at::squeeze_copy(mv, dim);
}

Tensor t_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  return m.reapply ? mv.t() : at::t_copy(mv);
}

Tensor transpose_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t d0 = m.arg(0).toInt(), d1 = m.arg(1).toInt();
  return m.reapply ? mv.transpose(d0, d1) : at::transpose_copy(mv, d0, d1);
}

// unfold(dim, size, step) of a base laid out contiguously is as_strided with the dimension's
// stride multiplied by step and a new last dimension of the old stride; as_strided_scatter on
// that geometry writes the windows and leaves any gaps (size < step) as they were, as eager does.
// size > step overlaps and is refused before any inverse runs (Note [Kernel: internal overlap]).
Tensor unfold_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t dim = c10::maybe_wrap_dim(m.arg(0).toInt(), std::max<int64_t>(base.dim(), 1));
  const int64_t size = m.arg(1).toInt(), step = m.arg(2).toInt();
  TORCH_CHECK_NOT_IMPLEMENTED(size <= step,
                              "functionalize: aten::unfold: writing through "
                              "unfold(dimension=",
                              dim, ", size=", size, ", step=", step,
                              ") is not supported: the windows overlap. Clone it first.");
  // The windows are counted from the base's first element, in a base that starts its storage:
  // as_strided_scatter's offset is in the storage of what it writes, and its autograd form
  // (strided_scatter) writes into zeros_like(base), a storage of the base's own elements, where a
  // base at an offset (the value of an input that is a slice of a buffer) would put the windows
  // past the end. A base at an offset costs one copy more than the scatter itself.
  const Tensor dense = base.is_contiguous() && base.sym_storage_offset() == 0
                           ? base
                           : base.clone(at::MemoryFormat::Contiguous);
  std::vector<c10::SymInt> sizes(dense.sym_sizes().begin(), dense.sym_sizes().end());
  std::vector<c10::SymInt> strides(dense.sym_strides().begin(), dense.sym_strides().end());
  if (sizes.empty()) {  // unfold of a 0-d tensor views it as one window of one element
    const c10::IntArrayRef scalar_shape{};  // not `{}`: that would pick view(ScalarType)
    return m.reapply ? mv.view(scalar_shape) : at::view_copy(mv, scalar_shape);
  }
  const c10::SymInt inner = strides[dim];
  sizes[dim] = (sizes[dim] - size) / step + 1;
  strides[dim] = inner * step;
  sizes.push_back(size);
  strides.push_back(inner);
  return strided_scatter(dense, mv, sizes, strides, c10::SymInt(0));
}

Tensor identity_inverse(const Tensor& /*base*/, const Tensor& mv, const ViewMeta& /*m*/) {
  return mv;
}

// view_as_complex needs pairs of adjacent reals: a last dimension of stride 1, and even other
// strides and offset. A real view restrided since it was taken (v = view_as_real(x); v.t_(); a
// write through v.unsqueeze_(2)) reaches this inverse in other strides: its values are packed
// first (the base's own strides come back in AliasStorage::folded_, "inverted base").
Tensor view_as_real_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  bool pairs = true;
  if (mv.layout() == c10::kStrided && !mv.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      mv.dim() > 0) {
    pairs = mv.stride(-1) == 1 && mv.storage_offset() % 2 == 0;
    for (int64_t d = 0; d + 1 < mv.dim(); ++d) pairs &= mv.stride(d) % 2 == 0;
  }
  const Tensor reals = pairs ? mv : mv.contiguous();
  return m.reapply ? at::view_as_complex(reals) : at::view_as_complex_copy(reals);
}

Tensor view_as_complex_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  auto resolved = mv.resolve_conj();
  return m.reapply ? at::view_as_real(resolved) : at::view_as_real_copy(resolved);
}

// The new base keeps the old base's lazy bit: _conj of a plain mutated view is a lazily
// conjugated tensor, which the base (and so its wrapper, which mirrors the bit) was not.
Tensor conj_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  if (!m.reapply) return at::_conj_copy(mv);
  Tensor out = at::_conj(mv);
  return out.is_conj() && !base.is_conj() ? out.resolve_conj() : out;
}

// As conj_inverse, for the negative bit.
Tensor neg_view_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  if (!m.reapply) return at::_neg_view_copy(mv);
  Tensor out = at::_neg_view(mv);
  return out.is_neg() && !base.is_neg() ? out.resolve_neg() : out;
}

// slice_inverse(self, src, dim, start, end, step) views `self` (a slice) as the whole `src`;
// mutating that whole moves back to the slice.
Tensor slice_inverse_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const int64_t dim = m.arg(1).toInt();
  auto start = opt_symint(m.arg(2)), end = opt_symint(m.arg(3));
  auto step = m.arg(4).toSymInt();
  return m.reapply ? mv.slice_symint(dim, start, end, step)
                   : at::slice_copy_symint(mv, dim, start, end, step);
}

// _values / values of a sparse COO base: a write through them changes the values and nothing
// else, so the new base is the old one's indices (a fresh copy without views), sizes and
// coalesced flag around the written values (Adagrad's std._values().sqrt_() on a sparse grad).
Tensor sparse_values_inverse(const Tensor& base, const Tensor& mv, const ViewMeta& m) {
  const Tensor indices = m.reapply ? base._indices() : at::_indices_copy(base);
  return at::_sparse_coo_tensor_with_dims_and_tensors_symint(
      base.sparse_dim(), base.dense_dim(), base.sym_sizes(), indices, mv,
      base.options().dtype(mv.scalar_type()), base.is_coalesced());
}

const std::unordered_map<c10::OperatorName, InverseFn>& table() {
  static const std::unordered_map<c10::OperatorName, InverseFn> t = {
      {{"aten::as_strided", ""}, &as_strided_inverse},
      {{"aten::diagonal", ""}, &diagonal_inverse},
      {{"aten::expand", ""}, &expand_inverse},
      {{"aten::permute", ""}, &permute_inverse},
      {{"aten::_reshape_alias", ""}, &view_like_inverse},
      {{"aten::view", ""}, &view_like_inverse},
      {{"aten::view", "dtype"}, &view_dtype_inverse},
      {{"aten::squeeze", ""}, &view_like_inverse},
      {{"aten::squeeze", "dim"}, &view_like_inverse},
      {{"aten::squeeze", "dims"}, &view_like_inverse},
      {{"aten::unsqueeze", ""}, &unsqueeze_inverse},
      {{"aten::select", "int"}, &select_inverse},
      {{"aten::slice", "Tensor"}, &slice_inverse},
      {{"aten::split", "Tensor"}, &split_inverse},
      {{"aten::split_with_sizes", ""}, &split_with_sizes_inverse},
      {{"aten::unbind", "int"}, &unbind_inverse},
      {{"aten::t", ""}, &t_inverse},
      {{"aten::transpose", "int"}, &transpose_inverse},
      {{"aten::unfold", ""}, &unfold_inverse},
      {{"aten::alias", ""}, &identity_inverse},
      {{"aten::detach", ""}, &identity_inverse},
      {{"aten::lift_fresh", ""}, &identity_inverse},
      {{"aten::view_as_real", ""}, &view_as_real_inverse},
      {{"aten::view_as_complex", ""}, &view_as_complex_inverse},
      {{"aten::_conj", ""}, &conj_inverse},
      {{"aten::_neg_view", ""}, &neg_view_inverse},
      {{"aten::slice_inverse", ""}, &slice_inverse_inverse},
      {{"aten::_values", ""}, &sparse_values_inverse},
      {{"aten::values", ""}, &sparse_values_inverse},
  };
  return t;
}

}  // namespace

InverseFn find_inverse(const c10::OperatorName& view_op) {
  auto it = table().find(view_op);
  return it == table().end() ? nullptr : it->second;
}

bool is_regrouping(const ViewMeta& step) {
  return step.inverse_fn == &view_like_inverse;
}

std::vector<c10::OperatorName> view_ops_with_inverse() {
  std::vector<c10::OperatorName> names;
  for (const auto& [name, fn] : table()) names.push_back(name);
  return names;
}

}  // namespace tfz::detail
