// Rows for CompositeImplicitAutograd ops whose decompositions bypass the dispatcher on our wrappers
// (raw fast paths, out= resized natively, tensor_split's tensor of indices): taken whole.
// See Note [Kernel: composites intercepted whole].
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

// Note [Kernel: composites intercepted whole]
// CompositeImplicitAutograd (CIA) ops normally decompose above our key, so we only see the ops
// they are made of. A few CIA kernels take a fast path that bypasses the dispatcher when their
// tensors are not "subclass-like" (ATen's isTensorSubclassLike: Functionalize, Python, Batched,
// Sparse, Meta keys... or an active TorchDispatchMode), and our wrappers are not:
//  - out= ops resize `out` through at::native::resize_ on the TensorImpl (resize_output), which
//    fails on a wrapper ("storage that is not resizable") or silently leaves its shape stale
//    (matmul, linalg.matrix_power, linalg.multi_dot, quantile, linalg.norm, tensordot, ...);
//  - max_pool1d, ctc_loss and the ops over a PackedSequence's batch sizes
//    (lstm.data, gru.data, rnn_tanh.data, rnn_relu.data, _pad_packed_sequence) read a data
//    pointer directly, and so does quantile / nanquantile on CPU from torch 2.15 (and 2.11):
//    under capture their out= forms run the functional variant on the wrappers (see below),
//    which fails with "data is not allocated" unless the functional forms are taken whole too.
// We register our kernel for these ops (all CIA out= ops, plus the named ones) so that they are
// handled whole: out= ops as Mutable (their functional variant, itself usually CIA, runs on the
// inner tensors, where the fast path is legal) and the named ones as Functional. Autograd is
// unaffected: it runs on the inner tensors during that call, as for every other op.
// Under a TorchDispatchMode (make_fx), the inner call would hand the tracer the op's whole
// decomposition, views included, which breaks remove="mutations_and_views". There the work is
// done on the wrappers instead, with Python un-hidden so that ATen sees the active mode and takes
// its dispatcher-only paths, and we see every op as usual: a functional op runs its CIA
// decomposition (composite_kernel); an out= op calls its functional variant on the wrappers and
// writes the result into out like any out= op (mutable_kernel). Not the out= op's own
// decomposition: on subclass-like tensors some rebind their `out` reference to a new tensor
// instead of writing it (linalg_matrix_rank.out), and the caller's out would keep its old value.
// Rejected: marking wrappers subclass-like by adding one of those keys to their key set. Each has
// a process-wide fallback that casts the TensorImpl to its own type (FunctionalTensorWrapper,
// TensorWrapper, BatchedTensorImpl) or calls into Python, so a wrapper that escaped its call
// would be undefined behaviour instead of our "escaped" error. Also rejected: intercepting every
// CIA op whole: dropout's RNG stream, batch_norm's hidden running-stat writes and views in
// views-removed graphs all change.
bool has_raw_fast_path(const c10::OperatorHandle& op) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return false;
  const auto& schema = op.schema();
  if (schema.name() == "aten::max_pool1d" && schema.overload_name().empty()) return true;
  if (schema.name() == "aten::ctc_loss") return true;  // Tensor, and IntList (its mean: below)
  // A PackedSequence's batch sizes, read as an int array from their data.
  if ((schema.name() == "aten::lstm" || schema.name() == "aten::gru" ||
       schema.name() == "aten::rnn_tanh" || schema.name() == "aten::rnn_relu") &&
      schema.overload_name() == "data") {
    return true;
  }
  if (schema.name() == "aten::_pad_packed_sequence") return true;
  if ((schema.name() == "aten::quantile" || schema.name() == "aten::nanquantile") &&
      (schema.overload_name().empty() || schema.overload_name() == "scalar")) {
    return true;
  }
  if (schema.name().rfind("aten::", 0) != 0) return false;
  // Their decomposition never resizes out natively, so it already works on wrappers; and it
  // never writes out at all for some dims (eager leaves `out` untouched: torch 2.13's
  // fft_ihfftn_symint_out passes (tmp, out) to conj_physical_out, which takes (out, self)). Only
  // the decomposition reproduces that, and matching eager is the contract.
  if (schema.name() == "aten::fft_ihfftn" || schema.name() == "aten::fft_ihfft2") return false;
  bool has_out = false;
  for (const auto& a : schema.arguments()) {
    if (is_written(a) && !is_out_argument(a)) return false;
    has_out |= is_out_argument(a);
  }
  return has_out;
}

namespace {

// See Note [Strides: what eager gives], case "composite out=".
void restride_outs_as_eager(const OpInfo& info, const c10::OperatorHandle& op, const Stack& stack) {
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack.end() - static_cast<std::ptrdiff_t>(num_args),
                                      stack.end());
  std::vector<std::pair<at::Tensor, at::Tensor>> outs;  // (wrapper, its meta twin)
  try {
    MetaComputeGuard guard;
    Stack meta;
    for (size_t i = 0; i < num_args; ++i) {
      c10::IValue v = args[i];
      const bool is_out = std::any_of(info.written.begin(), info.written.end(), [&](auto& w) {
        return w.is_out && w.index == static_cast<int>(i);
      });
      transform_tensors(v, [&](const at::Tensor& t) {
        TORCH_CHECK(t.layout() == c10::kStrided &&
                        !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && !t.is_conj() &&
                        !t.is_neg(),
                    "no meta twin");
        at::Tensor twin = meta_twin(t);
        if (is_out) outs.emplace_back(t, twin);
        return twin;
      });
      meta.push_back(std::move(v));
    }
    if (outs.empty()) return;
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, meta);
  } catch (const std::exception&) {
    return;  // no meta replay for this op or these arguments: out keeps its strides
  }
  for (const auto& [wrapper, twin] : outs) {
    if (wrapper.numel() > 0 && twin.sizes() == wrapper.sizes() &&
        (twin.strides() != wrapper.strides() ||
         twin.storage_offset() != wrapper.storage_offset())) {
      at::Tensor out(wrapper);
      // Eager reached the twin's geometry through a resize_ inside the decomposition, which grows
      // the storage where that geometry needs more: torch.matmul(v, w, out=x) of an expanded x (1
      // element of storage) resizes an unsqueezed x to 3 contiguous elements. as_strided_ cannot
      // grow a storage, so the same growth comes first: x made an empty view at its offset, then
      // resized (resize_ to the sizes x already has grows nothing, as the epilogue's Note in
      // api/Epilogue.cpp says).
      int64_t last = twin.storage_offset();
      for (int64_t d = 0; d < twin.dim(); ++d) last += (twin.size(d) - 1) * twin.stride(d);
      const auto needed = (last + 1) * static_cast<int64_t>(twin.itemsize());
      if (needed > static_cast<int64_t>(out.storage().nbytes())) {
        out.as_strided_({0}, {1}, out.storage_offset());
        out.resize_(twin.sizes());
      }
      if (out.strides() != twin.strides() || out.storage_offset() != twin.storage_offset()) {
        out.as_strided_(twin.sizes(), twin.strides(), twin.storage_offset());
      }
    }
  }
}

// Note [Kernel: ctc_loss's mean over int lengths]
// ctc_loss with int-list lengths and reduction="mean" divides each sequence's loss by its target
// length, a tensor its CIA kernel builds with at::tensor: at::empty, then a raw copy of the ints.
// Inside a layer that empty is a wrapper, which has no memory to copy into ("data is not
// allocated"); under plain make_fx the copy is not traced, and the graph divides by whatever
// memory `empty` hands out at replay (wrong numbers, silently: torch's own bug). Eagerly and under
// capture the op runs whole on the values; under a tracer the kernel computes the same mean on
// the wrappers: ctc_loss with reduction="none" (its decomposition, traced op by op), divided by
// the lengths as a constant (the int list is one in the graph anyway), clamped to 1 as eager's.
bool is_ctc_loss_mean_of_int_lengths(const c10::OperatorHandle& op, const Stack& stack) {
  if (!named(op, "aten::ctc_loss", "IntList")) return false;
  return (stack.end() - 2)->toInt() == at::Reduction::Mean;
}

at::Tensor ctc_loss_mean_on_wrappers(Stack* stack) {
  auto args = torch::jit::last(*stack, 7).vec();
  torch::jit::drop(*stack, 7);
  const at::Tensor log_probs = args[0].toTensor();
  std::vector<int64_t> target_lengths = args[3].toIntVector();
  const at::Tensor per_sequence =
      at::ctc_loss(log_probs, args[1].toTensor(), args[2].toIntVector(), target_lengths,
                   args[4].toInt(), at::Reduction::None, args[6].toBool());
  at::Tensor constant;
  {
    MetaComputeGuard untraced;  // the ints, as the graph's constant
    constant = at::tensor(target_lengths, at::kLong);
  }
  const at::Tensor lengths = constant.to(per_sequence.options()).clamp_min(1);
  return (per_sequence / lengths).mean();
}

}  // namespace

void composite_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                      const Layer& layer) {
  if (info.kind == OpKind::Mutable) restride_outs_as_eager(info, op, *stack);
  // Under capture, functional ones (max_pool1d, ctc_loss, quantile) run whole on inner values and
  // are recorded whole (their decomposition would read data pointers, which no recorder sees); out=
  // ones take the tracer's path below, so their views become *_copy ops like any others.
  const bool capturing = active_recorder() != nullptr;
  if (!c10::impl::TorchDispatchModeTLS::any_modes_set() &&
      (!capturing || info.kind != OpKind::Mutable)) {
    return generic_kernel(info, op, stack, layer);
  }
  if (info.kind == OpKind::Mutable) return mutable_kernel_on_wrappers(info, op, stack, layer);
  if (is_ctc_loss_mean_of_int_lengths(op, *stack)) {
    return torch::jit::push(*stack, ctc_loss_mean_on_wrappers(stack));
  }
  PythonUnhiddenGuard guard;
  op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
}

// Note [Kernel: tensor_split's tensor of indices]
// tensor_split(Tensor self, Tensor tensor_indices_or_sections, int dim) is
// CompositeImplicitAutograd and reads its second argument's data pointer (a CPU int64 tensor) to
// choose the int overload it calls; a wrapper has no data there, so a functionalized tensor_split
// whose indices are an input or a value computed in f fails with "data is not allocated" (as
// torch.func's does). The kernel hands the decomposition the indices' current value instead (the
// synced inner tensor, only read) and runs it on the wrappers, so the split is made of views of
// `self` as usual. Under make_fx that read is the data dependence plain make_fx of tensor_split has
// too; under capture the graph guards the indices' values (Note [Capture: guards on values read]).
// Rejected: taking the op whole on inner values like the raw fast paths above, which would
// return plain views of an inner tensor that the engine cannot follow.
bool is_tensor_split_by_tensor(const c10::OperatorHandle& op) {
  return named(op, "aten::tensor_split", "tensor_indices_or_sections");
}

void tensor_split_kernel(const OpInfo& /*info*/, const c10::OperatorHandle& op, Stack* stack,
                         const Layer& /*layer*/) {
  const auto num_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  c10::IValue& indices = *(stack->end() - num_args + 1);
  transform_tensors(indices, sync_and_unwrap);
  // Under capture the split points become constants of the graph: it guards the indices' values.
  if (Recorder* recorder = active_recorder(); recorder != nullptr && indices.isTensor()) {
    InnerCallGuard inner;  // the guard's constant copy is a plain tensor
    recorder->guard_values(indices.toTensor(), "aten::tensor_split's tensor of indices");
  }
  PythonUnhiddenGuard guard;
  op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
}

}  // namespace tfz::detail
