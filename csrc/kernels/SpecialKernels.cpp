// Ops with bespoke rules, each with its own Note: the hidden running-stat update of
// aten::native_batch_norm, resize_ / resize_as_, which change a tensor's storage, and in-place
// _foreach_ ops whose lists alias each other.
#include "kernels/Kernels.h"

#include "core/Conversions.h"

#include <ATen/core/grad_mode.h>
#include "core/ViewInverses.h"

#include <algorithm>
#include <unordered_map>

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

// Note [Kernel: native_batch_norm]
// native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps) is
// declared functional, yet with training=True it updates running_mean/running_var in place.
// Run generically, it would write straight into the inner tensors (for inputs: the user's own
// buffers) and the traced graph would show a "functional" op with a side effect and no
// write-back; torch.func.functionalize has exactly that hole. Here, in training mode with both
// running stats given, we call _native_batch_norm_legit_functional, which returns the new stats,
// and commit them like any mutation, so the graph shows the functional op and the input epilogue
// writes the buffers back. Its outputs (out, save_mean, save_invstd) match native_batch_norm's.
// Everything else (eval mode, missing stats) has no hidden write and goes the functional path.
// When autograd records the call (grad mode on, and input, weight or bias requires grad), the
// functional op's backward node saves its running-stat arguments; for inputs those are the
// caller's buffers, which the epilogue's copy_ then bumps, and backward would fail its version
// check (eager never bumps them: its write is hidden). So in that case only, the node gets clones
// of the stats; a forward-only trace stays clone-free.

void native_batch_norm_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                              torch::jit::Stack* stack, const Layer& layer) {
  constexpr size_t kNumArgs = 8, kRunningMean = 3, kRunningVar = 4, kTraining = 5;
  auto args = torch::jit::last(*stack, kNumArgs);
  const bool training = args[kTraining].toBool();
  const auto& mean = args[kRunningMean];
  const auto& var = args[kRunningVar];
  const bool has_stats = mean.isTensor() && mean.toTensor().defined() && var.isTensor() &&
                         var.toTensor().defined();
  if (!training || !has_stats) return functional_kernel(op, stack, layer);
  for (const auto* stat : {&mean, &var}) {
    TORCH_CHECK(maybe_get_impl(stat->toTensor()) != nullptr, "functionalize: ", info.name,
                ": training-mode batch norm updates its running stats in place, and they are "
                "plain tensors (created outside the function). Pass them to the function as "
                "inputs (e.g. functionalize the module call with its buffers as arguments).");
  }
  std::vector<c10::IValue> inner(args.begin(), args.end());
  const at::Tensor mean_wrapper = mean.toTensor(), var_wrapper = var.toTensor();
  torch::jit::drop(*stack, kNumArgs);

  InnerCallGuard guard;
  for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
  bool records_autograd = false;
  for (size_t i = 0; i < 3 && at::GradMode::is_enabled(); ++i) {
    for_each_tensor(inner[i], [&](const at::Tensor& t) { records_autograd |= t.requires_grad(); });
  }
  if (records_autograd) {
    inner[kRunningMean] = inner[kRunningMean].toTensor().clone();
    inner[kRunningVar] = inner[kRunningVar].toTensor().clone();
  }
  torch::jit::Stack fstack(inner.begin(), inner.end());
  info.functional_op->callBoxed(fstack);  // out, save_mean, save_invstd, new_mean, new_var
  for (const auto& [wrapper, index] : {std::pair{mean_wrapper, 3}, std::pair{var_wrapper, 4}}) {
    auto* impl = unsafe_get_impl(wrapper);
    impl->replace_(fstack[index].toTensor());
    impl->commit_update_();
    impl->sync_();
  }
  for (size_t i = 0; i < 3; ++i) {
    torch::jit::push(*stack, make_fresh_wrapper(fstack[i].toTensor(), layer.id));
  }
}

// Note [Kernel: resize_]
// Eager resize_ keeps the storage while the new size fits in it (shrinking, or growing back into
// elements the storage still holds) and only reallocates, copying the old storage, past its end.
// Program:                         Functionalized:
//   x = torch.arange(4.)             x0 = arange(4)
//   x.resize_(2); x.resize_(4)       x1 = as_strided(x0, [2], [1], 0); x2 = as_strided(x0, [4], [1], 0)
//   return x + 1                     add(x2, 1)          (eager: [1, 2, 3, 4], old elements back)
// So a resize_ that fits is a view step: as_strided(size, strides, base offset) of the alias
// storage's base at the tensor's own offset, replacing the wrapper's chain (views included: the
// step restates the view over the storage). Past the end of
// the storage, a non-view wrapper (the storage's only user: other live aliases would diverge
// from eager, so they are refused) moves to a new storage whose base is aten::resize of the whole
// old storage. Either way the input epilogue replays the resize_ call on the caller's tensor.
// Rejected: the functional aten::resize of the current value alone: it drops the elements past
// the current size that eager keeps, so a shrink followed by a grow gave garbage.
void resize_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  const at::Tensor self = args[0].toTensor();
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK(impl != nullptr, "functionalize: ", info.name,
              ": cannot resize a plain tensor (created outside the function) inside it. Pass it "
              "to the function as an input.");
  TORCH_CHECK_NOT_IMPLEMENTED(!self.unsafeGetTensorImpl()->has_symbolic_sizes_strides(),
                              "functionalize: ", info.name, ": symbolic sizes are not supported.");
  const bool is_resize_as = op.schema().name() == "aten::resize_as_";
  const std::vector<int64_t> size =
      is_resize_as ? args[1].toTensor().sizes().vec() : args[1].toIntVector();
  const auto format = args[2].isNone() ? c10::MemoryFormat::Contiguous : args[2].toMemoryFormat();
  if (self.sizes() == c10::IntArrayRef(size) && args[2].isNone()) {
    torch::jit::drop(*stack, num_args);  // same size: eager changes nothing, strides included
    torch::jit::push(*stack, self);
    return;
  }
  std::vector<int64_t> strides;
  {
    MetaComputeGuard guard;  // eager's strides for this size and memory format
    strides = at::empty(size, self.options().device(c10::kMeta).memory_format(format)).strides().vec();
  }
  int64_t needed = 1;
  for (size_t d = 0; d < size.size(); ++d) needed += (size[d] - 1) * strides[d];
  for (int64_t s : size) needed = s == 0 ? 0 : needed;

  impl->sync_();
  static const auto as_strided = c10::Dispatcher::singleton().findSchemaOrThrow("aten::as_strided", "");
  static const auto as_strided_copy = c10::Dispatcher::singleton().findOp({"aten::as_strided_copy", ""});
  const at::Tensor base = impl->alias_storage().base();
  // The wrapper's own offset is eager's (mirrored, or the reference metadata without views), and
  // the storage's base starts where eager's storage does, so it is an offset into the base.
  const int64_t offset = self.storage_offset();
  const int64_t capacity = static_cast<int64_t>(base.storage().nbytes() / base.itemsize()) - offset;
  int64_t view_offset = offset;
  if (needed > capacity) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->is_resizable_base(), "functionalize: ", info.name,
        ": growing a view past the end of its storage is not supported (eager would reallocate "
        "the storage it shares). Resize the base tensor, or clone the view first.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->storage().use_count() == 1, "functionalize: ", info.name,
        ": growing a tensor past its storage while views of it are alive is not supported (the "
        "views would no longer match eager). Resize before taking views, or clone first.");
    at::Tensor grown;
    {
      InnerCallGuard guard;
      const at::Tensor old = layer.reapply_views ? base.as_strided({capacity}, {1}, offset)
                                                 : at::as_strided_copy(base, {capacity}, {1}, offset);
      grown = at::resize(old, {needed});
    }
    impl->replace_storage_(grown);
    view_offset = 0;
  }
  auto step = std::make_shared<const ViewMeta>(
      as_strided, as_strided_copy,
      std::vector<c10::IValue>{c10::IValue(size), c10::IValue(strides), c10::IValue(view_offset)},
      -1, layer.reapply_views, find_inverse(as_strided.operator_name()));
  // Replayed on the caller's tensor as resize_(size, memory_format): resize_as_'s template may be
  // a wrapper, which must not reach the epilogue.
  static const auto resize = c10::Dispatcher::singleton().findSchemaOrThrow("aten::resize_", "");
  impl->resize_chain_(std::move(step),
                      MetadataMutation{resize, {c10::IValue(size), args[2]}});
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, self);
}

// Note [Kernel: _foreach_ ops on aliased lists]
// An in-place _foreach_ op's functional variant computes every element from the values before the
// call. Eager's CPU kernel (the slow path, taken on CPU) loops over the elements instead, so in
// _foreach_add_([x, y], [y, x]) the second element reads the x the first one already updated
// (torch.func.functionalize gets this wrong). When some written element shares an alias storage
// with a tensor argument at another position (or is itself another position of a list), the op
// is applied one index at a time, in order: a single-element call per index (tensor lists and
// scalar lists sliced, every other argument as given), each functionalized as usual. Aliasing is
// judged by alias storage, so disjoint views of one base also take this path; they get the same
// values, as a sequence of single-element foreach ops in the graph. The per-element scalars
// tensor of _foreach_addcmul_/addcdiv_.Tensor is sliced too.
// Rejected: always splitting (a graph with N ops where eager has one, and N times the dispatch
// cost on the optimizer's hot path, for a case that only arises with aliased lists).

namespace {

const AliasStorage* alias_of(const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  return impl != nullptr ? &impl->alias_storage() : nullptr;
}

}  // namespace

bool foreach_lists_alias(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  const auto first = stack.end() - static_cast<std::ptrdiff_t>(args.size());
  // Lists of different lengths are an error the functional op reports in eager's words.
  std::optional<size_t> length;
  for (size_t j = 0; j < args.size(); ++j) {
    const c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(j));
    if (!v.isList()) continue;
    const size_t n = v.toListRef().size();
    if (length && *length != n) return false;
    length = n;
  }
  // One element has no order to respect (and a single-element call must not split again).
  if (!length || *length < 2) return false;
  // Per alias storage: the list position it was first seen at (-1: a non-list argument), whether
  // it is used at more than one position, and whether some use is written. One pass, so the
  // optimizer's long lists cost O(n).
  struct Seen {
    int64_t position;
    bool several = false;
    bool written = false;
  };
  std::unordered_map<const AliasStorage*, Seen> seen;
  seen.reserve(*length * args.size());
  auto use = [&](const at::Tensor& t, int64_t position, bool written) {
    const auto* storage = alias_of(t);
    if (storage == nullptr) return false;
    auto [it, fresh] = seen.try_emplace(storage, Seen{position});
    Seen& s = it->second;
    if (!fresh && (position == -1 || position != s.position)) s.several = true;
    s.written |= written;
    return s.several && s.written;
  };
  for (size_t j = 0; j < args.size(); ++j) {
    const bool written = args[j].alias_info() != nullptr && args[j].alias_info()->isWrite();
    const c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(j));
    if (v.isTensorList()) {
      int64_t i = 0;
      for (const at::Tensor& t : v.toTensorList()) {
        if (use(t, i++, written)) return true;
      }
    } else if (v.isTensor() && use(v.toTensor(), -1, written)) {
      return true;
    }
  }
  return false;
}

void foreach_sequential_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  std::vector<c10::IValue> call_args(stack->end() - static_cast<std::ptrdiff_t>(args.size()),
                                     stack->end());
  torch::jit::drop(*stack, args.size());
  size_t n = 0;
  for (const auto& v : call_args) {
    if (v.isTensorList()) n = std::max(n, v.toTensorList().size());
  }
  for (size_t i = 0; i < n; ++i) {
    torch::jit::Stack one;
    one.reserve(call_args.size());
    for (const auto& v : call_args) {
      if (v.isTensorList()) {
        one.emplace_back(c10::List<at::Tensor>({v.toTensorList().get(i)}));
      } else if (v.isList()) {  // Scalar[]: one scalar per element
        auto list = v.toList();
        c10::impl::GenericList elem(list.elementType());
        elem.push_back(list.get(i));
        one.emplace_back(std::move(elem));
      } else if (v.isTensor() && args[&v - call_args.data()].name() == "scalars") {
        // _foreach_addcmul_/addcdiv_.Tensor: one scalar per element, as a 1-D tensor.
        one.emplace_back(v.toTensor().narrow(0, static_cast<int64_t>(i), 1));
      } else {
        one.push_back(v);
      }
    }
    op.callBoxed(one);  // back through the dispatcher: each call is functionalized on its own
  }
}

}  // namespace tfz::detail
