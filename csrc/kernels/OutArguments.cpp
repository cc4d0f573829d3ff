// out= arguments: the geometry eager leaves an out= tensor in after a resize (its strides, read off
// the out= kernel or a meta run), out= of another dtype (the out= kernel rerun eagerly, or its
// composite decomposition recorded in graphs), and the Notes on resizing out= tensors. The write
// itself is the mutation path's (MutationKernels.cpp). See Note [Kernel: out= resize].
#include "kernels/Handlers.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layout.h"
#include "core/MemoryOverlap.h"
#include "core/Recorder.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

namespace tfz::detail {

using Stack = torch::jit::Stack;

// Note [Kernel: out= resize]
// torch.cumsum(v, 0, out=x) with x of another shape: eager's resize_output resizes x in place
// (resize_: the storage keeps the elements x no longer covers, and views of x keep seeing them),
// then writes. So an out= tensor of another shape is resized through the resize_ rule first (an
// as_strided step over its storage, replayed on the input by the epilogue), then written like any
// in-place op. The strides it ends with: Note [Strides: what eager gives], case "resized out=".
// A view is resized the same way (torch.neg(t, out=y[:2]) with four elements writes y[:4], as
// eager; a slice of an input grows the input's storage), and what resize_ refuses (a view
// growing past its storage, which eager reallocates in place under every alias of it) is refused
// by the out= op's name.
// Rejected: refusing every view that needs a resize (a slice a caller passes, b.narrow(0, 1, 4),
// could not receive a larger out= result); replacing x's value by the result: it drops the
// elements x no longer covers, and views of x then regenerate from the new shape (wrong values).
// Only symbolic shapes keep that replacement (the resize_ rule needs concrete sizes).

bool is_real(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_meta() &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
         !t.key_set().has_any(c10::python_ks |
                              c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                                   c10::DispatchKey::FuncTorchGradWrapper}));
}

namespace {

// The out= op run untraced on real copies of `args` (wrappers and plain tensors) in their
// reported geometry, each written out= tensor a private fresh_out_like: eager's results, or
// nullopt where that cannot be done. See Note [Strides: what eager gives], case "resized out=".
std::optional<std::vector<c10::IValue>> run_out_op_on_eager_geometry(
    const OpInfo& info, const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  if (info.seeded) return std::nullopt;
  std::vector<c10::IValue> call = args;
  // The written arguments as passed: callBoxed leaves only the op's returns on `call`.
  std::vector<c10::IValue> passed(args.size());
  bool real = true;
  try {
    // Values up to date first, as the op itself would see them (a sync is part of the graph).
    std::vector<at::Tensor> values;
    for (const auto& v : args) {
      for_each_tensor(v, [&](const at::Tensor& t) { values.push_back(sync_and_unwrap(t)); });
    }
    size_t next = 0;
    MetaComputeGuard guard;
    for (size_t i = 0; i < call.size(); ++i) {
      bool is_out = false;
      for (const auto& w : info.written) is_out |= w.is_out && w.index == static_cast<int>(i);
      transform_tensors(call[i], [&](const at::Tensor& t) -> at::Tensor {
        const at::Tensor value = values[next++];
        real = real && is_real(value) && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
        if (!real) return t;
        if (is_out) return fresh_out_like(t, value);
        if (value.sizes() == t.sizes() && value.strides() == t.strides()) return value;
        if (may_self_overlap(t.sizes(), t.strides())) {
          real = false;
          return t;
        }
        return at::empty_strided(t.sizes(), t.strides(), value.options()).copy_(value);
      });
      if (!real) return std::nullopt;
      if (is_out) passed[i] = call[i];
    }
    op.callBoxed(call);
  } catch (const std::exception&) {
    return std::nullopt;  // eager raises on these arguments: the functional path reports it
  }
  std::vector<c10::IValue> results(info.written.size());
  for (size_t k = 0; k < info.written.size(); ++k) {
    const auto& w = info.written[k];
    if (w.is_out) results[k] = passed[w.index];
  }
  return results;
}

// The functional op on meta tensors of the wrappers' reported geometry.
std::optional<Stack> run_functional_on_meta(const OpInfo& info,
                                            const std::vector<c10::IValue>& args) {
  Stack meta;
  try {
    MetaComputeGuard guard;
    const std::vector<c10::IValue> meta_args = meta_twins_of(args);
    at::Tensor first_out;
    for (const auto& w : info.written) {
      if (w.is_out && meta_args[w.index].isTensor() && !first_out.defined()) {
        first_out = meta_args[w.index].toTensor();
      }
    }
    const auto& fschema = info.functional_op->schema();
    for (size_t i = 0; i < info.functional_args.size(); ++i) {
      meta.push_back(
          functional_arg(info.functional_args[i], fschema.arguments()[i], meta_args, first_out));
    }
    info.functional_op->callBoxed(meta);
  } catch (const std::exception&) {
    // No meta kernel, or arguments meta cannot take (a Python meta function may raise a Python
    // error, not a c10::Error): the value's strides stay.
    return std::nullopt;
  }
  return meta;
}

}  // namespace

void out_results_in_eager_strides(const OpInfo& info, const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& args, Stack& fstack,
                                  bool views_kept) {
  bool resizes = false;
  for (const auto& w : info.written) {
    const auto& v = fstack[w.functional_return];
    resizes |= w.is_out && args[w.index].isTensor() && v.isTensor() &&
               !args[w.index].toTensor().unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
               !v.toTensor().unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
               args[w.index].toTensor().sizes() != v.toTensor().sizes();
  }
  if (!resizes) return;
  // eager[k]: the k-th written argument as eager leaves it (out= ones only).
  std::vector<c10::IValue> eager(info.written.size());
  if (auto outs = run_out_op_on_eager_geometry(info, op, args)) {
    eager = std::move(*outs);
  } else if (views_kept) {
    return;
  } else if (auto meta = run_functional_on_meta(info, args)) {
    for (size_t k = 0; k < info.written.size(); ++k) {
      eager[k] = (*meta)[info.written[k].functional_return];
    }
  } else {
    return;
  }
  for (size_t k = 0; k < info.written.size(); ++k) {
    const auto& w = info.written[k];
    auto& v = fstack[w.functional_return];
    if (!w.is_out || !v.isTensor() || !eager[k].isTensor()) continue;
    const at::Tensor value = v.toTensor();
    const at::Tensor& e = eager[k].toTensor();
    if (value.layout() == c10::kStrided && value.is_non_overlapping_and_dense() &&
        e.is_non_overlapping_and_dense() && same_sizes_other_strides(value, e)) {
      v = restrided_copy(at::empty_strided(value.sizes(), e.strides(), value.options()), value);
    }
  }
}

// Note [Kernel: out= of another dtype]
// Rule: an out= call whose out has another dtype than the functional result gives eager's
// numbers, computed in out's dtype wherever eager's out= kernel computes in it
// (torch.sum(x_bf16, 0, out=y_f32) accumulates in float32, torch.logsumexp(x_f32, 0, out=y_f64)
// sums in float64 inside its out= kernel), not the functional result cast by the write.
// Cases:
//   "reductions": sum, mean, prod, nansum, cumsum and cumprod take their dtype from out when none
//     is given, so their plan passes the out= call's dtype argument, or out's dtype where it is
//     None (ArgSource::FromMutableArgOrOutDtype, core/OpSchemaInfo.cpp reduces_in_out_dtype).
//   "eagerly": for the others, when the functional result's dtype is not out's and nothing
//     records the program (the conditions of Note [Kernel: in-place on the inner value]), the
//     out= op itself runs on the inner arguments into a private tensor of out's geometry and
//     dtype, and its result is the value: eager's numbers by construction (rerun_out_eagerly).
//     Seeded random ops are left alone (a second run would draw again). The same rerun gives a
//     resized out eager's strides (Note [Strides: what eager gives], case "resized out=").
//   "composites in graphs": a graph cannot rerun a kernel. An out= op whose kernel for out's
//     backend is a composite (CompositeExplicitAutograd[NonFunctional], no backend kernel:
//     logsumexp.out is amax, sub, exp_, sum.out into y, log_, add_) and whose functional result
//     (found on meta tensors) has out's sizes but not its dtype runs that composite on the
//     wrappers, and the graph records its ops, each functionalized exactly (sum.out into a
//     float64 out becomes sum(.., dtype=float64)). An out= tensor the op resizes is resized
//     first, by our resize_ rule (Note [Kernel: resize_]; eager's resize_output is resize_ to the
//     result's sizes), since the composite's own resize_output cannot resize a wrapper's storage
//     ("storage that is not resizable"); the composite then finds out at its size
//     (composite_out_of_another_dtype, mutable_kernel). Any other graph keeps the functional op
//     and the cast, as torch.func's graph does.
// Why: the cast rounds a result computed in the narrower dtype, so the numbers differ from
// eager's in the last digits (in the third for a bfloat16 sum).
// Rejected: listing the ops that accumulate in out by name (logsumexp and whichever others, and
// the set varies with dtype and torch version, where the kernel itself knows); decomposing every
// composite out= op in graphs (graphs would lose the one op torch's own functionalization
// records, for no change of value).
bool out_takes_eager_kernel(const at::Tensor& wrapper, const at::Tensor& out,
                            const at::Tensor& result) {
  if (out.layout() != c10::kStrided || result.layout() != c10::kStrided ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      result.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  const bool other_dtype = result.scalar_type() != out.scalar_type() &&
                           c10::canCast(result.scalar_type(), out.scalar_type());
  // The common case (same dtype, same shape) returns before the TLS reads of nothing_records.
  return (other_dtype || wrapper.sizes() != result.sizes()) && nothing_records(out);
}

at::Tensor fresh_out_like(const at::Tensor& wrapper, const at::Tensor& out) {
  return at::empty_strided(wrapper.sizes(), wrapper.strides(), out.options());
}

void rerun_out_eagerly(const OpInfo& info, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& args, const std::vector<c10::IValue>& inner,
                       Stack& fstack) {
  const size_t index = info.written.empty() ? 0 : info.written[0].index;
  if (info.written.size() != 1 || !info.written[0].is_out ||
      info.written[0].functional_return != 0 || info.seeded || fstack.empty() ||
      !fstack[0].isTensor() || !inner[index].isTensor() ||
      !out_takes_eager_kernel(args[index].toTensor(), inner[index].toTensor(),
                              fstack[0].toTensor())) {
    return;
  }
  std::vector<c10::IValue> call = inner;
  at::Tensor fresh = fresh_out_like(args[index].toTensor(), inner[index].toTensor());
  call[index] = fresh;
  op.callBoxed(call);
  fstack[0] = fresh;
}

// The composite key of `op`'s out= kernel (CompositeExplicitAutogradNonFunctional in torch 2.13,
// where logsumexp.out is registered; CompositeExplicitAutograd is checked too, as the key a
// composite out= kernel may be registered under), where the op decomposes into ops we
// functionalize; nullopt otherwise.
// See Note [Kernel: out= of another dtype], case "composites in graphs".
std::optional<CompositeOut> composite_out_of_another_dtype(const OpInfo& info,
                                                           const c10::OperatorHandle& op,
                                                           const Stack& stack) {
  if (info.written.size() != 1 || !info.written[0].is_out ||
      info.written[0].functional_return != 0 || info.seeded) {
    return std::nullopt;
  }
  std::optional<c10::DispatchKey> key;
  for (const auto k : {c10::DispatchKey::CompositeExplicitAutogradNonFunctional,
                       c10::DispatchKey::CompositeExplicitAutograd}) {
    if (!key && op.hasKernelForDispatchKey(k)) key = k;
  }
  if (!key) return std::nullopt;
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack.end() - static_cast<std::ptrdiff_t>(num_args),
                                      stack.end());
  const c10::IValue& out_arg = args[info.written[0].index];
  if (!out_arg.isTensor() || maybe_get_impl(out_arg.toTensor()) == nullptr) return std::nullopt;
  const at::Tensor& out = out_arg.toTensor();
  if (out.layout() != c10::kStrided || op.hasKernelForDispatchKey(c10::computeDispatchKey(
                                           std::nullopt, out.layout(), out.device()))) {
    return std::nullopt;  // the backend's own kernel: no decomposition to record
  }
  const auto meta = run_functional_on_meta(info, args);
  if (!meta || meta->empty() || !(*meta)[0].isTensor()) return std::nullopt;
  const at::Tensor& result = (*meta)[0].toTensor();
  if (result.scalar_type() == out.scalar_type()) return std::nullopt;
  if (result.sym_sizes() == out.sym_sizes()) return CompositeOut{*key, std::nullopt};
  // Another size: resized first by the caller, which needs concrete sizes.
  if (result.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      out.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return std::nullopt;
  }
  return CompositeOut{*key, result.sizes().vec()};
}

}  // namespace tfz::detail
