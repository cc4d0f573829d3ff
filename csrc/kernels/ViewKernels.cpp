// View ops and in-place view ops on wrappers: run the view (or its *_copy twin) on the inner
// value and record a ViewMeta so the view can be regenerated from, and written back to, its base.
#include "kernels/Handlers.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/ModeStash.h"
#include "core/Recorder.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

// Note [Kernel: views are not synced]
// A view op does not bring its input up to date first: it runs on the (possibly stale) inner
// value and the new wrapper inherits the input's generation, so its first real use regenerates
// it from the base by replaying the whole chain. This is what torch.func.functionalize does, and
// it keeps our traced graphs op-for-op equal to its graphs (test_traces.py). Rejected: syncing the
// input first (graphs would then differ from torch.func's).

// See Note [Strides: what eager gives], case "view wrappers".

namespace {

// A meta tensor with symbolic `t`'s sizes, strides and storage offset.
at::Tensor symbolic_meta_twin(const at::Tensor& t) {
  const c10::SymInt nbytes = at::detail::computeStorageNbytes(
      t.sym_sizes(), t.sym_strides(), c10::SymInt(1), t.sym_storage_offset());
  return at::empty_symint({nbytes}, t.options().device(c10::kMeta))
      .as_strided_symint(t.sym_sizes(), t.sym_strides(), t.sym_storage_offset());
}

// The view op applied to a meta tensor with `self`'s sizes, strides and storage offset. With
// symbolic sizes the meta tensor has the same symbols (make_fx's tracing_mode="symbolic": the
// epilogue of an input x.t_() without views needs eager's symbolic strides); a view whose meta
// kernel cannot take them (a rule that lives in Python) keeps the copy's metadata (nullopt).
std::optional<c10::IValue> meta_reference(const c10::OperatorHandle& op, const at::Tensor& self,
                                          const std::vector<c10::IValue>& extra) {
  // A sparse self has no strides to give a meta twin, and a quantized one no meta kernels (views
  // of converted PTQ/QAT activations); their views' metadata is the copy's.
  if (self.layout() != c10::kStrided || c10::isQIntType(self.scalar_type())) return std::nullopt;
  MetaComputeGuard guard;
  if (self.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    try {
      torch::jit::Stack stack{symbolic_meta_twin(self)};
      stack.insert(stack.end(), extra.begin(), extra.end());
      op.callBoxed(stack);
      return std::move(stack[0]);
    } catch (const c10::Error&) {
      return std::nullopt;
    }
  }
  torch::jit::Stack stack{meta_twin(self)};
  stack.insert(stack.end(), extra.begin(), extra.end());
  op.callBoxed(stack);
  return std::move(stack[0]);
}

void set_reference(const at::Tensor& wrapper, const at::Tensor& reference) {
  unsafe_get_impl(wrapper)->set_reference_metadata_(reference);
}

std::vector<c10::IValue> args_after_self(const torch::jit::Stack& stack, size_t num_args) {
  return std::vector<c10::IValue>(stack.end() - static_cast<std::ptrdiff_t>(num_args) + 1,
                                  stack.end());
}

FunctionalTensorImpl* self_wrapper(const OpInfo& info, const torch::jit::Stack& stack,
                                   size_t num_args) {
  const auto& self = (stack.end() - static_cast<std::ptrdiff_t>(num_args))->toTensor();
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK(impl != nullptr, "functionalize: ", info.name,
              ": the viewed tensor is a plain tensor but another argument is functional; "
              "views of tensors created outside the function cannot be functionalized.");
  impl->sync_requires_grad_();
  return impl;
}

// Note [Kernel: as_strided without views]
// as_strided reads storage coordinates: x[1:].as_strided((2,), (1,), 3) means elements 3 and 4
// of x's storage, wherever x starts. Without views x's value is a *_copy, a fresh tensor whose
// storage starts at x's first element, so as_strided_copy on it reads the wrong elements or
// fails ("setStorage: ... out of bounds"). With remove="mutations" the view's value shares the
// base's storage, so the forward step is right, but its inverse is not: as_strided_scatter clones
// the view (offset 0, its own elements only), so a write through v.as_strided(..., 3) of a view v
// that starts elsewhere, or that reaches elements v does not cover, would be lost. So in both
// modes the step of an as_strided of a view is taken from the storage's base, whose element i is
// the storage's element i, and the view's chain is that one step (the base's view inverse,
// as_strided_scatter, writes it back).
// Rejected: the step on the view with remove="mutations" (graphs would name the view as
// torch.func's do, but the write-back is wrong).
bool is_as_strided(const c10::OperatorHandle& op) {
  static const c10::OperatorName name{"aten::as_strided", ""};
  return op.operator_name() == name;
}

// Storage coordinates need a base whose element i is the storage's element i. Returns whether the
// step may be taken from the base: its dtype and conjugate/negative bits must be self's too (a
// step from the base keeps neither). Where they are not, remove="mutations" keeps the step on
// the view (reads are right, its value shares the storage), and without views it is refused.
// With views kept, a base of another dtype is first reinterpreted as self's (view.dtype), whose
// element i is then the storage's element i in self's dtype, so that a write reaching elements
// the view does not cover lands (as_strided of view_as_real(x) of a complex x). The byte base of
// aliased inputs of two dtypes (Note [Inputs: aliased inputs]) gets the prefix its members get
// (the bytes that regroup, then view.dtype): as_strided of an int64 input beside its float64
// view, or as_strided_ of x.view(torch.int32) of a float input x = b[:2] over its flat base. An
// output made this way is rebuilt on the caller's storage. Returns the steps from the base to the
// storage in self's dtype, or nothing.
// See Note [Inputs: outputs that alias inputs].
std::vector<std::shared_ptr<const ViewMeta>> base_in_dtype_of(const FunctionalTensorImpl& impl,
                                                              const at::Tensor& self,
                                                              const Layer& layer) {
  const AliasStorage& storage = impl.alias_storage();
  const at::Tensor& base = storage.base();
  if (!layer.reapply_views || impl.chain().empty() || base.scalar_type() == self.scalar_type() ||
      base.is_conj() != self.is_conj() || base.is_neg() != self.is_neg() ||
      base.layout() != c10::kStrided || base.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      base.dim() == 0 || base.stride(-1) != 1 || storage.offset_base()) {
    return {};
  }
  std::vector<std::shared_ptr<const ViewMeta>> steps;
  if (storage.bytes()) {
    // As wrap_group's members: the bytes that make whole elements of self's dtype.
    const auto item = static_cast<int64_t>(self.itemsize());
    if (base.dim() != 1 || base.scalar_type() != c10::kByte) return {};
    const int64_t usable = base.numel() / item * item;
    if (usable != base.numel()) {
      steps.push_back(ViewMeta::as_strided({c10::SymInt(usable)}, {c10::SymInt(1)}, c10::SymInt(0),
                                           /*reapply=*/true));
    }
  } else {
    try {
      MetaComputeGuard guard;
      (void)meta_twin(base).view(self.scalar_type());  // raises where the bytes do not regroup
    } catch (const c10::Error&) {
      return {};
    }
  }
  steps.push_back(ViewMeta::of({"aten::view", "dtype"}, {c10::IValue(self.scalar_type())},
                               /*reapply=*/true));
  return steps;
}

bool check_storage_coordinates(std::string_view op_name, const FunctionalTensorImpl& impl,
                               const at::Tensor& self, const Layer& layer) {
  TORCH_CHECK_NOT_IMPLEMENTED(!impl.alias_storage().offset_base(), "functionalize: ", op_name, ": ",
                              impl.alias_storage().offset_base_reason(),
                              ", or express the view with other view ops.");
  guard_traced_input(impl.alias_storage());  // Note [Inputs: storage coordinates under a tracer]
  if (impl.chain().empty()) return true;     // self is the base
  const at::Tensor& base = impl.alias_storage().base();
  bool same = base.scalar_type() == self.scalar_type() && base.is_conj() == self.is_conj() &&
              base.is_neg() == self.is_neg();
  if (layer.reapply_views) return same;
  // Without views a _conj / _neg_view step gives a *_copy value and the wrapper no bit to compare:
  // the chain says it (x.mH.as_strided(..) would lose the conjugation).
  const auto [conj, neg] = impl.chain().bit_flips();
  same = same && !conj && !neg;
  TORCH_CHECK_NOT_IMPLEMENTED(
      same, "functionalize: ", op_name, ": as_strided of a ", self.scalar_type(),
      " view whose storage is shared with a tensor of another dtype or with conjugate/negative "
      "bits (e.g. inputs x and x.view(torch.int32), or x.conj()) is not supported with "
      "remove=\"mutations_and_views\". Clone the tensor before as_strided, or use "
      "remove=\"mutations\".");
  return true;
}

}  // namespace

// See Note [Strides: what eager gives], case "storage coordinates".
void base_in_eager_strides(FunctionalTensorImpl& impl) {
  AliasStorage& storage = impl.alias_storage();
  const auto strides = storage.eager_strides();
  if (!strides || storage.base().strides() == *strides) return;
  impl.sync_();  // set_base_ needs no queued update, and the copy must hold every write
  const at::Tensor& base = storage.base();
  at::Tensor restrided;
  {
    InnerCallGuard guard;
    restrided = restrided_copy(at::empty_strided(base.sizes(), *strides, base.options()), base);
  }
  storage.set_base_(restrided);
  impl.sync_();
}

namespace {
// Traced without views, a bool view of other bytes holds view_copy's 0 and 1, so reading its
// bytes again as another dtype would give other numbers than eager's, silently: refused by name.
// See Note [Kernel: bool views of other bytes], case "v without views".
void check_bool_bytes_read(std::string_view op_name, const FunctionalTensorImpl& impl,
                           const at::Tensor& self, const c10::OperatorHandle& view_op,
                           const std::vector<c10::IValue>& extra) {
  if (self.scalar_type() != c10::kBool || extra.empty() || !extra[0].isInt() ||
      extra[0].toScalarType() == c10::kBool || !ViewMeta::is_dtype_view(view_op) ||
      !ops_are_recorded()) {
    return;
  }
  for (const auto* step : impl.chain().steps()) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        !step->views_as_bool(), "functionalize: ", op_name,
        ": viewing a bool view of a tensor of another dtype as ", extra[0].toScalarType(),
        " is not supported in a graph without views (remove=\"mutations_and_views\" under a "
        "tracer): its value is a bool copy, whose bytes are 0 and 1 where eager reads the "
        "original bytes. Use remove=\"mutations\", or view the original tensor as ",
        extra[0].toScalarType(), " directly.");
  }
}
}  // namespace

namespace {
// Note [Graphs: views taken with the tracer set aside]
// torch sets dispatch modes aside around some of its own calls: nn.Parameter(t) is
// Tensor._make_subclass, which detaches t with every mode stashed. Inside a layer entered under
// make_fx the view kernel then runs the inner view op untraced, and the graph would hold the
// view's value as a constant (on other inputs it gives the traced inputs' numbers, silently).
// Rule: a view made while the modes the layer was entered under are set aside is marked stale, so
// its first read replays its chain from the base with the tracer back, and the graph reads a view
// of the traced base. A view taken of such a view once the tracer is back (nn.Parameter(t)
// .view(...)) syncs it first, where view ops otherwise take their self's value as it is: the
// view op would be traced on the untraced value, a constant that a saved tensor's lookup by
// memory could pick (weight_norm's saved weight_v). Views can be regenerated at no risk (that is
// what a read after a write does); other ops run with modes set aside are torch's own
// bookkeeping. Rejected: intercepting
// _make_subclass in Python (one of several regions that stash modes, and a patch of torch).
bool taken_with_tracer_set_aside(const Layer& layer) {
  return C10_UNLIKELY(layer.entered_under_modes) && !ops_are_recorded() &&
         !stashed_dispatch_modes().has_value();
}
}  // namespace

void view_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  auto* impl = self_wrapper(info, *stack, num_args);
  const at::Tensor self = (stack->end() - static_cast<std::ptrdiff_t>(num_args))->toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(
      layer.reapply_views || info.copy_op.has_value(), "functionalize: ", info.name,
      ": remove=\"mutations_and_views\" needs a *_copy variant of this view op and torch has "
      "none. Use remove=\"mutations\".");
  // torch implements *_copy ops for strided tensors; a sparse self (_indices, _values of a sparse
  // gradient) has no kernel there, and the error would name only torch's backend key.
  TORCH_CHECK_NOT_IMPLEMENTED(
      layer.reapply_views || self.layout() == c10::kStrided ||
          info.copy_op->hasKernelForDispatchKey(
              c10::computeDispatchKey(std::nullopt, self.layout(), self.device())),
      "functionalize: ", info.name, " of a ", self.layout(),
      " tensor: remove=\"mutations_and_views\" needs its *_copy variant, which torch implements "
      "for strided tensors only. Use remove=\"mutations\".");
  auto extra = args_after_self(*stack, num_args);
  if (info.replay_arg_count >= 0) extra.resize(info.replay_arg_count);
  const c10::OperatorHandle& view_op = *info.view_op;  // `op`, or its replay substitute
  std::optional<c10::IValue> reference;
  if (!layer.reapply_views) {
    check_bool_bytes_read(info.name, *impl, self, view_op, extra);
    reference = meta_reference(view_op, self, extra);
  }

  // See Note [Strides: what eager gives], case "storage coordinates".
  if (is_as_strided(view_op) && !layer.reapply_views) base_in_eager_strides(*impl);
  bool from_base = is_as_strided(view_op) &&
                   check_storage_coordinates(info.name, *impl, self, layer) &&
                   !impl->chain().empty();
  // See base_in_dtype_of: the base, reinterpreted in self's dtype, then the step.
  auto dtype_steps = is_as_strided(view_op) && !from_base
                         ? base_in_dtype_of(*impl, self, layer)
                         : std::vector<std::shared_ptr<const ViewMeta>>{};
  from_base = from_base || !dtype_steps.empty();
  if (from_base) {
    impl->sync_();  // the base must be current: the step reads it directly
    // Eager's default offset is self's own; on the base it would be the base's (0).
    if (extra.size() >= 3 && extra[2].isNone()) extra[2] = c10::IValue(self.sym_storage_offset());
  }
  // See Note [Graphs: views taken with the tracer set aside].
  if (C10_UNLIKELY(impl->marked_stale()) && !taken_with_tracer_set_aside(layer)) impl->sync_();
  InnerCallGuard guard;
  torch::jit::drop(*stack, num_args);
  at::Tensor start = from_base ? impl->alias_storage().base() : impl->value();
  for (const auto& s : dtype_steps) start = s->forward(start);
  if (!layer.reapply_views) start = ViewMeta::copy_input(view_op, start);
  torch::jit::push(*stack, std::move(start));
  // The step keeps tensor arguments (_make_dual's tangent) as values: it replays under an inner
  // call, where a wrapper would be refused.
  for (auto& a : extra) {
    transform_tensors(a, sync_and_unwrap);
    torch::jit::push(*stack, a);
  }
  std::optional<at::Tensor> kept_bytes;
  if (!layer.reapply_views && !extra.empty() && extra[0].isInt()) {
    kept_bytes = ViewMeta::bool_view_keeping_bytes(
        view_op, (stack->end() - 1 - extra.size())->toTensor(), extra[0]);
  }
  if (kept_bytes) {
    torch::jit::drop(*stack, extra.size() + 1);
    torch::jit::push(*stack, *std::move(kept_bytes));
  } else if (layer.reapply_views) {
    ViewMeta::call_view_op(view_op, stack);
  } else if (C10_UNLIKELY(
                 reference && reference->isTensor() && impl->value()._is_zerotensor() &&
                 impl->value().unsafeGetTensorImpl()->autograd_meta() == nullptr &&
                 std::none_of(extra.begin(), extra.end(),
                              [](const c10::IValue& a) { return a.isTensor(); }) &&
                 !reference->toTensor().unsafeGetTensorImpl()->has_symbolic_sizes_strides())) {
    // A view of an efficient zero tensor without autograd (one with a history or a tangent, or
    // a view op taking a tensor such as _make_dual's, keeps the *_copy's) is a zero tensor of the
    // view's size: torch's ZeroTensor fallback would
    // materialize the *_copy with an expand. See Note [Kernel: efficient zero tensors].
    torch::jit::drop(*stack, extra.size() + 1);
    torch::jit::push(
        *stack, at::_efficientzerotensor(reference->toTensor().sizes(), impl->value().options()));
  } else {
    try {
      ViewMeta::call_view_op(*info.copy_op, stack);
    } catch (const c10::Error& error) {
      // torch gives some *_copy ops no derivative (view_as_complex_copy of a tensor that requires
      // grad: Meta-Llama's rotary embedding); its error names neither us nor a way out.
      const std::string_view what = error.what_without_backtrace();
      if (what.find("does not support automatic differentiation") == std::string_view::npos) throw;
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, "functionalize: ", info.name,
          " of a tensor that requires grad is not supported "
          "with remove=\"mutations_and_views\": torch has no derivative for its *_copy variant (",
          info.copy_op->operator_name(), ") here. Use remove=\"mutations\".");
    }
  }

  c10::IValue out = torch::jit::pop(*stack);
  auto make_step = [&](int64_t out_index) {
    return std::make_shared<const ViewMeta>(view_op, info.copy_op, extra, out_index,
                                            layer.reapply_views, info.inverse);
  };
  if (out.isTensor()) {
    auto step = make_step(-1);
    auto wrapper = make_view_wrapper(out.toTensor(), self, step);
    // See Note [Kernel: as_strided without views].
    if (from_base) {
      dtype_steps.push_back(std::move(step));
      unsafe_get_impl(wrapper)->set_chain_from_base_(std::move(dtype_steps));
    }
    if (reference) set_reference(wrapper, reference->toTensor());
    if (taken_with_tracer_set_aside(layer)) unsafe_get_impl(wrapper)->mark_stale_();
    torch::jit::push(*stack, std::move(wrapper));
    return;
  }
  auto views = out.toTensorList();
  c10::List<at::Tensor> wrapped;
  wrapped.reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    auto wrapper = make_view_wrapper(views.get(i), self, make_step(static_cast<int64_t>(i)));
    if (reference) set_reference(wrapper, reference->toTensorList().get(i));
    if (taken_with_tracer_set_aside(layer)) unsafe_get_impl(wrapper)->mark_stale_();
    wrapped.push_back(std::move(wrapper));
  }
  torch::jit::push(*stack, std::move(wrapped));
}

void inplace_view_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                         torch::jit::Stack* stack, const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  auto* impl = self_wrapper(info, *stack, num_args);
  c10::IValue self = *(stack->end() - static_cast<std::ptrdiff_t>(num_args));
  auto extra = args_after_self(*stack, num_args);
  std::optional<c10::IValue> reference;
  if (!layer.reapply_views) reference = meta_reference(*info.view_op, self.toTensor(), extra);
  // x.as_strided_(...) reads storage coordinates like as_strided: taken from the storage's base
  // for the same reasons (Note [Kernel: as_strided without views]); without views, a second
  // as_strided_ on the first one's *_copy would fail out of bounds. The
  // chain becomes that one step, as after resize_.
  static const c10::OperatorName as_strided_inplace{"aten::as_strided_", ""};
  const bool as_strided_ = op.operator_name() == as_strided_inplace;
  // See Note [Strides: what eager gives], case "storage coordinates".
  if (as_strided_ && !layer.reapply_views) base_in_eager_strides(*impl);
  const bool same =
      as_strided_ && check_storage_coordinates(info.name, *impl, self.toTensor(), layer);
  // See base_in_dtype_of: a view of another dtype than its base's, with views kept (as_strided_
  // of x.view(torch.int32) reaching elements x does not cover).
  auto prefix = as_strided_ && !same ? base_in_dtype_of(*impl, self.toTensor(), layer)
                                     : std::vector<std::shared_ptr<const ViewMeta>>{};
  if ((same || !prefix.empty()) && (!layer.reapply_views || !impl->chain().empty())) {
    impl->sync_();
    const at::Tensor& t = self.toTensor();
    const c10::SymInt offset =
        extra.size() >= 3 && !extra[2].isNone() ? extra[2].toSymInt() : t.sym_storage_offset();
    auto step = ViewMeta::as_strided(extra[0].toSymIntVector(), extra[1].toSymIntVector(), offset,
                                     layer.reapply_views);
    impl->resize_chain_(std::move(step), {MetadataMutation{op, std::move(extra)}},
                        std::move(prefix));
    if (reference) impl->set_reference_metadata_(reference->toTensor());
    torch::jit::drop(*stack, num_args);
    torch::jit::push(*stack, std::move(self));
    return;
  }
  auto step = std::make_shared<const ViewMeta>(*info.view_op, info.copy_op, extra, -1,
                                               layer.reapply_views, info.inverse);
  impl->mutate_view_meta_(std::move(step), MetadataMutation{op, std::move(extra)});
  if (reference) impl->set_reference_metadata_(reference->toTensor());
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, std::move(self));
}

}  // namespace tfz::detail
