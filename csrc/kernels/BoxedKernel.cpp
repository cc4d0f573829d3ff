// The boxed kernel every operator reaches on wrappers: the escaped-wrapper check, the
// pass-through and factory cases, the dispatch to the special row's or the generic handler, and
// the functional-op handler. Views and mutations have their own files.
#include "kernels/Registration.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layout.h"
#include "core/Recorder.h"
#include "kernels/CallRoute.h"
#include "kernels/Subclasses.h"
#include "kernels/WatchedDraws.h"

#include <ATen/LegacyVmapMode.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <string_view>

namespace tfz::detail {

// Note [Kernel: factories]
// Ops with no tensor arguments (torch.zeros, at::arange, torch::ones, ...) reach us inside a layer
// at the factory key (Note [Which dispatch key]); their outputs are wrapped so that later
// mutations of them are removed too. lift / lift_fresh (behind torch.tensor(...) constants) are
// wrapped even though their argument is a plain tensor. Any other op whose tensors are all plain
// (tensors from outside the function) passes through untouched, with the layer's TLS undone,
// like torch.func.functionalize does.
// Rejected: leaving factory results plain like every other all-plain result: a buffer the
// function allocates and then fills (torch.zeros(n), then index_put_ or add_) would keep its
// in-place ops in the program.

void wrap_outputs(torch::jit::Stack* stack, size_t count, int64_t layer_id) {
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(count); it != stack->end(); ++it) {
    transform_tensors(*it, [&](const at::Tensor& t) { return make_fresh_wrapper(t, layer_id); });
  }
}

// Note [Control flow: closures]
// A branch of a higher-order operator traced under make_fx runs in a layer of its own
// (Note [Control flow: higher-order operators]), so a tensor of the enclosing function that the
// branch closes over is a wrapper of another layer there. Such a layer lifts closures: the first
// op that meets an enclosing wrapper records it (note_foreign_wrapper) and raises; the operator's
// kernel (control_flow.py) catches that, passes the wrapper's value to the operator as one more
// trailing operand, and traces again, with the branch layer's wrapper of that operand standing
// in for the enclosing wrapper in every op the branch runs (Layer::substitutes, applied here on
// the boxed stack; the unboxed kernels send such calls here). The graph then reads the closure as
// a subgraph input, as dynamo's lifting gives plain make_fx. Rejected: a constant in the
// subgraph (what make_fx's own reentrant tracing does with a closure: the value of the trace,
// silently wrong on other inputs); finding closures by inspecting the branch's Python closure
// cells and globals (misses tensors reached through objects, and dynamo's bytecode analysis is
// not ours to run on wrappers).
bool lifts_closures(const Layer* layer) {
  return layer != nullptr && layer->lifts_closures;
}

void substitute_closures(const Layer& layer, torch::jit::Stack* stack, size_t num_args) {
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    transform_tensors(*it, [&](const at::Tensor& t) {
      const auto* impl = maybe_get_impl(t);
      if (impl == nullptr || impl->layer_id() == layer.id) return t;
      const at::Tensor* s = substitute_for(layer, impl);
      return s != nullptr ? *s : t;
    });
  }
}

void report_foreign_wrapper(std::string_view op_name, const FunctionalTensorImpl& impl,
                            const Layer* layer) {
  if (lifts_closures(layer)) {
    note_foreign_wrapper(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
        const_cast<FunctionalTensorImpl*>(&impl))));
    TORCH_CHECK(false, "functionalize: ", op_name,
                ": a branch of a higher-order operator traced under make_fx uses a tensor of an "
                "enclosing functionalized function (a closure) that could not be passed to the "
                "operator as an operand. Pass it as an operand.");
  }
  const Layer* suspended = suspended_layer();
  const bool inner_call =
      layer == nullptr && suspended != nullptr && impl.layer_id() == suspended->id;
  // torch.autograd.functional's vectorize=True runs torch's legacy vmap, whose batching rules run
  // below our key, on the wrappers its batched tensors hold.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(inner_call && at::impl::VmapMode::current_vmap_level() > 0), "functionalize: ", op_name,
      ": torch's legacy vmap (torch.autograd.functional.jacobian or hessian with "
      "vectorize=True and a forward-mode strategy) runs its batching rules below functionalize, "
      "on functional tensors. Use torch.func.jacfwd or hessian inside the function, or the "
      "default reverse-mode strategy");
  TORCH_CHECK(!inner_call, "functionalize: ", op_name,
              ": a functional tensor reached an op the engine runs on plain tensors (an inner "
              "call); some code captured a wrapper into it (e.g. a kernel or hook holding a "
              "tensor from inside the function). Pass such tensors as arguments instead.");
  // See Note [Layer: threads that carry a layer's TLS]
  TORCH_CHECK(!(layer == nullptr && c10::impl::tls_is_dispatch_key_included(kAutogradKey)),
              "functionalize: ", op_name,
              ": a functional tensor reached a thread that carries a functionalize call's "
              "dispatch state (autograd's device thread for CUDA tensors, or code that moves work "
              "with at::ThreadLocalStateGuard) while not exactly one functionalize call is active "
              "in the process, so it cannot tell which call the tensor belongs to. Run one "
              "functionalize call at a time when its function calls backward() on CUDA tensors.");
  TORCH_CHECK(false, "functionalize: ", op_name,
              ": got a functional tensor that escaped the functionalize call that made it "
              "(that call has finished, or this is another call). Return tensors from the "
              "function instead of storing them elsewhere; outputs are unwrapped for you. State "
              "an object keeps across calls (an optimizer made outside the function, whose first "
              "step inside it made its state) must exist before the call: make it outside (one "
              "eager step), or make the object inside the function.");
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

// Note [Kernel: views of captured tensors]
// With remove="mutations_and_views" every view in the program must become its *_copy, including
// views of tensors the function captures instead of taking as arguments (a module's parameters
// inside model(x): w.t() in linear, buffers, globals). Such a call has only plain arguments, so
// it would pass through and leave aten.t on the parameter in the graph. Instead the viewed tensor
// is lifted into a fresh wrapper for this call and the view runs as on any wrapper: the graph
// gets t_copy(w), and the result reports eager's strides. Eager lets a write through that view
// reach w: the lifted storage is marked captured, and a write through it is eager's write into w
// when the call runs eagerly (Note [Kernel: writes into captured tensors]), refused with an error
// naming the op (check_writable) under a tracer or a capture, never lost. Rejected: running the
// *_copy op and returning a plain tensor (simplest, but a later in-place op on it would silently
// not reach w); writing captured tensors back at the end like inputs (a side effect on the module
// that no graph input or output carries).
void lift_captured_self(const c10::OperatorHandle& op, torch::jit::Stack* stack, Layer& layer) {
  auto& self = *(stack->end() - static_cast<std::ptrdiff_t>(op.schema().arguments().size()));
  at::Tensor lifted = make_fresh_wrapper(self.toTensor(), layer.id);
  unsafe_get_impl(lifted)->alias_storage().mark_captured();
  remember_captured_storage(layer, lifted.storage());
  self = std::move(lifted);
}

// See Note [Autograd: saved outputs under a tracer]: a backward formula's op on its saved tensors
// alone (the t() of a saved weight, the unsqueeze of a saved norm) must read the traced tensors.
void read_traced_saved_outputs(torch::jit::Stack* stack, size_t num_args) {
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    transform_tensors(*it, [](const at::Tensor& t) { return sync_and_unwrap(t); });
  }
}

namespace {
// The Plain and PlainUntraced routes: an op none of whose arguments is a wrapper of ours.
void run_on_plain_tensors(const KernelPlan& plan, const c10::OperatorHandle& op,
                          torch::jit::Stack* stack, Layer* layer, Route route) {
  const OpInfo& info = plan.info;
  const size_t num_args = op.schema().arguments().size();
  if (layer != nullptr && !layer->reapply_views && info.kind == OpKind::View &&
      !info.wraps_plain_outputs) {  // lift_fresh wraps, below
    if (C10_UNLIKELY(ops_are_recorded())) read_traced_saved_outputs(stack, num_args);
    lift_captured_self(op, stack, *layer);
    return view_kernel(info, op, stack, *layer);
  }
  if (route == Route::PlainUntraced) {
    // Below our keys with Python still hidden. See Note [Layer: torch's untraced regions].
    MetaComputeGuard guard;
    return op.callBoxed(stack);
  }
  if (plan.special != nullptr && plan.special->handle == &collective_kernel) {
    check_plain_collective(op);  // See Note [Collectives: captured tensors]
  }
  const bool wrap = layer != nullptr && info.wraps_plain_outputs;
  if (C10_UNLIKELY(layer != nullptr && ops_are_recorded())) {
    // See Note [Autograd: formula temporaries written in place].
    if (info.kind == OpKind::Mutable && write_formula_temporary(info, op, stack)) return;
    read_traced_saved_outputs(stack, num_args);
  }
  {
    InnerCallGuard guard;
    op.callBoxed(stack);
  }
  if (wrap) {
    wrap_outputs(stack, op.schema().returns().size(), layer->id);
  } else if (C10_UNLIKELY(layer != nullptr && ops_are_recorded())) {
    // See Note [Autograd: saved outputs under a tracer], the create_graph case.
    const size_t num_returns = op.schema().returns().size();
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end();
         ++it) {
      for_each_tensor(*it, note_traced_plain_output);
    }
  }
}
}  // namespace

// Note [Kernel: efficient zero tensors]
// Forward-mode AD gives an undefined tangent as an efficient zero tensor (_efficientzerotensor: no
// storage, the ZeroTensor bit), and torch's ZeroTensor kernels, below our key, implement ops on
// them as compositions: add(zero, t) is _to_copy(t.expand(size)), and the fallback materializes a
// zero as zeros({}).expand(size). Run on inner values, those are views we never see: with
// remove="mutations_and_views", jvp / jacfwd / hessian inside a layer would leave aten.expand in
// the graph. So a wrapper mirrors its value's ZeroTensor bit, as it mirrors the conjugate bit:
// See Note [Wrapper: mirrored conjugate and negative bits]
// and an op reaching our autograd key with that bit among its keys is sent, still on wrappers, to
// the ZeroTensor kernel and from there to our backend key: its expand and _to_copy calls come back
// to us as ops on wrappers (expand becomes expand_copy), and its redispatch arrives with the bit
// gone (ks lacks ZeroTensor), so nothing loops. The values are eager's: the same ZeroTensor kernels
// run, one level up. Writing to a zero tensor gets the kernel's own "ZeroTensors are immutable"
// error, as in eager. View ops are the exception: torch's ZeroTensor key runs its native view
// kernels, which build the view from self's own key set, so a view of a zero wrapper came back
// as a plain tensor carrying our keys, which no kernel of ours could unwrap, and any op on it
// re-entered our kernel until the stack overflowed (vmap(jacfwd(f)) of f(x) = x * 2.0). They
// take the view kernel like any view: its inner view of the zero value is torch's own, and
// without views (where the *_copy variant would be materialized by the ZeroTensor fallback with
// an expand) a new zero tensor of the view's size.
// Rejected: materializing zero tensors when they are wrapped (zeros would make 0 * inf give NaN
// where a zero tensor gives 0, and -0.0 + 0 give +0.0); rewriting the traced graph afterwards
// (the run without a tracer would still differ from the traced one).
void run_boxed_kernel(const KernelPlan& plan, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                      torch::jit::Stack* stack) {
  // See Note [Kernel: one route into every call] for the order of the routes below.
  Layer* layer = current_layer();
  if (const auto early = route_before_scan(layer)) {
    if (*early == Route::Autograd) return call_autograd_kernel(op, ks, stack);
    PythonUnhiddenGuard unhidden;  // the tracer's dispatch needs the Python key enabled
    // Through PythonTLSSnapshot, which records the TLS the Python key's fallback asserts on in
    // torch 2.11 ("tls_on_entry.has_value()"), as every op reaching the Python key from below it.
    return op.redispatchBoxed(
        c10::DispatchKeySet({c10::DispatchKey::PythonTLSSnapshot, c10::DispatchKey::Python}),
        stack);
  }
  const OpInfo& info = plan.info;
  const size_t num_args = op.schema().arguments().size();
  // See Note [Graphs: generator state set outside the dispatcher] (generator_watch.py).
  std::optional<WatchedDraw> watched;
  if (C10_UNLIKELY(info.seeded) && layer != nullptr) watched.emplace(info, op, *stack);
  if (C10_UNLIKELY(lifts_closures(layer) && !layer->substitutes.empty())) {
    substitute_closures(*layer, stack, num_args);
  }
  ArgScan scan(layer);
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    for_each_tensor(*it, [&](const at::Tensor& t) { scan.scan(t); });
  }
  const Route route = route_after_scan(
      scan, ks, layer, [&] { return std::string_view(info.name); }, info.kind == OpKind::View);
  switch (route) {
    case Route::LiftClosure:
      // A closure not substituted above: noted for the caller's retry with it lifted.
      report_foreign_wrapper(info.name, *scan.foreign(), layer);
    case Route::Subclass: {  // See Note [Kernel: wrapper subclasses]
      SubclassCallGuard guard;
      return op.redispatchBoxed(subclass_dispatch_keys(ks), stack);
    }
    case Route::ZeroTensor:  // See Note [Kernel: efficient zero tensors].
      return op.redispatchBoxed(zero_tensor_keys(), stack);
    case Route::Plain:
    case Route::PlainUntraced:
      return run_on_plain_tensors(plan, op, stack, layer, route);
    case Route::Wrappers:
    case Route::Autograd:  // (these two were decided before the scan)
    case Route::TracerInside:
      break;
  }
  // A functional value written into a plain temporary of a backward formula.
  // See Note [Autograd: formula temporaries written in place].
  if (info.kind == OpKind::Mutable && write_formula_temporary(info, op, stack)) return;
  if (plan.special != nullptr && plan.special->handle != nullptr) {
    return plan.special->handle(info, op, stack, *layer);
  }
  generic_kernel(info, op, stack, *layer);
}

void generic_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const Layer& layer) {
  switch (info.kind) {
    case OpKind::Functional:
      return functional_kernel(info, op, stack, layer);
    case OpKind::View:
      return view_kernel(info, op, stack, layer);
    case OpKind::InplaceView:
      return inplace_view_kernel(info, op, stack, layer);
    case OpKind::Mutable:
      return mutable_kernel(info, op, stack, layer);
    case OpKind::Unsupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "functionalize: ", info.name, ": ",
                                  info.unsupported_reason, ".");
  }
}

// See Note [Strides: what eager gives], case "*_like templates".
namespace {
void use_reported_strides(const at::Tensor& wrapper, c10::IValue& inner) {
  const at::Tensor& value = inner.toTensor();
  if (same_sizes_other_strides(wrapper, value)) {
    inner = at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options());
  }
}

// See Note [Strides: what eager gives], case "seeded arguments".
void in_reported_strides_for_seeded(const at::Tensor& wrapper, c10::IValue& inner) {
  const at::Tensor& value = inner.toTensor();
  if (same_sizes_other_strides(wrapper, value) &&
      !may_self_overlap(wrapper.sizes(), wrapper.strides())) {
    inner = restrided_copy(at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options()),
                           value);
  }
}

// Without views a wrapper's value holds its own elements only; in eager it may lie inside a larger
// storage (a view, or an input that does not start its storage), whose other elements an op that
// copies self's whole storage (copies_self_storage) copies too. Raises where self's elements share
// memory.
bool lies_inside_a_storage(const c10::IValue& self, const OpInfo& info) {
  const auto* impl = self.isTensor() ? maybe_get_impl(self.toTensor()) : nullptr;
  if (impl == nullptr) return false;
  // Eager's result keeps self's strides, and where they make elements share memory the op's
  // writes land on each other: a layout no *_copy value has. A zero
  // stride is the exception: eager clones such a self contiguously (torch's
  // clone_preserve_strides gives up on a provable overlap), as the *_copy value is, so the
  // expanded gradients autograd's backward formulas scatter into need no refusal.
  const at::Tensor& t = self.toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(
      t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
          !may_self_overlap(t.sizes(), t.strides()) ||
          at::has_internal_overlap(t) == at::MemOverlap::Yes,
      "functionalize: ", info.name,
      " of a view whose elements share memory (as_strided with "
      "overlapping strides) is not supported with remove=\"mutations_and_views\": eager's result "
      "keeps that layout. Clone the view first, or use remove=\"mutations\".");
  const auto& storage = impl->alias_storage();
  return !impl->chain().empty() || storage.flat() || storage.offset_base();
}

}  // namespace

const char* const kCopiedViewStorage =
    "the tensor is (a view of) the result of a *_scatter op or copy of a view, which in eager "
    "holds a copy of the view's whole storage; without views only the view's elements are held, "
    "so as_strided (or a resize_ that grows it) cannot address the others. Use "
    "remove=\"mutations\"";

// See Note [Strides: what eager gives], case "op results".
bool reports_eager_strides_of_results(const c10::IValue& arg) {
  bool differs = false;
  for_each_tensor(arg, [&](const at::Tensor& t) {
    auto* impl = maybe_get_impl(t);
    differs = differs || (impl != nullptr && same_sizes_other_strides(t, impl->value()));
  });
  return differs;
}

void adopt_eager_strides(const at::Tensor& result, const at::Tensor& meta) {
  auto* impl = maybe_get_impl(result);
  // A result at an offset (the *_scatter ops keep a view's offset: in eager they copy its whole
  // storage) keeps the value's geometry: the storage's eager geometry has no offset, and taking
  // the strides alone would put its elements at other storage coordinates than the wrapper
  // reports, and a later resize_ would read them wrong, silently; with the value's geometry such
  // a resize is refused by name.
  if (impl == nullptr || !meta.defined() || meta.layout() != c10::kStrided ||
      result.layout() != c10::kStrided || meta.storage_offset() != 0 ||
      !same_sizes_other_strides(result, meta)) {
    return;
  }
  impl->set_reference_metadata_(meta);
  // A fresh result is its storage's base: as_strided on it or its views needs eager's strides.
  // See Note [Strides: what eager gives], case "storage coordinates".
  if (impl->chain().empty() && !meta.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      impl->value().is_same(impl->alias_storage().base())) {
    impl->alias_storage().set_eager_geometry(meta.sizes(), meta.strides());
  }
}

std::vector<c10::IValue> meta_twins_of(std::vector<c10::IValue> args) {
  for (auto& v : args) {
    // A device argument (type_as(y) is _to_copy(.., device=y.device)) names the twins' device,
    // or the op would make a result on the values' device (or refuse to copy out of meta).
    if (v.isDevice()) {
      v = c10::IValue(c10::Device(c10::kMeta));
      continue;
    }
    transform_tensors(v, [](const at::Tensor& t) {
      TORCH_CHECK(
          t.layout() == c10::kStrided && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(),
          "no meta twin");
      return meta_twin(t);
    });
  }
  return args;
}

namespace {
// See Note [Strides: what eager gives], case "op results": convolution's meta kernel lays its
// result out by CUDA's rule (it cannot tell a meta twin's device), where the CPU kernels
// (mkldnn's, the slow ones) give a channels-last result for a channels-last input or weight.
void convolution_on_cpu_layout(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                               torch::jit::Stack& results) {
  static const c10::OperatorName convolution{"aten::convolution", ""};
  if (op.operator_name() != convolution || args.size() < 2 || results.size() != 1 ||
      !args[0].isTensor() || !args[1].isTensor() || !results[0].isTensor()) {
    return;
  }
  const at::Tensor& input = args[0].toTensor();
  const at::Tensor& weight = args[1].toTensor();
  const at::Tensor& out = results[0].toTensor();
  if (input.dim() != 4 && input.dim() != 5) return;
  const auto channels_last =
      input.dim() == 4 ? c10::MemoryFormat::ChannelsLast : c10::MemoryFormat::ChannelsLast3d;
  if (input.suggest_memory_format() != channels_last &&
      weight.suggest_memory_format() != channels_last) {
    return;
  }
  results[0] = at::empty_like(out, out.options(), channels_last);
}

// The functional op on meta twins of the wrappers' reported geometry, or nullopt.
std::optional<torch::jit::Stack> run_on_reported_geometry(const c10::OperatorHandle& op,
                                                          const torch::jit::Stack& stack) {
  const size_t num_args = op.schema().arguments().size();
  const c10::IValue& first = *(stack.end() - static_cast<std::ptrdiff_t>(num_args));
  const bool on_cpu = first.isTensor() && first.toTensor().device().is_cpu();
  try {
    MetaComputeGuard guard;
    torch::jit::Stack meta = meta_twins_of(
        torch::jit::Stack(stack.end() - static_cast<std::ptrdiff_t>(num_args), stack.end()));
    const torch::jit::Stack twins = meta;
    op.callBoxed(meta);
    if (on_cpu) convolution_on_cpu_layout(op, twins, meta);
    return meta;
  } catch (const std::exception&) {
    return std::nullopt;  // no meta kernel, or arguments it cannot take: the values' strides
  }
}
}  // namespace

void functional_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  // See Note [Alias: writes to a value that is not its whole storage].
  const bool mark_result = info.copies_self_storage && !layer.reapply_views &&
                           lies_inside_a_storage(*(stack->end() - num_args), info);
  std::optional<torch::jit::Stack> eager_meta;
  if (C10_UNLIKELY(!layer.reapply_views) &&
      std::any_of(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end(),
                  reports_eager_strides_of_results)) {
    eager_meta = run_on_reported_geometry(op, *stack);
  }
  InnerCallGuard guard;
  const bool seeded_without_views =
      C10_UNLIKELY(info.seeded) && !layer.reapply_views && !info.self_is_template;
  // Some ops declared functional return an argument itself (dropout with p=0): such an output
  // must stay that argument's wrapper, or writes through it would not reach the argument.
  c10::SmallVector<std::pair<const c10::TensorImpl*, at::Tensor>, 4> passed;  // inner -> wrapper
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    if (it->isTensor() && maybe_get_impl(it->toTensor()) != nullptr) {
      at::Tensor wrapper = it->toTensor();
      *it = sync_and_unwrap(wrapper);
      // See Note [Strides: what eager gives], case "seeded arguments".
      if (seeded_without_views) in_reported_strides_for_seeded(wrapper, *it);
      passed.emplace_back(it->toTensor().unsafeGetTensorImpl(), std::move(wrapper));
      if (info.self_is_template && it == stack->end() - static_cast<std::ptrdiff_t>(num_args)) {
        use_reported_strides(passed.back().second, *it);
      }
      continue;
    }
    transform_tensors(*it, sync_and_unwrap);
  }
  op.callBoxed(stack);
  const size_t num_returns = op.schema().returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end();
       ++it) {
    transform_tensors(*it, [&](const at::Tensor& t) {
      for (const auto& [impl, wrapper] : passed) {
        if (t.unsafeGetTensorImpl() == impl) return wrapper;
      }
      at::Tensor out = make_fresh_wrapper(t, layer.id);
      if (mark_result) unsafe_get_impl(out)->alias_storage().mark_offset_base(kCopiedViewStorage);
      return out;
    });
  }
  if (C10_UNLIKELY(eager_meta.has_value())) {
    for (size_t i = 0; i < num_returns && i < eager_meta->size(); ++i) {
      const auto& r = *(stack->end() - static_cast<std::ptrdiff_t>(num_returns - i));
      const bool passed_through =
          r.isTensor() && std::any_of(passed.begin(), passed.end(), [&](const auto& p) {
            return p.second.is_same(r.toTensor());
          });
      if (r.isTensor() && !passed_through && (*eager_meta)[i].isTensor()) {
        adopt_eager_strides(r.toTensor(), (*eager_meta)[i].toTensor());
      }
    }
  }
}

c10::impl::LocalDispatchKeySet PythonUnhiddenGuard::unhidden() {
  auto tls = c10::impl::tls_local_dispatch_key_set();
  tls.excluded_ = tls.excluded_.remove(c10::DispatchKey::Python);
  return tls;
}

}  // namespace tfz::detail
