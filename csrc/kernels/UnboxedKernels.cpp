// Unboxed kernels for the most frequent ATen ops (pointwise math, reductions, matmuls, the nn
// ops of a training step, and the in-place / out= twins of the pointwise ones). Each does what
// the boxed kernel does for its op, without boxing arguments into a stack. Which ops get one is
// decided at registration from the op's classification. See Note [Kernel: unboxed fast path].
#include "kernels/UnboxedCall.h"

#include "kernels/CallerMemoryWrites.h"

#include <ATen/Operators.h>

#include <string_view>
#include <unordered_map>

namespace tfz::detail {

// Note [Kernel: unboxed fast path]
// The boxed kernel serves every op, custom ops included, because it reads the arguments from an
// IValue stack. That genericity has a price on every call: the dispatcher boxes the caller's
// arguments into a heap-allocated stack for us, our redispatch on the inner tensors unboxes them
// again for ATen's (unboxed) kernels, and the result makes the same trip back. Under callgrind
// that was ~650 of the ~2840 instructions a functional `add` cost over plain dispatch, and for
// in-place / out= ops mutable_kernel's generic argument vectors and IValue walks cost ~1500 more
// (benchmarks/README.md, "Where the per-op time goes").
// So for a fixed list of frequent ops we register a kernel that takes the op's C++ signature
// directly (from the generated at::_ops::<op>::schema) and does, argument by argument, what the
// boxed kernel does over the stack. Both first take the same route
// (Note [Kernel: one route into every call]); on the Wrappers route:
//   Functional (Unboxed):  wrapper args are synced and passed as their inner value; a result
//       that *is* an argument's inner value returns that argument's wrapper, any other defined
//       result becomes a fresh base wrapper.
//   In-place / out= (UnboxedMutable): the written argument must be a wrapper without internal
//       overlap; the functional variant runs on the inner values; eager's shape and dtype rules
//       are checked; the written wrapper gets the new value (write_back) and is returned.
// The rarer routes and cases (a tracer started inside, closures to lift, a write the boxed
// kernel serves otherwise) go to the boxed kernel with the same arguments.
// Registration.cpp installs a listed op's unboxed kernel only where its KernelPlan is exactly the
// plan the kernel implements (`matches`): no special row (Note [Kernel: special ops]) and either
// plain Functional, or Mutable with that functional variant, its arguments in the same order, and
// one written argument returned (Note [Schema: argument plan]). Everything else, and every op not
// listed, keeps the boxed kernel, which stays the single source of truth for semantics: the list
// only decides speed, and test_unboxed.py checks that every listed op did get its kernel. The
// unboxed kernel is also reachable boxed (TorchScript, torch.ops): the dispatcher then unboxes into
// it. Only `Tensor`, `Tensor?` and the one written `Tensor(a!)` argument are unwrapped (a
// static_assert checks); ops with tensor lists (cat, index.Tensor) stay boxed.
// Rejected: generating a kernel per op from native_functions.yaml, as torch does. It needs a
// code generator in our build tied to one torch version's yaml, for ~2500 ops most of which are
// rare per call; the boxed kernel already serves them correctly.

// The kernels share their helpers' namespace (kernels/UnboxedCall.h).
namespace unboxed {

template <class Op, class Sig = typename Op::schema>
struct Unboxed;

template <class Op, class Ret, class... Args>
struct Unboxed<Op, Ret(Args...)> {
  static_assert(!((is_tensor_list_v<Args> || std::is_same_v<Args, at::Tensor&>) || ...),
                "Unboxed only unwraps Tensor and Tensor? arguments (a functional op writes none)");
  static constexpr size_t kTensors =
      ((is_tensor_v<Args> || is_optional_tensor_v<Args> ? 1 : 0) + ... + 0);
  static_assert(kTensors > 0, "factories stay on the boxed kernel (their outputs are wrapped)");

  static Ret call(c10::DispatchKeySet ks, Args... args) {
    Layer* layer = current_layer();
    Call<kTensors> call(layer);
    return take_route<Ret, Op>(
        ks, layer, call, &name, [&]() -> Ret { return from_boxed_kernel(ks, args...); },
        [&]() -> Ret {
          InnerCallGuard guard;
          // See the boxed kernel: saved tensors under a tracer read as the traced ones, and
          // results are noted (Note [Autograd: saved outputs under a tracer], the create_graph
          // case).
          if (C10_UNLIKELY(ops_are_recorded())) {
            Ret out = Op::call(call.unwrap(args)...);
            note_plain_results(out);
            return out;
          }
          return Op::call(args...);
        },
        [&]() -> Ret { return on_wrappers(ks, layer, call, args...); }, args...);
  }

  static Ret on_wrappers(c10::DispatchKeySet ks, Layer* layer, Call<kTensors>& call,
                         Args&... args) {
    if (C10_UNLIKELY(call.scanned().reference()) && !layer->reapply_views &&
        (reports_eager_strides_of_results(as_ivalue(args)) || ...)) {
      // The boxed kernel runs the meta replay this needs; calls without such an argument pay one
      // flag read per wrapper (in scan). See Note [Strides: what eager gives], case "op results".
      return from_boxed_kernel(ks, args...);
    }
    InnerCallGuard guard;
    Ret out = Op::call(call.unwrap(args)...);
    return call.wrap(std::move(out));
  }

  static Ret from_boxed_kernel(c10::DispatchKeySet ks, const Args&... args) {
    torch::jit::Stack stack = run_on_boxed_kernel<Op>(ks, args...);
    return c10::impl::PopResult<Ret>::call(stack);
  }
  static const std::string& name() {
    static const std::string n = c10::toString(c10::OperatorName(Op::name, Op::overload_name));
    return n;
  }

  static c10::KernelFunction kernel() {
    return c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(Unboxed::call));
  }
};

// In-place (`add_(Tensor(a!) self, ...)`, kOut = false) and out= (`mul.out(..., *, Tensor(a!)
// out)`, kOut = true) ops whose functional variant FuncOp takes the same arguments minus `out`:
// what mutable_kernel does for them, unboxed. Registration checks that the op's plan is exactly
// this one (`matches`).
template <class MutOp, class FuncOp, bool kOut, class Sig = typename MutOp::schema>
struct UnboxedMutable;

template <class MutOp, class FuncOp, bool kOut, class... Args>
struct UnboxedMutable<MutOp, FuncOp, kOut, at::Tensor&(Args...)> {
  static constexpr size_t kArgs = sizeof...(Args);
  static constexpr size_t kWritten = kOut ? kArgs - 1 : 0;
  static constexpr size_t kFunctionalArgs = kOut ? kArgs - 1 : kArgs;
  static_assert(std::is_same_v<std::tuple_element_t<kWritten, std::tuple<Args...>>, at::Tensor&>,
                "the written argument must be Tensor(a!)");
  static constexpr size_t kTensors =
      ((is_tensor_v<Args> || is_optional_tensor_v<Args> ? 1 : 0) + ... + 0);
  static_assert(!(is_tensor_list_v<Args> || ...),
                "UnboxedMutable only unwraps Tensor, Tensor? and the written Tensor(a!)");

  static const std::string& name() {
    static const std::string n =
        c10::toString(c10::OperatorName(MutOp::name, MutOp::overload_name));
    return n;
  }
  // For messages: the written argument as the schema names it ("self" or "out" for every op
  // listed; `matches` checks it at registration).
  static constexpr std::string_view kWrittenName = kOut ? "out" : "self";

  template <class Refs, size_t... I>
  static at::Tensor call_functional(Call<kTensors>& call, Refs& refs,
                                    std::index_sequence<I...> /*functional args*/) {
    return FuncOp::call(call.unwrap(std::get<I>(refs))...);
  }

  // Argument I of the in-place op itself: the written one is `inner`, the others unwrapped.
  template <size_t I, class Refs>
  static decltype(auto) in_place_arg(Call<kTensors>& call, Refs& refs, at::Tensor& inner) {
    if constexpr (I == kWritten) {
      return (inner);
    } else {
      return call.unwrap(std::get<I>(refs));
    }
  }
  template <class Refs, size_t... I>
  static void call_in_place(Call<kTensors>& call, Refs& refs, at::Tensor& inner,
                            std::index_sequence<I...> /*all args*/) {
    MutOp::call(in_place_arg<I>(call, refs, inner)...);
  }

  // The functional variant with `self` in place of the written argument's inner value (in-place
  // ops only, whose functional arguments are the op's own).
  template <class Refs, size_t... I>
  static at::Tensor call_with_self(Call<kTensors>& call, Refs& refs, at::Tensor& self,
                                   std::index_sequence<I...> /*all args*/) {
    return FuncOp::call(in_place_arg<I>(call, refs, self)...);
  }

  // Note [Kernel: writes that read their own memory], for each tensor argument but the written.
  // `resized_to`: an out= tensor's result sizes (it is resized before the kernel writes).
  template <size_t I, class Refs>
  static void check_read(const at::Tensor& written, Refs& refs,
                         c10::OptionalIntArrayRef resized_to) {
    using Arg = std::tuple_element_t<I, std::tuple<Args...>>;
    if constexpr (I != kWritten && (is_tensor_v<Arg> || is_optional_tensor_v<Arg>)) {
      const auto& read = std::get<I>(refs);
      if constexpr (is_tensor_v<Arg>) {
        check_read_of_written(op_name(), written, kWritten, read, I, resized_to);
      } else if (read.has_value()) {
        check_read_of_written(op_name(), written, kWritten, *read, I, resized_to);
      }
    }
  }
  template <class Refs, size_t... I>
  static void check_reads(const at::Tensor& written, Refs& refs,
                          c10::OptionalIntArrayRef resized_to, std::index_sequence<I...>) {
    (check_read<I>(written, refs, resized_to), ...);
  }
  // Untraced without views, an out= whose inputs report other strides than their values takes
  // the boxed kernel's stride correction when it resizes out (torch.sigmoid(x2, out=x1) of a
  // transposed x2 would resize x1 contiguous where eager follows x2).
  // See Note [Strides: what eager gives], case "op results".
  static bool out_reads_reference(const Call<kTensors>& call, const Args&... args) {
    return C10_UNLIKELY(call.scanned().reference()) && !current_layer()->reapply_views &&
           (reports_eager_strides_of_results(as_ivalue(args)) || ...);
  }
  static const c10::OperatorName& op_name() {
    static const c10::OperatorName n(MutOp::name, MutOp::overload_name);
    return n;
  }

  static at::Tensor& call(c10::DispatchKeySet ks, Args... args) {
    Layer* layer = current_layer();
    Call<kTensors> call(layer);
    at::Tensor& written = std::get<kWritten>(std::tie(args...));
    return take_route<at::Tensor&, MutOp>(
        ks, layer, call, &name,
        [&]() -> at::Tensor& {
          run_on_boxed_kernel<MutOp>(ks, args...);
          return written;
        },
        [&]() -> at::Tensor& {
          if (C10_UNLIKELY(ops_are_recorded())) {
            // The boxed kernel: Note [Autograd: formula temporaries written in place].
            run_on_boxed_kernel<MutOp>(ks, args...);
            return written;
          }
          InnerCallGuard guard;
          return MutOp::call(args...);
        },
        [&]() -> at::Tensor& { return on_wrappers(ks, layer, call, args...); }, args...);
  }

  static at::Tensor& on_wrappers(c10::DispatchKeySet ks, Layer* layer, Call<kTensors>& call,
                                 Args&... args) {
    auto refs = std::tie(args...);
    at::Tensor& written = std::get<kWritten>(refs);
    const auto* written_impl = maybe_get_impl(written);
    if (C10_UNLIKELY(written_impl == nullptr || written_impl->alias_storage().captured())) {
      // The boxed kernel: Note [Autograd: formula temporaries written in place],
      // Note [Kernel: writes into captured tensors], or their refusal.
      run_on_boxed_kernel<MutOp>(ks, args...);
      return written;
    }
    check_writable(name(), kWrittenName, written);
    // The boxed kernel's rules for these (Note [Strides: what eager gives], case "resized out=",
    // for a traced out=; Note [Kernel: bool views of other bytes]), whose cost eager calls on
    // other tensors never pay.
    if (C10_UNLIKELY(kOut ? ops_are_recorded() || out_reads_reference(call, args...)
                          : is_bool_view_of_wider_bytes(written))) {
      run_on_boxed_kernel<MutOp>(ks, args...);
      return written;
    }
    if constexpr (!kOut) {
      // See Note [Undo: writes into the caller's memory]: the boxed kernel takes those.
      if (C10_UNLIKELY(writes_through_view_of_caller_memory(written, *layer))) {
        run_on_boxed_kernel<MutOp>(ks, args...);
        return written;
      }
      if (can_write_inner_in_place(written)) {  // See Note [Kernel: in-place on the inner value]
        at::Tensor inner = unsafe_get_impl(written)->value();
        bool done = true;
        try {
          InnerCallGuard guard;
          call_in_place(call, refs, inner, std::make_index_sequence<kArgs>());
        } catch (const c10::Error&) {
          done = false;  // the functional path below reports eager's rule under the op's name
        }
        inner.reset();  // back to the wrapper's and the storage's references before committing
        if (done) {
          commit_written_in_place(written);
          return written;
        }
      }
    }
    InnerCallGuard guard;
    at::Tensor value;
    if constexpr (!kOut) {
      // See Note [Kernel: writes to inputs under autograd]. check_writable: a wrapper of ours.
      auto* impl = unsafe_get_impl(written);
      impl->sync_();
      const at::Tensor& self = impl->value();
      if (C10_UNLIKELY(reads_input_under_autograd(written, self) &&
                       (any_requires_grad(args) || ...))) {
        at::Tensor copy = at::clone(self);
        value = call_with_self(call, refs, copy, std::make_index_sequence<kArgs>());
      }
    }
    if (!value.defined()) {
      value = call_functional(call, refs, std::make_index_sequence<kFunctionalArgs>());
    }
    if constexpr (kOut) {
      // See Note [Kernel: out= of another dtype], case "eagerly". (Listed ops: none seeded.)
      const at::Tensor& out = unsafe_get_impl(written)->value();
      if (C10_UNLIKELY(out_takes_eager_kernel(written, out, value))) {
        at::Tensor fresh = fresh_out_like(written, out);
        call_in_place(call, refs, fresh, std::make_index_sequence<kArgs>());
        value = std::move(fresh);
      }
    }
    check_eager_rules(name(), written, value, /*resizes=*/kOut);
    // The in-place path above ran eager's own kernel, so only the functional one needs this.
    c10::OptionalIntArrayRef resized_to;
    if constexpr (kOut) {
      if (!value.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) resized_to = value.sizes();
    }
    check_reads(written, refs, resized_to, std::make_index_sequence<kArgs>());
    write_back(written, value, /*counts_version=*/true, name());
    return written;
  }

  static c10::KernelFunction kernel() {
    return c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(UnboxedMutable::call));
  }

  /// Is `plan` exactly what call() does? See Note [Schema: argument plan].
  static bool matches(const c10::OperatorHandle& op, const KernelPlan& plan) {
    const OpInfo& info = plan.info;
    const WrittenArg expected{static_cast<int>(kWritten), /*functional_return=*/0, kOut,
                              /*is_returned=*/true};
    if (plan.special != nullptr || info.kind != OpKind::Mutable ||
        op.schema().arguments()[kWritten].name() != kWrittenName ||
        info.functional_op->operator_name() !=
            c10::OperatorName(FuncOp::name, FuncOp::overload_name) ||
        info.written.size() != 1 || info.written[0].index != expected.index ||
        info.written[0].functional_return != expected.functional_return ||
        info.written[0].is_out != expected.is_out || !info.written[0].is_returned ||
        info.return_aliases != std::vector<int>{expected.index} ||
        info.functional_args.size() != kFunctionalArgs) {
      return false;
    }
    for (size_t i = 0; i < kFunctionalArgs; ++i) {
      const auto& src = info.functional_args[i];
      if (src.kind != ArgSource::FromMutableArg || src.index != static_cast<int>(i)) return false;
    }
    return true;
  }
};

// The ops with an unboxed kernel. Order does not matter; a name that a torch version lacks is a
// compile error, which is the point (the list is checked against the headers we build with).
// The X-macro lists keep their rows (clang-format does not settle on a layout for them).
// clang-format off
#define TFZ_UNBOXED_OPS(_)                                                                      \
  /* pointwise binary */                                                                        \
  _(add_Tensor) _(add_Scalar) _(sub_Tensor) _(sub_Scalar) _(rsub_Tensor) _(rsub_Scalar)         \
  _(mul_Tensor) _(mul_Scalar) _(div_Tensor) _(div_Scalar) _(div_Tensor_mode)                    \
  _(pow_Tensor_Tensor) _(pow_Tensor_Scalar) _(pow_Scalar) _(remainder_Tensor)                   \
  _(remainder_Scalar) _(fmod_Tensor) _(maximum) _(minimum) _(atan2) _(eq_Tensor) _(eq_Scalar)   \
  _(ne_Tensor) _(ne_Scalar) _(lt_Tensor) _(lt_Scalar) _(le_Tensor) _(le_Scalar) _(gt_Tensor)    \
  _(gt_Scalar) _(ge_Tensor) _(ge_Scalar) _(logical_and) _(logical_or) _(bitwise_and_Tensor)     \
  _(where_self) _(clamp) _(clamp_Tensor) _(clamp_min) _(clamp_max) _(lerp_Scalar)               \
  _(lerp_Tensor) _(addcmul) _(addcdiv) _(masked_fill_Scalar) _(masked_fill_Tensor)              \
  /* pointwise unary */                                                                         \
  _(abs) _(neg) _(exp) _(exp2) _(log) _(log2) _(log1p) _(expm1) _(sqrt) _(rsqrt) _(reciprocal)  \
  _(sin) _(cos) _(tan) _(tanh) _(sigmoid) _(erf) _(erfinv) _(floor) _(ceil) _(round) _(trunc)   \
  _(sign) _(sgn) _(logical_not) _(isnan) _(nan_to_num)                                          \
  /* activations and their backward */                                                          \
  _(relu) _(gelu) _(silu) _(mish) _(hardtanh) _(leaky_relu) _(elu) _(softplus) _(hardswish)     \
  _(hardsigmoid) _(gelu_backward) _(threshold_backward) _(sigmoid_backward) _(tanh_backward)    \
  /* reductions */                                                                              \
  _(sum) _(sum_dim_IntList) _(mean) _(mean_dim) _(prod) _(amax) _(amin) _(max) _(min)           \
  _(max_dim) _(min_dim) _(argmax) _(argmin) _(var_correction) _(std_correction) _(cumsum)       \
  _(all) _(any) _(all_dim) _(any_dim) _(linalg_vector_norm)                                     \
  /* matmuls */                                                                                 \
  _(mm) _(bmm) _(addmm) _(baddbmm) _(addmv) _(mv) _(dot)                                        \
  /* nn */                                                                                      \
  _(_softmax) _(_log_softmax) _(_softmax_backward_data) _(_log_softmax_backward_data)           \
  _(native_layer_norm) _(native_layer_norm_backward) _(convolution) _(convolution_backward)     \
  _(embedding) _(embedding_dense_backward) _(nll_loss_forward) _(nll_loss_backward)             \
  _(mse_loss) _(index_select) _(gather) _(scatter_src)                                          \
  /* copies */                                                                                  \
  _(clone) _(_to_copy)

// In-place and out= twins of functional ops above: (mutable op, its functional variant).
#define TFZ_UNBOXED_INPLACE_OPS(_)                                                              \
  _(add__Tensor, add_Tensor) _(add__Scalar, add_Scalar) _(sub__Tensor, sub_Tensor)              \
  _(sub__Scalar, sub_Scalar) _(mul__Tensor, mul_Tensor) _(mul__Scalar, mul_Scalar)              \
  _(div__Tensor, div_Tensor) _(div__Scalar, div_Scalar) _(pow__Scalar, pow_Tensor_Scalar)       \
  _(clamp_, clamp) _(clamp_min_, clamp_min) _(clamp_max_, clamp_max) _(neg_, neg) _(exp_, exp)  \
  _(sqrt_, sqrt) _(relu_, relu) _(sigmoid_, sigmoid) _(tanh_, tanh) _(addcmul_, addcmul)        \
  _(addcdiv_, addcdiv) _(lerp__Scalar, lerp_Scalar) _(lerp__Tensor, lerp_Tensor)                \
  _(masked_fill__Scalar, masked_fill_Scalar)
#define TFZ_UNBOXED_OUT_OPS(_)                                                                  \
  _(add_out, add_Tensor) _(sub_out, sub_Tensor) _(mul_out, mul_Tensor) _(div_out, div_Tensor)   \
  _(neg_out, neg) _(exp_out, exp) _(sqrt_out, sqrt) _(tanh_out, tanh) _(sigmoid_out, sigmoid)   \
  _(mm_out, mm) _(bmm_out, bmm) _(addmm_out, addmm) _(clamp_out, clamp)                         \
  _(addcmul_out, addcmul) _(addcdiv_out, addcdiv) _(maximum_out, maximum)                       \
  _(minimum_out, minimum) _(where_self_out, where_self)
// clang-format on

struct Entry {
  c10::KernelFunction (*kernel)();
  bool (*matches)(const c10::OperatorHandle&, const KernelPlan&);
};

bool is_plain_functional(const c10::OperatorHandle& /*op*/, const KernelPlan& plan) {
  return plan.special == nullptr && plan.info.kind == OpKind::Functional &&
         !plan.info.wraps_plain_outputs && !plan.info.self_is_template &&
         !plan.info.copies_self_storage;
}

const std::unordered_map<c10::OperatorName, Entry>& unboxed_kernels() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<c10::OperatorName, Entry>();
#define TFZ_ADD(op)                                                              \
  t->emplace(c10::OperatorName(at::_ops::op::name, at::_ops::op::overload_name), \
             Entry{&Unboxed<at::_ops::op>::kernel, &is_plain_functional});
#define TFZ_ADD_MUTABLE(op, functional, out)                                         \
  t->emplace(c10::OperatorName(at::_ops::op::name, at::_ops::op::overload_name),     \
             Entry{&UnboxedMutable<at::_ops::op, at::_ops::functional, out>::kernel, \
                   &UnboxedMutable<at::_ops::op, at::_ops::functional, out>::matches});
#define TFZ_ADD_INPLACE(op, functional) TFZ_ADD_MUTABLE(op, functional, false)
#define TFZ_ADD_OUT(op, functional) TFZ_ADD_MUTABLE(op, functional, true)
    TFZ_UNBOXED_OPS(TFZ_ADD)
    TFZ_UNBOXED_INPLACE_OPS(TFZ_ADD_INPLACE)
    TFZ_UNBOXED_OUT_OPS(TFZ_ADD_OUT)
#undef TFZ_ADD_OUT
#undef TFZ_ADD_INPLACE
#undef TFZ_ADD_MUTABLE
#undef TFZ_ADD
    return t;
  }();
  return *table;
}

}  // namespace unboxed

std::optional<c10::KernelFunction> unboxed_kernel(const c10::OperatorHandle& op) {
  const auto& table = unboxed::unboxed_kernels();
  auto it = table.find(op.operator_name());
  if (it == table.end()) return std::nullopt;
  if (!it->second.matches(op, plan_for_kernel(op))) return std::nullopt;
  return it->second.kernel();
}

std::vector<std::string> unboxed_listed_ops() {
  std::vector<std::string> names;
  for (const auto& [name, entry] : unboxed::unboxed_kernels()) names.push_back(toString(name));
  return names;
}

}  // namespace tfz::detail
