// Seeded random fills of tensors that are not contiguous: eager's numbers untraced (the op run in
// place on a private tensor) and in graphs (a functional layout chosen by measuring eager's
// kernel at trace time). Called by the mutation kernel before its plain functional call.
#include "kernels/RandomFills.h"

#include "core/Conversions.h"
#include "kernels/Handlers.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/DispatchKeySet.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <numeric>
#include <string_view>

namespace tfz::detail {

namespace {

bool is_static_strided(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

}  // namespace

// Note [Kernel: random fills of strided tensors]
// Rule: a seeded random fill of a written tensor that is not contiguous (x.bernoulli_(0.5) of a
// transposed x, normal_, dropout's mask, rand(out=) into a transposed tensor) draws eager's
// numbers, untraced and in graphs. Why: eager's kernel fills x where it lies, in its memory
// order and, for tensors that are not contiguous, with its scalar (not its vectorized) sampler,
// while the functional variant bernoulli(x, 0.5) fills a fresh contiguous tensor in logical
// order: same distribution, other numbers.
// Case "untraced" (random_fill_in_eager_order, below): when no graph is being recorded (the
// conditions of Note [Kernel: in-place on the inner value]: no dispatch mode, no torch.func
// transform, no Python key, no autograd on the value), a seeded random op whose single written
// tensor is not contiguous runs as called on a private tensor of the written tensor's exact
// geometry (empty_strided, its current value copied in), so the generator is consumed exactly
// as eagerly; that tensor becomes the new value.
// Case "in graphs" (random_fill_in_memory_order, further down): a graph cannot run x.normal_() in
// place, and which order eager uses depends on the op, the device and even the CPU: measured on
// torch 2.13 (AMD CPU), every seeded TensorIterator fill draws in x's memory order; normal_ picks a
// vectorized sampler for 16 or more contiguous elements and its scalar one otherwise; and ATen's
// source (cpu/DistributionKernels.cpp) has bernoulli_(p) on an Intel CPU with MKL draw through a
// contiguous buffer in logical order (not measured here: this machine's CPU is AMD). A rule written
// down per op would be wrong somewhere, so the order is measured where the program is traced: the
// in-place fill of the written tensor's geometry runs at trace time, hidden from the tracer, on
// private tensors, and so does the functional variant on each candidate layout, each from the
// generator's state before the op (restored afterwards, so the program draws as if none ran):
//   packed:  a contiguous tensor of the sizes in memory order (outermost dimension first), the
//            result permuted back to the written tensor's dimensions;
//   strided: a dense tensor with the written tensor's stride order (variants that keep their
//            input's layout then fill it in eager's memory order);
//   paired:  for n = a * b elements, a dense (a, b) tensor with strides (1, a): its memory order
//            is a contiguous sequence of n elements, but it is not contiguous, so normal_ keeps
//            its scalar sampler where a gapped x has it; read back as the transposed (b, a) view
//            and reshaped to the memory-order sizes;
//   split:   for a prime n, where no pair exists: the first n - 1 elements paired as above and the
//            last one drawn alone (one element keeps the scalar sampler too), concatenated in
//            memory order. Each draw continues the generator where the previous one left it, as
//            eager's single pass does; only fills that read no other tensor take it.
// An out= factory that does not resize its out (torch.rand(size, out=x), randn, randint) fills
// x the same way; it has no tensor to lay out, so packed passes the memory-order sizes as its
// size, and randn, which is x.normal_(0, 1), tries the others through normal's variant.
// The first candidate whose values and generator state equal eager's is recorded in the graph
// (empty or empty_strided, the functional variant, then permute / t / view / cat, or their _copy
// forms without views). When none matches, or nothing can be measured (symbolic sizes, meta
// tensors, a tensor argument that is not real, a torch.func transform or autograd on the value),
// the functional variant runs on the value and the graph samples in logical order. Only the
// fills that read nothing of x are taken (bernoulli, cauchy, exponential, geometric, log_normal,
// normal, random, uniform): the candidates start empty.
// A graph replays the order of the machine that traced it, as any graph replays its kernels.
// The measurement costs up to four fills of x's size at trace time, never in the graph; another
// thread drawing from the same generator during that time would have its draws undone by the
// restore.
// Rejected: a table of orders per op (wrong on other CPUs and devices: MKL's bernoulli runs on
// Intel only); a custom functional op that fills empty_strided in place (graphs of ATen ops).
std::optional<at::Tensor> random_fill_in_eager_order(const OpInfo& info,
                                                     const c10::OperatorHandle& op,
                                                     const std::vector<c10::IValue>& args,
                                                     std::vector<c10::IValue>& inner) {
  if (!info.seeded || info.written.size() != 1) return {};
  const auto& w = info.written[0];
  if (w.functional_return != 0) return {};
  if (!args[w.index].isTensor()) return {};
  const at::Tensor& written = args[w.index].toTensor();
  const at::Tensor& value = inner[w.index].toTensor();
  if (written.layout() != c10::kStrided || value.layout() != c10::kStrided ||
      written.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || written.is_contiguous() ||
      written.sizes() != value.sizes() || !nothing_records(value)) {
    return {};
  }
  at::Tensor target = at::empty_strided(written.sizes(), written.strides(), value.options());
  target.copy_(value);
  inner[w.index] = target;
  std::vector<c10::IValue> call = inner;
  op.callBoxed(call);
  return target;
}

bool is_generator_arg(const c10::Argument& arg) {
  const auto& type = arg.real_type();
  const auto kind = type->kind() == c10::TypeKind::OptionalType
                        ? type->expectRef<c10::OptionalType>().getElementType()->kind()
                        : type->kind();
  return kind == c10::TypeKind::GeneratorType;
}

// See Note [Kernel: random fills of strided tensors], case "in graphs".
namespace {

enum class FillLayout { Packed, Strided, Paired, Split };

// The written tensor's dimensions, outermost in memory first, with what each candidate needs.
struct MemoryOrder {
  std::vector<int64_t> perm;           // perm[i]: the dimension i-th outermost in memory
  std::vector<int64_t> inverse;        // permute(inverse) undoes permute(perm)
  std::vector<int64_t> sizes;          // sizes in that order
  std::vector<int64_t> dense_strides;  // dense strides for the written sizes in that order
  int64_t numel = 1;
  int64_t pair = 0;        // the smallest factor a of numel with 1 < a < numel; 0 if numel is prime
  int64_t split_pair = 0;  // the same for numel - 1, where numel is prime; else 0

  explicit MemoryOrder(const at::Tensor& t) {
    const int64_t dim = t.dim();
    perm.resize(dim);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
    inverse.resize(dim);
    sizes.resize(dim);
    dense_strides.resize(dim);
    int64_t stride = 1;
    for (int64_t i = dim - 1; i >= 0; --i) {
      inverse[perm[i]] = i;
      sizes[i] = t.size(perm[i]);
      dense_strides[perm[i]] = stride;
      stride *= std::max<int64_t>(sizes[i], 1);
    }
    numel = t.numel();
    pair = smallest_factor(numel);
    if (pair == 0 && numel > 2) split_pair = smallest_factor(numel - 1);
  }

  static int64_t smallest_factor(int64_t n) {
    for (int64_t a = 2; a * a <= n; ++a) {
      if (n % a == 0) return a;
    }
    return 0;
  }
};

// The fills that read nothing of the written tensor (the candidates start from empty tensors).
bool fills_without_reading_self(const OpInfo& info) {
  static constexpr std::array<std::string_view, 8> fills{
      "aten::bernoulli", "aten::cauchy",     "aten::exponential",
      "aten::geometric", "aten::log_normal", "aten::normal_functional",
      "aten::random",    "aten::uniform"};
  const std::string& name = info.functional_op->operator_name().name;
  return std::find(fills.begin(), fills.end(), name) != fills.end();
}

// The index of the functional variant's `size` argument when `info` is an out= factory
// (torch.rand(size, out=x)), or -1.
int factory_size_arg(const OpInfo& info) {
  if (!info.written[0].is_out) return -1;
  const auto& fargs = info.functional_op->schema().arguments();
  for (size_t i = 0; i < fargs.size(); ++i) {
    if (fargs[i].name() == "size") return static_cast<int>(i);
  }
  return -1;
}

// randn(size, out=x) is x.normal_(0, 1) once x has the size: its variant has no input to lay
// out, so the strided and paired layouts call normal's variant instead (on the CPU a packed
// randn takes normal_'s vectorized sampler for 16 or more elements, which eager's strided x
// does not). Other factories fill in memory order from a packed tensor (measured).
bool has_fill_twin(const OpInfo& info) {
  return info.functional_op->operator_name().name == "aten::randn";
}

// normal_functional(target, 0, 1, generator): randn's fill on `target`. `op` is randn's out=
// overload; its generator argument (if any) is passed on.
at::Tensor randn_fill(const c10::OperatorHandle& op, const std::vector<c10::IValue>& inner,
                      const at::Tensor& target) {
  static const auto normal =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::normal_functional", "");
  c10::IValue generator;
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "generator") generator = inner[i];
  }
  torch::jit::Stack stack{target, 0.0, 1.0, generator};
  normal.callBoxed(stack);
  return stack.at(0).toTensor();
}

// The functional variant of `info` on `target` and `inner`'s other arguments. An out= factory
// gets `sizes` as its size where `target` is packed, or its fill twin's call on `target`.
at::Tensor fill_target(const OpInfo& info, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& inner, const at::Tensor& like,
                       const at::Tensor& target, c10::IntArrayRef sizes, bool packed) {
  const int size_arg = factory_size_arg(info);
  if (size_arg >= 0 && !packed) return randn_fill(op, inner, target);
  std::vector<c10::IValue> from = inner;
  if (size_arg < 0) from[info.written[0].index] = target;
  const auto& fschema = info.functional_op->schema();
  torch::jit::Stack fstack;
  for (size_t i = 0; i < info.functional_args.size(); ++i) {
    fstack.push_back(functional_arg(info.functional_args[i], fschema.arguments()[i], from,
                                    size_arg < 0 ? at::Tensor() : like));
    if (static_cast<int>(i) == size_arg) fstack.back() = c10::IValue(sizes);
  }
  info.functional_op->callBoxed(fstack);
  return fstack.at(0).toTensor();
}

// A dense (a, n / a) tensor with strides (1, a), filled, and read back transposed: (n / a, a),
// contiguous, its elements in memory order (the paired layout's draw).
at::Tensor paired_fill(const OpInfo& info, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& inner, const at::Tensor& like, int64_t a,
                       int64_t n, bool views) {
  const at::Tensor target = at::empty_strided({a, n / a}, {1, a}, like.options());
  const at::Tensor result = fill_target(info, op, inner, like, target, {a, n / a}, false);
  return views ? result.t() : at::t_copy(result);
}

// The candidate `layout`'s fill, read back in the written tensor's dimensions. `like` has the
// written tensor's sizes and the value's options.
at::Tensor fill_layout(const OpInfo& info, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& inner, const MemoryOrder& order,
                       const at::Tensor& like, FillLayout layout, bool views) {
  TORCH_INTERNAL_ASSERT(factory_size_arg(info) < 0 || layout == FillLayout::Packed ||
                        has_fill_twin(info));
  auto from_memory_order = [&](const at::Tensor& flat) {
    return views ? flat.view(order.sizes).permute(order.inverse)
                 : at::permute_copy(at::view_copy(flat, order.sizes), order.inverse);
  };
  switch (layout) {
    case FillLayout::Packed: {
      const at::Tensor result =
          fill_target(info, op, inner, like, at::empty(order.sizes, like.options()), order.sizes,
                      /*packed=*/true);
      return views ? result.permute(order.inverse) : at::permute_copy(result, order.inverse);
    }
    case FillLayout::Strided:
      return fill_target(info, op, inner, like,
                         at::empty_strided(like.sizes(), order.dense_strides, like.options()),
                         like.sizes(), /*packed=*/false);
    case FillLayout::Paired:
      return from_memory_order(paired_fill(info, op, inner, like, order.pair, order.numel, views));
    case FillLayout::Split: {
      const at::Tensor head =
          paired_fill(info, op, inner, like, order.split_pair, order.numel - 1, views);
      const at::Tensor last =
          fill_target(info, op, inner, like, at::empty({1}, like.options()), {1}, /*packed=*/false);
      const int64_t n = order.numel - 1;
      return from_memory_order(at::cat({views ? head.view({n}) : at::view_copy(head, {n}), last}));
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown fill layout");
}

// The generator `args` name, or the default one of `device`.
at::Generator generator_of(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& args,
                           c10::Device device) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_generator_arg(schema.arguments()[i]) && args[i].isGenerator()) {
      return args[i].toGenerator();
    }
  }
  return at::globalContext().defaultGenerator(device);
}

// Puts the generator back in the state it had on construction when the measurement ends,
// however it ends. Its draws are then as if the measurement had not run.
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(at::Generator gen) : gen_(std::move(gen)), start_(state()) {}
  ~GeneratorStateGuard() { restore(); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;
  at::Tensor state() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    return gen_.get_state();
  }
  void restore() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(start_);
  }

 private:
  at::Generator gen_;
  at::Tensor start_;
};

// Which layout gives eager's numbers for the in-place op `op` on the written geometry: measured
// on private tensors, hidden from tracers (MetaComputeGuard), each run from the generator's
// current state, which is restored after. nullopt: none matched, or not measurable.
std::optional<FillLayout> measured_layout(const OpInfo& info, const c10::OperatorHandle& op,
                                          const std::vector<c10::IValue>& inner,
                                          const at::Tensor& written, const at::Tensor& value,
                                          const MemoryOrder& order) {
  const int index = info.written[0].index;
  try {
    MetaComputeGuard hidden;
    GeneratorStateGuard generator(generator_of(op.schema(), inner, value.device()));
    std::vector<c10::IValue> call = inner;
    const at::Tensor expected =
        at::empty_strided(written.sizes(), written.strides(), value.options()).zero_();
    call[index] = expected;
    op.callBoxed(call);
    const at::Tensor expected_state = generator.state();
    const at::Tensor probe = at::empty_strided(written.sizes(), written.strides(), value.options());
    const bool factory = factory_size_arg(info) >= 0;
    // The split layout draws in two calls: a tensor argument (bernoulli's p) would need splitting.
    bool reads_other_tensors = false;
    for (size_t i = 0; i < inner.size(); ++i) {
      if (static_cast<int>(i) != index) {
        for_each_tensor(inner[i], [&](const at::Tensor&) { reads_other_tensors = true; });
      }
    }
    for (const auto layout :
         {FillLayout::Packed, FillLayout::Strided, FillLayout::Paired, FillLayout::Split}) {
      if (layout == FillLayout::Paired && order.pair == 0) continue;
      if (layout == FillLayout::Split && (order.split_pair == 0 || reads_other_tensors)) continue;
      if (factory && layout != FillLayout::Packed && !has_fill_twin(info)) continue;
      generator.restore();
      at::Tensor got;
      try {
        got = fill_layout(info, op, inner, order, probe, layout, /*views=*/true);
      } catch (const std::exception&) {
        continue;  // this layout does not apply (e.g. its variant made another layout)
      }
      if (got.sizes() == expected.sizes() && at::equal(got, expected) &&
          at::equal(generator.state(), expected_state)) {
        return layout;
      }
    }
  } catch (const std::exception&) {
    // Eager raises on these arguments, or the device has no generator here: the plain
    // functional call reports or runs it.
  }
  return std::nullopt;
}

}  // namespace

std::optional<at::Tensor> random_fill_in_memory_order(const OpInfo& info,
                                                      const c10::OperatorHandle& op,
                                                      const std::vector<c10::IValue>& args,
                                                      const std::vector<c10::IValue>& inner,
                                                      bool reapply_views) {
  if (!info.seeded || info.written.size() != 1) return {};
  const auto& w = info.written[0];
  if (w.functional_return != 0 || !args[w.index].isTensor()) return {};
  if (w.is_out ? factory_size_arg(info) < 0 : !fills_without_reading_self(info)) return {};
  const at::Tensor& written = args[w.index].toTensor();
  const at::Tensor& value = inner[w.index].toTensor();
  if (!is_static_strided(written) || !is_static_strided(value) || value.is_meta() ||
      written.is_contiguous() || written.numel() < 2 || written.sizes() != value.sizes() ||
      value.requires_grad() ||
      value.key_set().has_any(c10::DispatchKeySet(
          {c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper}))) {
    return {};
  }
  // The measurement needs real values for every other tensor argument (a p tensor).
  bool real = true;
  for (size_t i = 0; i < inner.size(); ++i) {
    if (static_cast<int>(i) == w.index) continue;
    for_each_tensor(inner[i],
                    [&](const at::Tensor& t) { real = real && is_real(t) && !t.requires_grad(); });
  }
  if (!real) return {};
  const MemoryOrder order(written);
  if (w.is_out) {
    // An out= factory whose size differs resizes out first: not a fill of the written geometry.
    const auto& fargs = info.functional_op->schema().arguments();
    const int size_arg = factory_size_arg(info);
    const c10::IValue size =
        functional_arg(info.functional_args[size_arg], fargs[size_arg], inner, value);
    if (!size.isIntList() && !size.isSymIntList()) return {};
    const std::vector<c10::SymInt> sym = size.toSymIntVector();
    const auto sizes = c10::asIntArrayRefSlowOpt(sym);
    if (!sizes || *sizes != written.sizes()) return {};
  }
  const auto layout = measured_layout(info, op, inner, written, value, order);
  if (!layout) return {};
  return fill_layout(info, op, inner, order, value, *layout, reapply_views);
}

}  // namespace tfz::detail
