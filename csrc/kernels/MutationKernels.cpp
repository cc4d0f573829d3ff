// In-place, out= and mutable ops on wrappers: call the functional variant on inner values, then
// replace each written wrapper's value, commit it to its alias storage and sync it. The checks
// before a write are in WriteChecks.cpp, out= geometry and dtype in OutArguments.cpp, writes to
// bool views of wider bytes in BoolViewWrites.cpp. See Note [Schema: argument plan].
#include "kernels/Handlers.h"

#include "kernels/CallerMemoryWrites.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/FunctorchInterop.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/Recorder.h"
#include "kernels/RandomFills.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <algorithm>
#include <array>
#include <string_view>

namespace tfz::detail {

namespace {

using Stack = torch::jit::Stack;

// Calls fn(wrapper, new_value) for each tensor written through argument `target`.
template <typename Fn>
void zip_written(const c10::IValue& target, const c10::IValue& new_value, Fn&& fn) {
  if (target.isTensor()) {
    if (target.toTensor().defined()) fn(target.toTensor(), new_value.toTensor());
    return;
  }
  if (target.isNone()) return;
  std::vector<at::Tensor> olds, news;
  for_each_tensor(target, [&](const at::Tensor& t) { olds.push_back(t); });
  for_each_tensor(new_value, [&](const at::Tensor& t) { news.push_back(t); });
  TORCH_INTERNAL_ASSERT(olds.size() == news.size(), "functional variant returned ", news.size(),
                        " tensors for ", olds.size(), " written tensors");
  for (size_t i = 0; i < olds.size(); ++i) fn(olds[i], news[i]);
}

}  // namespace

c10::IValue functional_arg(const ArgSource& src, const c10::Argument& schema_arg,
                           const std::vector<c10::IValue>& args, const at::Tensor& first_out) {
  switch (src.kind) {
    case ArgSource::FromMutableArg:
      return args[src.index];
    // See Note [Kernel: out= of another dtype], case "reductions".
    case ArgSource::FromMutableArgOrOutDtype:
      return args[src.index].isNone() && first_out.defined() ? c10::IValue(first_out.scalar_type())
                                                             : args[src.index];
    case ArgSource::OutDtype:
      return first_out.defined() ? c10::IValue(first_out.scalar_type()) : c10::IValue();
    case ArgSource::OutLayout:
      return first_out.defined() ? c10::IValue(first_out.layout()) : c10::IValue();
    case ArgSource::OutDevice:
      return first_out.defined() ? c10::IValue(first_out.device()) : c10::IValue();
    case ArgSource::None:
      return c10::IValue();
    case ArgSource::Default:
      return schema_arg.default_value() ? *schema_arg.default_value() : c10::IValue();
  }
  return c10::IValue();
}

// not (a tracer or a transform pushed inside the layer, a Python key or functorch wrapper on the
// value): what is done to it cannot appear in a graph.
bool nothing_records(const at::Tensor& value) {
  if (ops_are_recorded() ||
      c10::impl::tls_local_dispatch_key_set().included_.has_any(functorch_mode_keys())) {
    return false;
  }
  static const auto wrapped_value_keys =
      c10::python_ks | c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper});
  return !value.requires_grad() && !value.key_set().has_any(wrapped_value_keys);
}

// Note [Kernel: in-place on the inner value]
// The functional form of x.add_(1) allocates a new tensor for every write: on large tensors that
// is twice eager's memory traffic (measured: large/inplace at 2.2x eager). When nothing but the
// wrapper can observe its inner value, running the in-place op on that value gives the same
// result without the allocation. "Nothing can observe it" means all of:
//   - no tracer or tensor subclass is recording ops (no dispatch mode on the thread's stack, no
//     Python key on the value, no torch.func transform): a graph must stay functional;
//   - the wrapper is a base (no view chain, no metadata mutation), up to date, with no update
//     queued, and no other wrapper shares its alias storage (so no view of it is alive);
//   - the value is referenced only by the wrapper and as its storage's base (so not an input's
//     own tensor, whose caller holds it, nor an output of autograd's saved variables), its
//     memory is shared with no other tensor, and it does not require grad.
// Then the op runs as called on the value and the value becomes the storage's new base. If it
// raises (eager's shape and dtype rules raise before writing), the functional path runs instead
// and raises the same rule under the op's name. Anything else takes the functional path.
// Rejected: reusing the allocation of the functional result via an out= variant (add.out into the
// old value): the same conditions are needed, and not every op has an out= variant.
bool can_write_inner_in_place(const at::Tensor& wrapper) {
  auto* impl = maybe_get_impl(wrapper);
  if (impl == nullptr || !impl->chain().empty() || impl->has_metadata_mutation()) return false;
  const auto& storage = impl->alias_storage();
  if (storage.has_pending_updates() || !impl->is_up_to_date() ||
      wrapper.storage().use_count() != 1) {
    return false;
  }
  const at::Tensor& value = impl->value();
  return nothing_records(value) &&
         value.unsafeGetTensorImpl() == storage.base().unsafeGetTensorImpl() &&
         value.use_count() == 2 && value.has_storage() && value.storage().use_count() == 1;
}

void commit_written_in_place(const at::Tensor& wrapper, bool counts_version) {
  unsafe_get_impl(wrapper)->commit_update_(counts_version);
}

// Note [Kernel: writes to inputs under autograd]
// x.mul_(w) on an input x, with w requiring grad: eager's autograd kernel of mul_ clones x's old
// value before the write and saves the clone for backward (x itself is about to change). Our
// functional mul(x, w) runs on x's inner value, which for an input is the caller's tensor (or,
// with views kept, a view of it), and autograd saves that; the epilogue's copy_ then overwrites
// it, and backward refuses the saved tensor as "modified by an inplace operation" (as
// torch.func.functionalize's does). So when an in-place op's self lies in the caller's memory,
// grad mode is on and an argument requires grad, the functional variant reads a clone of self:
// eager's copy, at eager's cost. A value computed inside f never needs this: nothing overwrites
// it (Note [Kernel: in-place on the inner value] checks that no saved reference exists).
// Rejected: cloning only for ops whose backward reads self (nothing at runtime says which do;
// counting references to spot a SavedVariable misses saved-tensor hooks, which pack elsewhere),
// and giving an input's inner value a version counter of its own (the saved tensor would then
// silently read the values the epilogue wrote: wrong gradients instead of an error).
bool reads_input_under_autograd(const at::Tensor& wrapper, const at::Tensor& self_inner) {
  return unsafe_get_impl(wrapper)->alias_storage().in_caller_storage(self_inner) &&
         c10::GradMode::is_enabled();
}

// Note [Kernel: writes of no element]
// A write into a tensor with no element (v[1:1].cumsum_(0), an empty narrow of an expanded input)
// changes nothing in eager. Committed like any write, its view inverse would still run: expand's
// sums the written view over the expanded dimension, so an empty write through x.expand(3) would
// triple x. Such a write is dropped: no commit, no generation, no epilogue copy.
// Rejected: teaching each view inverse about empty writes (every inverse would need the case).
// The written tensor's strides: Note [Strides: what eager gives], case "written base".
void write_back(const at::Tensor& wrapper, const at::Tensor& value_in, bool counts_version,
                std::string_view op_name) {
  auto* impl = unsafe_get_impl(wrapper);
  if (!wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && wrapper.numel() == 0 &&
      wrapper.sym_sizes() == value_in.sym_sizes()) {
    return;
  }
  at::Tensor value = value_in;
  if (!wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      !value.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      wrapper.sizes() != value.sizes()) {
    const Layer* layer = suspended_layer();  // write_back runs under the kernel's InnerCallGuard
    TORCH_INTERNAL_ASSERT(layer != nullptr && layer->id == impl->layer_id(),
                          "out= resize outside the wrapper's layer");
    const bool dense = value.layout() == c10::kStrided && value.is_non_overlapping_and_dense();
    resize_functional(op_name, wrapper, value.sizes().vec(), c10::IValue(), *layer,
                      dense ? value.strides() : c10::IntArrayRef(),
                      /*overwritten=*/true, counts_version);
  }
  if (impl->chain().empty() && same_sizes_other_strides(wrapper, value)) {
    value = restrided_copy(at::empty_strided(wrapper.sizes(), wrapper.strides(),
                                             value.options().dtype(wrapper.scalar_type())),
                           value);
  } else if (impl->chain().empty() && suspended_layer() != nullptr &&
             suspended_layer()->reapply_views) {
    value = with_size_one_strides_of(wrapper, value);
  }
  impl->replace_(value);
  impl->commit_update_(counts_version);
  impl->sync_();
}

namespace {

// See Note [Kernel: custom mutable ops]: write_back bumped a written wrapper once per argument it
// was passed as; the clone the op wrote (one per distinct tensor) counted every bump of the call.
void bump_as_the_call_did(const OpInfo& info, const std::vector<c10::IValue>& args,
                          const torch::jit::Stack& results) {
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (wrapper, clone)
  for (const auto& w : info.written) {
    zip_written(args[w.index], results[w.functional_return],
                [&](const at::Tensor& t, const at::Tensor& v) { written.emplace_back(t, v); });
  }
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& [t, v] = written[i];
    auto* impl = t.unsafeGetTensorImpl();
    if (!v.defined() || !impl->version_counter().enabled()) continue;
    bool first = true;
    uint32_t written_back = 0;
    for (size_t j = 0; j < written.size(); ++j) {
      if (!written[j].second.is_same(v)) continue;
      first = first && j >= i;
      ++written_back;
    }
    if (!first) continue;
    for (uint32_t k = written_back; k < v._version(); ++k) impl->bump_version();
  }
}

// See Note [Schema: argument plan] for the plan this follows.
void run_mutable(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                 const Layer& layer, bool on_wrappers) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t num_returns = schema.returns().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  torch::jit::drop(*stack, num_args);
  // Every written tensor must be ours: a plain tensor cannot receive a functional value.
  at::Tensor first_out;
  for (const auto& w : info.written) {
    for_each_tensor(args[w.index], [&](const at::Tensor& t) {
      check_writable(info.name, schema.arguments()[w.index].name(), t);
      if (w.is_out && !first_out.defined()) first_out = t;
    });
  }
  const auto& fschema = info.functional_op->schema();
  Stack fstack;
  fstack.reserve(info.functional_args.size());
  auto push_functional_args = [&](const std::vector<c10::IValue>& from) {
    for (size_t i = 0; i < info.functional_args.size(); ++i) {
      fstack.push_back(
          functional_arg(info.functional_args[i], fschema.arguments()[i], from, first_out));
    }
  };
  bool filled = false;  // See Note [Kernel: random fills of strided tensors].
  if (on_wrappers && C10_UNLIKELY(info.seeded)) {
    InnerCallGuard guard;
    std::vector<c10::IValue> inner = args;
    for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
    if (auto value = random_fill_in_memory_order(info, op, args, inner, layer.reapply_views)) {
      fstack.emplace_back(std::move(*value));
      filled = true;
    }
  }
  if (on_wrappers && !filled) {
    {
      PythonUnhiddenGuard unhidden;
      push_functional_args(args);
      info.functional_op->callBoxed(fstack);
    }
    for (auto& v : fstack) transform_tensors(v, sync_and_unwrap);
  }
  InnerCallGuard guard;
  if (on_wrappers && !filled && ops_are_recorded()) {
    out_results_in_eager_strides(info, op, args, fstack, layer.reapply_views);
  }
  if (!on_wrappers) {
    std::vector<c10::IValue> inner = args;
    for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
    for (const auto& w : info.written) {  // See Note [Kernel: writes to inputs under autograd].
      if (w.is_out || !inner[w.index].isTensor()) continue;
      const at::Tensor& self = inner[w.index].toTensor();
      if (C10_UNLIKELY(self.defined() &&
                       reads_input_under_autograd(args[w.index].toTensor(), self))) {
        bool any_requires_grad = false;
        for (const auto& v : inner) {
          for_each_tensor(v, [&](const at::Tensor& t) { any_requires_grad |= t.requires_grad(); });
        }
        if (any_requires_grad) inner[w.index] = at::clone(self);
      }
    }
    if (auto value = random_fill_in_eager_order(info, op, args, inner)) {
      fstack.emplace_back(std::move(*value));
    } else if (auto filled =
                   random_fill_in_memory_order(info, op, args, inner, layer.reapply_views)) {
      // The draw order was measured on the traced tensor's strides, which may follow an input's
      // (dropout's mask of a transposed x). See
      // Note [Inputs: storage coordinates under a tracer].
      if (traced_without_guards()) {
        record_layout_guard(inner[info.written[0].index].toTensor(),
                            "the tensor " + std::string(op.operator_name().name) + " fills");
      }
      fstack.emplace_back(std::move(*filled));
    } else if (auto bytes = write_bool_bytes_in_place(info, op, args, inner, layer)) {
      fstack.emplace_back(std::move(*bytes));
    } else {
      check_whole_elements_for_clone(info, inner);
      push_functional_args(inner);
      if (C10_LIKELY(!copy_with_tangent(info, inner, fstack)))
        info.functional_op->callBoxed(fstack);
      differentiate_rrelu_through_its_noise(info, op, inner, fstack);
      differentiate_copy(info, inner, fstack);
      rerun_out_eagerly(info, op, args, inner, fstack);
      // Untraced without views, the rerun above reads values that may not be in their reported
      // geometry (an expanded view's *_copy is materialized): torch.abs(x.as_strided(.., (1, 0,
      // 1)), out=y) would resize y contiguous where eager follows the expanded input. Then the
      // correction of Note [Strides: what eager gives], case "resized out=", applies untraced
      // too; out_results_in_eager_strides returns at once unless out is resized.
      if (C10_UNLIKELY(ops_are_recorded() ||
                       (!layer.reapply_views &&
                        std::any_of(args.begin(), args.end(), reports_eager_strides_of_results)))) {
        out_results_in_eager_strides(info, op, args, fstack, layer.reapply_views);
      }
    }
  }

  // Check every write before changing anything, so a failing one leaves all inputs untouched.
  for (const auto& w : info.written) {
    zip_written(args[w.index], fstack[w.functional_return],
                [&](const at::Tensor& t, const at::Tensor& v) {
                  check_eager_rules(info.name, t, v, /*resizes=*/w.is_out || info.resizes_written);
                });
  }
  // See Note [Schema: out= of the same number of elements].
  if (info.out_keeps_shape_of_same_numel && fstack.size() == 1 && fstack[0].isTensor()) {
    const at::Tensor out = args[info.written.front().index].toTensor();
    const at::Tensor value = fstack[0].toTensor();
    if (out.sym_numel() == value.sym_numel() && out.sym_sizes() != value.sym_sizes()) {
      fstack[0] = at::view_copy_symint(value, out.sym_sizes());  // results are contiguous
    }
  }
  // After the functional call, so that eager's own errors (list lengths, shapes) come first.
  check_no_read_of_written_memory(info, schema, args, &fstack);
  for (const auto& w : info.written) {
    zip_written(args[w.index], fstack[w.functional_return],
                [&](const at::Tensor& t, const at::Tensor& v) {
                  write_back(t, v, info.bumps_versions, info.name);
                });
  }
  if (C10_UNLIKELY(info.versions_counted_on_results) && info.bumps_versions) {
    bump_as_the_call_did(info, args, fstack);
  }

  for (size_t i = 0; i < num_returns; ++i) {
    if (info.return_aliases[i] >= 0) {
      torch::jit::push(*stack, args[info.return_aliases[i]]);
    } else {
      c10::IValue fresh = std::move(fstack[i]);
      transform_tensors(fresh,
                        [&](const at::Tensor& t) { return make_fresh_wrapper(t, layer.id); });
      torch::jit::push(*stack, std::move(fresh));
    }
  }
}

}  // namespace

void mutable_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                    const Layer& layer) {
  // See Note [Undo: writes into the caller's memory].
  if (write_into_caller_memory(info, op, stack, layer)) return;
  // See Note [Kernel: writes into captured tensors].
  if (C10_UNLIKELY(write_captured_eagerly(info, op, stack, layer))) return;
  // See Note [Kernel: out= of another dtype], case "composites in graphs". (The schema test first:
  // in-place ops, the common case, skip the TLS reads.)
  if (info.written.size() == 1 && info.written[0].is_out && C10_UNLIKELY(ops_are_recorded())) {
    if (const auto composite = composite_out_of_another_dtype(info, op, *stack)) {
      if (composite->resize_to) {
        const size_t num_args = op.schema().arguments().size();
        const at::Tensor out =
            (*stack)[stack->size() - num_args + info.written[0].index].toTensor();
        resize_functional(info.name, out, *composite->resize_to, c10::IValue(), layer, {},
                          /*overwritten=*/true);
      }
      op.callBoxedForDispatchKey(composite->key, *stack);
      return;
    }
  }
  run_mutable(info, op, stack, layer, /*on_wrappers=*/false);
}

void mutable_kernel_on_wrappers(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                                const Layer& layer) {
  run_mutable(info, op, stack, layer, /*on_wrappers=*/true);
}

}  // namespace tfz::detail