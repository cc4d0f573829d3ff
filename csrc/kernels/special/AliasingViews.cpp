// Rows for ops whose schemas hide that they alias: _unsafe_view, _reshape_alias, unsafe_split.
// See Note [Kernel: _unsafe_view].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/Recorder.h"
#include "core/ViewInverses.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tfz::detail {

// Note [Kernel: _unsafe_view]
// Its schema says "fresh tensor" (no alias annotation), but composite out= kernels (kron, matmul,
// ...) write into out through _unsafe_view(out, shape): treated as functional, those writes would
// be lost. So it is a view: replayed as itself with views kept, as view_copy without them (the
// same elements), and inverted like view.
// Rejected: keeping _unsafe_view in both modes, as torch's own functionalization does: a graph
// without views would still hold view-like nodes.
bool is_unsafe_view(const c10::OperatorHandle& op) {
  return named(op, "aten::_unsafe_view", "");
}

void plan_unsafe_view(const c10::OperatorHandle& op, OpInfo& info) {
  info.kind = OpKind::View;
  info.view_op = op;
  info.copy_op = c10::Dispatcher::singleton().findOp({"aten::view_copy", ""});
  TORCH_INTERNAL_ASSERT(info.copy_op.has_value(), "aten::view_copy is not registered");
  info.inverse = find_inverse({"aten::view", ""});
}

// Note [Kernel: _reshape_alias]
// reshape emits _reshape_alias(size, stride) only where view(size) is legal; its stride argument
// is eager's, which a *_copy value (remove="mutations_and_views") does not have, and it has no
// *_copy twin. It is replayed as view(size): the same elements, and a view_copy when views go.
// Rejected: as_strided with the recorded size and stride, the op's literal meaning: the stride
// names elements in eager's layout, so on a *_copy value it would read the wrong ones.
bool is_reshape_alias(const c10::OperatorHandle& op) {
  return named(op, "aten::_reshape_alias", "");
}

void plan_reshape_alias(const c10::OperatorHandle& /*op*/, OpInfo& info) {
  auto view = c10::Dispatcher::singleton().findOp({"aten::view", ""});
  TORCH_INTERNAL_ASSERT(view.has_value(), "aten::view is not registered");
  set_view_plan(*view, info);
  info.replay_arg_count = 1;
}

// Note [Kernel: unsafe_split]
// unsafe_split and unsafe_split_with_sizes (and unsafe_chunk, which decomposes into unsafe_split)
// return tensors that share self's storage, like split, but their schemas carry no alias
// annotation: "unsafe" only tells autograd not to track them as views. Treated as functional,
// a write through an output would be lost on self and its aliases (torch.func loses it). So they
// are planned as their safe twins, split.Tensor and split_with_sizes, which take the same
// arguments: replayed, inverted and turned into *_copy like them.
// Except on a tensor with the conjugate or negative bit: eager's conjugate and negative fallbacks
// see no view in unsafe_split, so they resolve the bit into a copy first, and the outputs alias
// that copy, not self: a write to self leaves them alone in eager. There the outputs are split
// from a resolved copy and wrapped fresh.
// Rejected: a view plan that replays unsafe_split as called: it has no *_copy twin for use
// without views, and with views kept the graph would hold a view whose schema says "fresh
// tensor", which alias analyses that read schemas (reinplace's is_view_op) take for a copy.
bool is_unsafe_split(const c10::OperatorHandle& op) {
  return named(op, "aten::unsafe_split", "Tensor") ||
         named(op, "aten::unsafe_split_with_sizes", "");
}

void plan_unsafe_split(const c10::OperatorHandle& op, OpInfo& info) {
  const bool sizes = op.operator_name().name == "aten::unsafe_split_with_sizes";
  const c10::OperatorName twin = sizes ? c10::OperatorName("aten::split_with_sizes", "")
                                       : c10::OperatorName("aten::split", "Tensor");
  auto view = c10::Dispatcher::singleton().findOp(twin);
  TORCH_INTERNAL_ASSERT(view.has_value(), c10::toString(twin), " is not registered");
  info.kind = OpKind::View;
  set_view_plan(*view, info);
}

void unsafe_split_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                         const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  c10::IValue& self = *(stack->end() - static_cast<std::ptrdiff_t>(num_args));
  const auto* impl = maybe_get_impl(self.toTensor());
  if (impl == nullptr) return view_kernel(info, op, stack, layer);
  // Without views the value has no bit to read: the chain's _conj / _neg_view steps say it.
  bool conj = self.toTensor().is_conj(), neg = self.toTensor().is_neg();
  if (!layer.reapply_views) {
    const auto [conj_steps, neg_steps] = impl->chain().bit_flips();
    conj ^= conj_steps;
    neg ^= neg_steps;
  }
  if (!conj && !neg) return view_kernel(info, op, stack, layer);
  // Eager's fallback resolves the bit into empty_like(self): the copy's storage is laid out in
  // self's stride order, which a resize_ of an output then reads in storage order (traced without
  // views, v.adjoint().unsafe_chunk(3, -1)[0].resize_as_(..) must not read the *_copy value's
  // row-major storage). Its strides, found on meta.
  std::vector<int64_t> copy_strides;
  if (!layer.reapply_views && same_sizes_other_strides(self.toTensor(), impl->value())) {
    MetaComputeGuard hidden;
    const at::Tensor& t = self.toTensor();
    copy_strides =
        at::empty_like(at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)))
            .strides()
            .vec();
  }
  InnerCallGuard guard;
  const at::Tensor inner = sync_and_unwrap(self.toTensor());
  // A copy either way: without views the value has its bits resolved already, and a fresh output
  // must not share another wrapper's value.
  if (inner.is_conj() || inner.is_neg()) {
    self = at::resolve_neg(at::resolve_conj(inner));
  } else if (!copy_strides.empty()) {
    self = restrided_copy(at::empty_strided(inner.sizes(), copy_strides, inner.options()), inner);
  } else {
    self = at::clone(inner);
  }
  op.callBoxed(stack);
  c10::IValue out = torch::jit::pop(*stack);
  transform_tensors(out, [&](const at::Tensor& t) { return make_fresh_wrapper(t, layer.id); });
  torch::jit::push(*stack, std::move(out));
}

}  // namespace tfz::detail
