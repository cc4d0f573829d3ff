// In-place, out= and mutable ops on wrappers: call the functional variant on inner values, then
// replace each written wrapper's value, commit it to its alias storage and sync it.
#include "kernels/Handlers.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/FunctorchInterop.h"
#include "core/Layout.h"
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

// Note [Kernel: eager errors of in-place ops]
// A functional variant accepts programs its in-place op rejects: add(x, y) broadcasts x up to
// y's shape where x.add_(y) raises, and add(int, 1.5) promotes where int.add_(1.5) raises. So
// before anything is replaced, each new value is checked against the tensor it overwrites with
// eager's two rules: an in-place result must keep the shape of self (out= tensors are resized
// instead), and its dtype must be castable to the written tensor's dtype (c10::canCast, the rule
// TensorIterator applies). A failing check raises eager's message and leaves every wrapper as it
// was, so no input is half-mutated.
// Rejected: running the in-place op on meta copies first, as torch's codegen does. It costs a
// second dispatch per mutation, and ops without meta kernels (or data-dependent ones such as
// index_put_ with a mask) would need an allow-list of errors to ignore.

namespace {

// Note [Kernel: functional variants that clone a storage of partial elements]
// torch's functional copy and *_scatter ops start with clone_preserve_strides(self), which asserts
// that self's storage holds a whole number of self's elements. A view in a wider dtype over a
// storage that does not divide (x1 = b[:2] of 3 int32, viewed as int64: 12 bytes) reached that
// internal assert with remove="mutations", where inner values are views of the caller's storage
// (fuzzer program 660508). Eager writes such a view in place without trouble; ours would need
// another functional form. Until then the write is refused by name before the call, which leaves
// everything untouched. Without views the inner value is a copy, and nothing is refused.
void check_whole_elements_for_clone(const OpInfo& info, const std::vector<c10::IValue>& inner) {
  for (const auto& w : info.written) {
    if (w.is_out || !inner[w.index].isTensor()) continue;
    const at::Tensor& self = inner[w.index].toTensor();
    if (!self.defined() || !self.unsafeGetTensorImpl()->has_storage()) continue;
    const c10::SymInt& sym_nbytes = self.storage().sym_nbytes();
    if (sym_nbytes.is_heap_allocated()) continue;  // symbolic (dynamic shapes): not checkable
    const int64_t nbytes = sym_nbytes.as_int_unchecked();
    if (nbytes % static_cast<int64_t>(self.itemsize()) == 0) continue;  // the common case
    // Only now the op's name: this runs for every write.
    static const std::array<std::string_view, 5> cloning{
        "aten::copy", "aten::slice_scatter", "aten::select_scatter", "aten::diagonal_scatter",
        "aten::as_strided_scatter"};
    const std::string& name = info.functional_op->operator_name().name;
    TORCH_CHECK_NOT_IMPLEMENTED(
        std::find(cloning.begin(), cloning.end(), name) == cloning.end(),
        "functionalize: ", info.name, ": the written tensor is a ", self.scalar_type(),
        " view of a storage of ", nbytes, " bytes, not a whole number of ", self.scalar_type(),
        " elements, which torch's functional ", name,
        " cannot copy. Clone the tensor first, or use remove=\"mutations_and_views\".");
  }
}

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

// Note [Kernel: internal overlap]
// Writing to a tensor some of whose elements share memory (an expand, unfold with size > step,
// an overlapping as_strided) is refused by eager for stride-0 dimensions and unspecified
// otherwise; no inverse can say which of the aliased writes wins. So a write to such a tensor
// raises here, naming the op, instead of computing one arbitrary answer. The test is on the
// wrapper's own (eager) sizes and strides: sorted by stride, every dimension must step past
// everything the smaller ones reach. It is conservative for exotic interleavings (which eager
// itself only handles as "too hard to tell").
bool has_internal_overlap(const at::Tensor& t) {
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size) of dims with size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += (size - 1) * stride;
  }
  return false;
}

// Note [Kernel: writes that read their own memory]
// x.masked_scatter_(m, x), torch.amax(x, 0, out=x), torch.matmul(a, b, out=a): the written tensor
// shares memory with an argument the op reads. Eager kernels of such ops read and write that
// memory in their own order (masked_scatter_ reads source elements it has already overwritten,
// reductions and matmuls initialize out before reading), so eager's numbers depend on the kernel,
// and the functional form, which reads every argument before anything is written, cannot give
// them (the fuzzer found 8 such classes of wrong values). Such a call raises, naming the op and
// the argument. Elementwise ops (the pointwise tag, copy_, fill_, masked_fill_, where, _foreach_)
// are allowed one more case: an argument with the written tensor's exact geometry (offset,
// sizes, strides, item size; for lists, at the same position), since each element is read just
// before the same element is written, so x.mul_(x) and x.copy_(x) are the same eagerly and
// functionally. Any other overlap is refused for them too: `v[0::2] += v.diagonal()` reads
// elements an earlier step of the loop wrote; eager refuses it only where its own overlap check
// can decide (contiguous operands) and otherwise returns numbers that depend on its loop order
// (fuzzer program 213).
// "Shares memory" is exact for wrappers of one alias storage: when the byte ranges overlap, the
// elements' byte intervals are compared, so interleaved slices (x[0::2] and x[1::2]) do not count
// as sharing. Above kExactOverlapLimit elements the range overlap alone decides (conservative:
// a refusal, never a wrong number). A custom op's companion runs the op's own kernel on one clone
// per distinct tensor (Note [Kernel: custom mutable ops]), so the same tensor passed twice keeps
// eager's order there and is allowed.
// Rejected: running the op in place on a copy of the storage to get eager's numbers: the graph
// would then hold a mutation, and the numbers a kernel detail.
struct ByteSpan {
  int64_t begin, end;
};

ByteSpan byte_span(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  const auto extent =
      static_cast<int64_t>(at::detail::computeStorageNbytes(t.sizes(), t.strides(), item));
  return {t.storage_offset() * item, t.storage_offset() * item + extent};
}

constexpr int64_t kExactOverlapLimit = int64_t{1} << 20;

// The sorted byte offsets of t's elements in its storage (numel entries).
std::vector<int64_t> element_byte_offsets(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  std::vector<int64_t> offsets{t.storage_offset() * item};
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t step = t.stride(d) * item;
    const size_t n = offsets.size();
    offsets.reserve(n * static_cast<size_t>(t.size(d)));
    for (int64_t k = 1; k < t.size(d); ++k) {
      for (size_t i = 0; i < n; ++i) offsets.push_back(offsets[i] + k * step);
    }
    if (t.size(d) == 0) offsets.clear();
  }
  std::sort(offsets.begin(), offsets.end());
  return offsets;
}

bool elements_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() + b.numel() > kExactOverlapLimit) return true;
  const auto oa = element_byte_offsets(a), ob = element_byte_offsets(b);
  const auto ia = static_cast<int64_t>(a.itemsize()), ib = static_cast<int64_t>(b.itemsize());
  // Two sorted lists of intervals [o, o + item): walk both, advancing the one that ends first.
  size_t i = 0, j = 0;
  while (i < oa.size() && j < ob.size()) {
    if (oa[i] + ia <= ob[j]) {
      ++i;
    } else if (ob[j] + ib <= oa[i]) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

bool may_share_memory(const at::Tensor& a, const at::Tensor& b) {
  auto* ia = maybe_get_impl(a);
  auto* ib = maybe_get_impl(b);
  if (ia == nullptr || ib == nullptr || &ia->alias_storage() != &ib->alias_storage()) return false;
  // One tensor passed as both, even with no element: an out= resize grows it under the read, and
  // eager then reads memory it has just allocated (torch.mean(x, 0, keepdim=True, out=x) with an
  // empty x gave 0 or garbage eagerly, nan functionally: fuzzer programs 402197, 405562).
  if (a.is_same(b)) return true;
  if (a.numel() == 0 || b.numel() == 0 || a.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      b.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  const ByteSpan sa = byte_span(a), sb = byte_span(b);
  if (!(sa.begin < sb.end && sb.begin < sa.end)) return false;
  return elements_overlap(a, b);
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.itemsize() == b.itemsize() && a.storage_offset() == b.storage_offset() &&
         a.sizes() == b.sizes() && a.strides() == b.strides();
}

// The pair check of the Note: argument `read_index` (list position read_position) against the
// written argument `written_index` (list position written_position), both of one alias storage.
void check_pair(bool elementwise, bool keeps_identical, const std::string& op_name,
                const c10::FunctionSchema& schema, const at::Tensor& written, int written_index,
                size_t written_position, const at::Tensor& read, int read_index,
                size_t read_position) {
  if (read_index == written_index) return;
  if (keeps_identical && read.is_same(written)) return;
  if (elementwise && read_position == written_position && same_geometry(read, written)) return;
  TORCH_CHECK_NOT_IMPLEMENTED(
      !may_share_memory(written, read), "functionalize: ", op_name, ": '",
      schema.arguments()[read_index].name(), "' shares memory with '",
      schema.arguments()[written_index].name(),
      "', which the op writes; eager's result then depends on the order its kernel reads and "
      "writes, which a functional program cannot reproduce. Pass a clone of '",
      schema.arguments()[read_index].name(), "' (or write into a fresh tensor).");
}

// Calls fn(tensor, position) on each defined tensor of a tensor or list argument; position is
// the index within the list (0 for a lone tensor).
template <typename Fn>
void for_each_positioned_tensor(const c10::IValue& v, Fn&& fn) {
  size_t position = 0;
  if (v.isTensor()) {
    if (v.toTensor().defined()) fn(v.toTensor(), position);
    return;
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined()) fn(t, position);
      ++position;
    }
    return;
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toList()) {
      if (e.isTensor() && e.toTensor().defined()) fn(e.toTensor(), position);
      ++position;
    }
  }
}

void check_no_read_of_written_memory(const OpInfo& info, const c10::FunctionSchema& schema,
                                     const std::vector<c10::IValue>& args) {
  // Written wrappers sorted by alias storage, so a _foreach_ call over N tensors costs
  // O(N log N) pointer comparisons, not N * N.
  struct Written {
    const AliasStorage* storage;
    at::Tensor tensor;
    int index;
    size_t position;
  };
  c10::SmallVector<Written, 4> written;  // no heap allocation for the usual one or two
  for (const auto& w : info.written) {
    for_each_positioned_tensor(args[w.index], [&](const at::Tensor& t, size_t position) {
      if (auto* impl = maybe_get_impl(t)) {
        written.push_back({&impl->alias_storage(), t, w.index, position});
      }
    });
  }
  if (written.empty()) return;
  const auto by_storage = [](const Written& a, const Written& b) { return a.storage < b.storage; };
  std::sort(written.begin(), written.end(), by_storage);
  for (size_t j = 0; j < args.size(); ++j) {
    for_each_positioned_tensor(args[j], [&](const at::Tensor& read, size_t position) {
      auto* impl = maybe_get_impl(read);
      if (impl == nullptr) return;
      const Written key{&impl->alias_storage(), {}, 0, 0};
      const auto [lo, hi] = std::equal_range(written.begin(), written.end(), key, by_storage);
      for (auto it = lo; it != hi; ++it) {
        check_pair(info.elementwise, info.keeps_identical_arguments, info.name, schema, it->tensor,
                   it->index, it->position, read, static_cast<int>(j), position);
      }
    });
  }
}

}  // namespace

void check_read_of_written(const c10::OperatorName& op_name, const at::Tensor& written,
                           int written_index, const at::Tensor& read, int read_index) {
  auto* wi = maybe_get_impl(written);
  auto* ri = maybe_get_impl(read);
  if (wi == nullptr || ri == nullptr || &wi->alias_storage() != &ri->alias_storage()) return;
  // Rare path (two arguments of one alias storage): the op's classification is looked up here.
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(op_name.name.c_str(),
                                                                 op_name.overload_name.c_str());
  const OpInfo info = classify(op);
  check_pair(info.elementwise, info.keeps_identical_arguments, info.name, op.schema(), written,
             written_index, 0, read, read_index, 0);
}

c10::IValue functional_arg(const ArgSource& src, const c10::Argument& schema_arg,
                           const std::vector<c10::IValue>& args, const at::Tensor& first_out) {
  switch (src.kind) {
    case ArgSource::FromMutableArg:
      return args[src.index];
    // See Note [Schema: reductions into an out= of another dtype].
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

bool is_real(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_meta() &&
         !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
         !t.key_set().has_any(c10::python_ks |
                              c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                                   c10::DispatchKey::FuncTorchGradWrapper}));
}

namespace {

// Note [Kernel: out= strides in graphs]
// Without views a traced program's values keep their *_copy layout (reordered only when nothing
// records: Note [Wrapper: values in eager's stride order without views]), so an out= tensor
// resized to the functional result took that layout's strides, not eager's:
// torch.add(x.diagonal(-1, 0, 1), 0.0, out=y) left the caller's y with strides (2, 1) where eager
// gives (1, 2) (fuzzer programs 511351, 511801, 502651: about 1 graph in 5,000). And with views or
// without, an out= kernel that is not structured (fft.*, abs of a complex tensor) leaves
// resize_output's contiguous strides where the functional result has others (fuzzer program
// 531362; Note [Kernel: strides of a resized out= tensor]). So when a traced out= tensor is
// resized, eager's strides are read off the out= op itself, run hidden from the tracer on real
// copies of its arguments in the wrappers' reported geometry (eager's) with a private out, and a
// dense value is laid out in them before the write (empty_strided + copy in the graph), so the
// resize and the epilogue take them. That run costs a second op at trace time, never in the
// graph. Where the values are not real tensors (fake or symbolic tracing) or the op is seeded
// random (a run would draw), the functional op is run on meta tensors of that geometry instead,
// without views only: it gives the structured kernels' strides.
// Rejected: reordering every traced value (a copy per op in every graph); running the out= op
// itself on meta (meta's resize disagrees with CPU's, as
// Note [Kernel: strides of a resized out= tensor] found).

// The out= op run untraced on real copies of `args` (wrappers and plain tensors) in their
// reported geometry, each written out= tensor a private fresh_out_like: eager's results, or
// nullopt where that cannot be done.
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
        if (has_internal_overlap(t)) {
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

void out_results_in_eager_strides(const OpInfo& info, const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& args, Stack& fstack,
                                  bool views_kept) {
  bool resizes = false;
  for (const auto& w : info.written) {
    const auto& v = fstack[w.functional_return];
    resizes |= w.is_out && args[w.index].isTensor() && v.isTensor() &&
               !args[w.index].toTensor().unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
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

}  // namespace

void check_eager_rules(std::string_view op_name, const at::Tensor& written, const at::Tensor& value,
                       bool resizes) {
  TORCH_CHECK(resizes || written.sym_sizes() == value.sym_sizes(), "functionalize: ", op_name,
              ": output with shape ", written.sym_sizes(), " doesn't match the broadcast shape ",
              value.sym_sizes(),
              " (an in-place op cannot change the shape of the tensor it writes to).");
  TORCH_CHECK(c10::canCast(value.scalar_type(), written.scalar_type()), "functionalize: ", op_name,
              ": result type ", value.scalar_type(), " can't be cast to the desired output type ",
              written.scalar_type(), ".");
  // An out= tensor of the wrong shape is resized by eager; a view cannot be resized here (its
  // new extent would overwrite its base's other elements, which no view inverse expresses).
  // Found by tools/fuzz.py: it failed inside the scatter with torch's size-mismatch message.
  if (resizes && written.sym_sizes() != value.sym_sizes()) {
    auto* impl = maybe_get_impl(written);
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl == nullptr || impl->chain().empty(), "functionalize: ", op_name,
        ": the out= tensor is a view of another tensor and has shape ", written.sym_sizes(),
        " where the result has shape ", value.sym_sizes(),
        "; resizing a view is not supported. Pass an out= tensor of the result's shape, or a "
        "fresh tensor.");
  }
}

// See Note [Kernel: views of captured tensors] for the second check.
namespace {
// A tensor with static sizes and no element: writing it changes nothing.
// See Note [Kernel: writes of no element].
bool is_empty_static(const at::Tensor& t) {
  return !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && t.numel() == 0;
}
}  // namespace

void check_writable(std::string_view op_name, std::string_view arg_name, const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  TORCH_CHECK(impl != nullptr, "functionalize: ", op_name,
              ": cannot write functional values into the plain tensor passed as '", arg_name,
              "' (a tensor created outside the function, e.g. a global). Pass it to the "
              "function as an input, or clone it inside the function first.");
  TORCH_CHECK(!impl->alias_storage().captured(), "functionalize: ", op_name,
              ": cannot write through '", arg_name,
              "', a view of a tensor captured from outside the function (a parameter, buffer "
              "or global) that the function does not own (a view of it with "
              "remove=\"mutations_and_views\", or a tensor set_ onto its storage): the write "
              "would not reach that tensor. Pass the tensor to the function as an input; for "
              "views, remove=\"mutations\" also works.");
  // See Note [Alias: writes through an overlapping view]: without views the step-by-step
  // inverse of expand sums the copies of each element, so such a write would be wrong.
  if (!impl->chain().empty() && !impl->chain().back()->reapply && !is_empty_static(t)) {
    static const c10::OperatorName expand{"aten::expand", ""};
    const auto steps = impl->chain().steps();
    for (size_t i = 0; i + 1 < steps.size(); ++i) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          steps[i]->op.operator_name() != expand, "functionalize: ", op_name, ": writing through '",
          arg_name,
          "', a view of an expanded tensor, is not supported with "
          "remove=\"mutations_and_views\" (the write would be summed over the expanded copies). "
          "Use remove=\"mutations\", or write to the tensor before expanding it.");
    }
  }
  TORCH_CHECK(impl->value().layout() != c10::kStrided ||
                  t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || !has_internal_overlap(t),
              "functionalize: ", op_name, ": the tensor passed as '", arg_name,
              "' has internal overlap (more than one element refers to the same memory "
              "location: sizes ",
              t.sizes(), ", strides ", t.strides(),
              ", e.g. from expand, unfold with size > step or as_strided), so the result "
              "of writing to it is not defined. Clone it before writing.");
}

// No tracer, torch.func transform or tensor subclass records ops on `value`, and autograd does
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

// Note [Kernel: out= resize]
// torch.cumsum(v, 0, out=x) with x of another shape: eager's resize_output resizes x in place
// (resize_: the storage keeps the elements x no longer covers, and views of x keep seeing them),
// then writes. Replacing x's value by the result instead dropped those elements, and views of x
// then regenerated from the new shape (wrong values, found by the fuzzer). So an out= tensor of
// another shape is resized through the resize_ rule first (an as_strided step over its storage,
// replayed on the input by the epilogue), then written like any in-place op. Symbolic shapes keep
// the replacement (the resize_ rule needs concrete sizes).
// Note [Kernel: strides of a resized out= tensor]
// After resize_output, eager's structured out= kernels (TensorIterator ops, matmuls, reductions)
// restride the output they resized to the strides the op computes, which the functional variant
// returns too: torch.floor(x.t(), out=y) leaves y transposed. So a resized out= tensor takes the
// value's strides when the value is dense and fits the resized storage (fuzzer program 74 and
// kin). Not every out= kernel restrides: measured over OpInfo's out= samples with a transposed
// input (torch 2.13 CPU), eager's out strides equal the functional result's in 874 of 943 cases;
// the 69 others (fft.*, cholesky, slice_scatter, linalg.tensorinv: not structured) keep
// resize_output's contiguous strides. Those the out= kernel itself gives: eagerly by rerunning it
// (Note [Kernel: out= of another dtype, eagerly]), in graphs by running it at trace time
// (Note [Kernel: out= strides in graphs]).
// Rejected: contiguous strides always (what we did first): wrong in 296 of those 943 cases.
// Rejected: reading eager's strides off the out= op run on meta tensors: meta's resize disagrees
// with CPU's for TensorIterator ops (abs(x.t(), out=) is (1, 4) on CPU, (3, 1) on meta).
// Note [Kernel: writes keep the written tensor's strides]
// Eager writes in place: the written tensor keeps its strides. The functional variant returns its
// own layout, which for a tensor that is not dense (x.select_scatter(..) of a strided input keeps
// stride 2; empty_strided) is contiguous, so after y.atan_() or torch.neg(y, out=y) the wrapper
// reported strides eager's y does not have (fuzzer program 162). A base wrapper (its value is
// not regenerated from a view chain) whose new value differs in the strides of a dimension of
// size > 1 receives the value copied into its own geometry: copy(empty_strided(..), value), both
// functional, in the graph too. Views need nothing: their value is regenerated from the base.
// With views kept, strides that differ only in dimensions of size 1 are eager's too, through a
// view of the value (no copy): x = b.t() of a (6, 1) b has strides (1, 1) and the value (6, 1),
// and x.adjoint().view(torch.int16) raised where eager's last stride is 1 (fuzzer program 503303).
// Rejected: keeping reference strides beside the value, as without views: the inner value's
// layout is what later ops and the epilogue see, so it must be eager's.
// Note [Kernel: writes of no element]
// A write into a tensor with no element (v[1:1].cumsum_(0), an empty narrow of an expanded input)
// changes nothing in eager. Committed like any write, its view inverse still ran: expand's sums
// the written view over the expanded dimension, so an empty write through x.expand(3) tripled x
// (fuzzer program 100622). Such a write is dropped: no commit, no generation, no epilogue copy.
void write_back(const at::Tensor& wrapper, const at::Tensor& value_in, bool counts_version) {
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
    static const auto resize_op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::resize_", "");
    const bool dense = value.layout() == c10::kStrided && value.is_non_overlapping_and_dense();
    resize_functional(c10::toString(resize_op.operator_name()), wrapper, value.sizes().vec(),
                      c10::IValue(), *layer, dense ? value.strides() : c10::IntArrayRef(),
                      /*overwritten=*/true);
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

// Note [Kernel: in-place writes to a bool view of other bytes]
// v = x.view(torch.bool) of a float (or complex, int32) x holds bytes that are not 0 or 1, and
// v[idx] = True (index_put_), masked_fill_ and the like write some of them only. The functional
// variant starts from a copy of v, and torch's bool copy turns every byte it copies into 0 or 1,
// so the bytes the op did not write changed too: x's other elements came back as tiny floats
// (fuzzer program 587134, both modes). Writes through a further view of v scatter bytes as
// uint8 (Note [Alias: writes through a bool view of other bytes]); this is the write to v itself.
// When nothing records the program, the in-place op runs as called on a byte-exact private copy
// of v (cloned as uint8): eager's bytes by construction. A graph has no functional op that keeps
// them, and without views v's value is a bool copy already, so there the write is refused by
// name, unless the op overwrites every element with values of its own (copy_, fill_, zero_:
// eager's bytes are then all 0 or 1 too); a view of a 1-byte tensor (a uint8 mask seen as bool)
// is exempt, as in that Note. "Nothing records" is the condition of:
// See Note [Kernel: in-place on the inner value]
// Rejected: comparing the result's bytes with the old ones afterwards (a write of True over a
// byte that was 0x3F and a byte left alone look the same).
bool is_bool_view_of_wider_bytes(const at::Tensor& wrapper) {
  if (C10_LIKELY(wrapper.scalar_type() != c10::kBool)) return false;
  auto* impl = maybe_get_impl(wrapper);
  return impl != nullptr && impl->alias_storage().base().itemsize() > 1;
}

namespace {

std::optional<at::Tensor> write_bool_bytes_in_place(const OpInfo& info,
                                                    const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args,
                                                    const std::vector<c10::IValue>& inner,
                                                    const Layer& layer) {
  if (info.written.size() != 1 || info.written[0].is_out) return {};
  const auto& w = info.written[0];
  if (w.functional_return != 0 || !args[w.index].isTensor() || !inner[w.index].isTensor()) {
    return {};
  }
  const at::Tensor& value = inner[w.index].toTensor();
  if (!is_bool_view_of_wider_bytes(args[w.index].toTensor()) || value.layout() != c10::kStrided) {
    return {};
  }
  auto* impl = unsafe_get_impl(args[w.index].toTensor());
  if (!layer.reapply_views || !nothing_records(value)) {
    // Ops that overwrite every element of v with values of their own lose nothing: eager's
    // bytes are all 0 and 1 too. Not pointwise ops in general: some are no-ops on bool
    // (nan_to_num_ left eager's bytes alone, fuzzer program 594302).
    static const std::array<c10::OperatorName, 4> whole{
        c10::OperatorName{"aten::copy_", ""}, c10::OperatorName{"aten::fill_", "Scalar"},
        c10::OperatorName{"aten::fill_", "Tensor"}, c10::OperatorName{"aten::zero_", ""}};
    if (std::find(whole.begin(), whole.end(), op.operator_name()) != whole.end()) return {};
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      layer.reapply_views && nothing_records(value), "functionalize: ", info.name,
      " of a bool view of a ", impl->alias_storage().base().scalar_type(),
      " tensor (x.view(torch.bool)) is not supported ",
      layer.reapply_views ? "while the program is traced" : "with remove=\"mutations_and_views\"",
      ": the op may leave some of its bytes unwritten, and its functional form would turn those "
      "into 0 or 1. "
      "Write through x.view(torch.uint8) instead",
      layer.reapply_views ? "." : ", or use remove=\"mutations\".");
  at::Tensor bytes = value.view(c10::kByte).clone().view(c10::kBool);
  std::vector<c10::IValue> call = inner;
  call[w.index] = bytes;
  op.callBoxed(call);
  return bytes;
}

}  // namespace

// Note [Kernel: out= of another dtype, eagerly]
// torch.logsumexp(x_f32, 0, out=y_f64) sums in float64 inside its out= kernel (it writes into
// out and works on), while the functional logsumexp computes in float32 and the write casts: the
// last digits differ (fuzzer programs 403244, 419591). Reductions with a dtype argument get out's
// dtype through their plan (Note [Schema: reductions into an out= of another dtype]); for the
// others, when the functional result's dtype is not out's and nothing records the program (the
// conditions of Note [Kernel: in-place on the inner value]), the out= op itself runs on the
// inner arguments into a private tensor of out's geometry and dtype, and its result is the value:
// eager's numbers by construction. Seeded random ops are left alone (a second run would draw
// again). Under a tracer the graph keeps the functional op and the cast.
// The same rerun gives a resized out= tensor eager's strides. Structured kernels restride the
// output they resize to the result's strides (Note [Kernel: strides of a resized out= tensor]),
// the others keep resize_output's contiguous ones, and which kind an op has can depend on the
// dtype: abs of a float tensor is a TensorIterator kernel, abs of a complex one computes aside and
// copies into the resized out (fuzzer program 531362; fft.* likewise). Nothing at runtime says
// which, and the kernel itself does: so an out= tensor whose shape differs from the functional
// result's is computed by the out= kernel too, at the cost of a second run of the op, paid only
// when out is resized (an empty out, mostly).
// Rejected: listing such ops by name (logsumexp, and whichever others accumulate in out; the
// non-structured out= kernels, which vary with dtype and torch version).
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

namespace {

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

// eager's copy_ early exit: self and src are the same tensor, or alias the same elements.
bool copies_onto_itself(const at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return true;
  auto* a = maybe_get_impl(self);
  auto* b = maybe_get_impl(src);
  if (a == nullptr || b == nullptr || &a->alias_storage() != &b->alias_storage() ||
      self.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      src.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  // Without views a wrapper's bits are its *_copy value's (resolved): eager's conjugate and
  // negative bits are the parity of the bit steps in its chain (x.conj().copy_(x) writes, fuzzer
  // program 1003330).
  return self.storage_offset() == src.storage_offset() && self.sizes() == src.sizes() &&
         self.strides() == src.strides() && self.scalar_type() == src.scalar_type() &&
         self.is_conj() == src.is_conj() && self.is_neg() == src.is_neg() &&
         a->chain().bit_flips() == b->chain().bit_flips();
}

// See Note [Schema: argument plan] for the plan this follows.
void run_mutable(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                 const Layer& layer, bool on_wrappers) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t num_returns = schema.returns().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  torch::jit::drop(*stack, num_args);
  // Eager's copy_ returns at once when src is self, or a view of the same elements with the same
  // dtype and bits; the functional copy would still convert the values (x.view(torch.bool).copy_
  // of itself turned float bytes into 0/1, fuzzer program 550374; v.transpose(0, 0).copy_(v) of
  // a bool view of int64 bytes, 985873). Wrappers of one storage share its AliasStorage, and
  // report eager's geometry in both modes.
  static const c10::OperatorName copy_inplace{"aten::copy_", ""};
  if (num_args >= 2 && args[0].isTensor() && args[1].isTensor() &&
      op.operator_name() == copy_inplace &&
      copies_onto_itself(args[0].toTensor(), args[1].toTensor())) {
    torch::jit::push(*stack, args[0]);
    return;
  }

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
  bool filled = false;  // See Note [Kernel: random fills of strided tensors in graphs].
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
      fstack.emplace_back(std::move(*filled));
    } else if (auto bytes = write_bool_bytes_in_place(info, op, args, inner, layer)) {
      fstack.emplace_back(std::move(*bytes));
    } else {
      check_whole_elements_for_clone(info, inner);
      push_functional_args(inner);
      info.functional_op->callBoxed(fstack);
      rerun_out_eagerly(info, op, args, inner, fstack);
      // Untraced without views, the rerun above reads values that may not be in their reported
      // geometry (an expanded view's *_copy is materialized): torch.abs(x.as_strided(.., (1, 0,
      // 1)), out=y) resized y contiguous where eager follows the expanded input (fuzzer program
      // 808368). Then the correction of Note [Kernel: out= strides in graphs] applies untraced
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
                  check_eager_rules(info.name, t, v, /*resizes=*/w.is_out);
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
  check_no_read_of_written_memory(info, schema, args);
  for (const auto& w : info.written) {
    zip_written(
        args[w.index], fstack[w.functional_return],
        [&](const at::Tensor& t, const at::Tensor& v) { write_back(t, v, info.bumps_versions); });
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

// Note [Kernel: composite out= ops of another dtype in graphs]
// torch.logsumexp(x_int, 0, out=y_f64) sums into y in float64 inside its out= kernel, which is a
// CompositeExplicitAutograd composite (amax, sub, exp_, sum.out into y, log_, add_). Eagerly its
// kernel is rerun (Note [Kernel: out= of another dtype, eagerly]); a graph kept the functional
// logsumexp, computed in float32, and a cast, and differed from eager in the last bits (fuzzer
// program 540260; torch.func's graph does the same). No functional op computes what that kernel
// does, but its decomposition is made of ops we functionalize one by one, each exactly (sum.out
// into a float64 out becomes sum(.., dtype=float64)). So in graphs an out= op whose kernel for
// the out's backend is such a composite (CompositeExplicitAutograd[NonFunctional], no backend
// kernel), and whose functional result (found on meta tensors) has out's sizes but not its
// dtype, runs that composite on the wrappers, and the graph records its ops. An out= tensor that
// the op resizes is resized first, by our resize_ rule (Note [Kernel: resize_]; eager's
// resize_output is resize_ to the result's sizes), since the composite's own resize_output cannot
// resize a wrapper's storage (stack.out into an empty out raised "storage that is not resizable",
// fuzzer program 620332); the composite then finds out at its size.
// Rejected: decomposing every composite out= op in graphs (graphs would lose the one op torch's
// own functionalization records, for no change of value).
namespace {
struct CompositeOut {
  c10::DispatchKey key;
  std::optional<std::vector<int64_t>> resize_to;  // the result's sizes, where out has others
};

// The composite key of `op`'s out= kernel (CompositeExplicitAutogradNonFunctional in torch 2.13,
// where logsumexp.out is registered; CompositeExplicitAutograd is checked too, as the key a
// composite out= kernel may be registered under), where the op decomposes into ops we
// functionalize; nullopt otherwise. See the Note above.
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
}  // namespace

void mutable_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                    const Layer& layer) {
  // See Note [Kernel: composite out= ops of another dtype in graphs]. (The schema test first:
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
