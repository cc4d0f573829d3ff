// The checks before a write, which leave every tensor untouched when they fail: eager's shape and
// dtype rules for in-place results, what may be written (a wrapper of this layer, not captured,
// without internal overlap), and arguments that read memory the op writes.
// See Note [Kernel: eager errors of in-place ops].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/Layout.h"
#include "core/MemoryOverlap.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/function.h>

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

void check_eager_rules(std::string_view op_name, const at::Tensor& written, const at::Tensor& value,
                       bool resizes) {
  TORCH_CHECK(resizes || written.sym_sizes() == value.sym_sizes(), "functionalize: ", op_name,
              ": output with shape ", written.sym_sizes(), " doesn't match the broadcast shape ",
              value.sym_sizes(),
              " (an in-place op cannot change the shape of the tensor it writes to).");
  TORCH_CHECK(c10::canCast(value.scalar_type(), written.scalar_type()), "functionalize: ", op_name,
              ": result type ", value.scalar_type(), " can't be cast to the desired output type ",
              written.scalar_type(), ".");
  // An out= tensor of the wrong shape is resized by eager, views included: write_back resizes it
  // as resize_ does (kernels/special/Resize.cpp), whose refusals name what cannot be served.
}

// Note [Kernel: functional variants that clone a storage of partial elements]
// torch's functional copy and *_scatter ops start with clone_preserve_strides(self), which asserts
// that self's storage holds a whole number of self's elements. A view in a wider dtype over a
// storage that does not divide (x1 = b[:2] of 3 int32, viewed as int64: 12 bytes) reaches that
// internal assert with remove="mutations", where inner values are views of the caller's storage.
// Eager writes such a view in place without trouble; ours would need another functional form,
// so the write is refused by name before the call, which leaves everything untouched. Without
// views the inner value is a copy, and nothing is refused.
// Rejected: a functional form of our own for such writes (graphs would hold an op torch does not
// have, for a rare view).
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

// Note [Kernel: internal overlap]
// Writing to a tensor some of whose elements share memory (an expand, unfold with size > step,
// an overlapping as_strided) is refused by eager for stride-0 dimensions and unspecified
// otherwise; no inverse can say which of the aliased writes wins. So a write to such a tensor
// raises here, naming the op, instead of computing one arbitrary answer. The test is on the
// wrapper's own (eager) sizes and strides: sorted by stride, every dimension must step past
// everything the smaller ones reach. It is conservative for exotic interleavings (which eager
// itself only handles as "too hard to tell").
// (The test is core/MemoryOverlap.h's may_self_overlap.)
// Rejected: torch's at::has_internal_overlap as the test: it answers Yes only for stride-0
// dimensions and "too hard" for the rest, so a write to an unfold with size > step or an
// overlapping as_strided would pass it and leave the choice of the winning write to an inverse.

namespace {

// A tensor with static sizes and no element: writing it changes nothing.
// See Note [Kernel: writes of no element].
bool is_empty_static(const at::Tensor& t) {
  return !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() && t.numel() == 0;
}

}  // namespace

// See Note [Kernel: views of captured tensors] for the second check.
void check_writable(std::string_view op_name, std::string_view arg_name, const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  TORCH_CHECK(impl != nullptr, "functionalize: ", op_name,
              ": cannot write functional values into the plain tensor passed as '", arg_name,
              "' (a tensor created outside the function, e.g. a global, or computed from such "
              "tensors alone, like global.clone(): an op on plain tensors only gives a plain "
              "tensor) under a tracer or a capture, or together with tensors of the function "
              "(Note [Kernel: writes into captured tensors]). Pass it to the function as an "
              "input, or copy it into a tensor made inside the function: "
              "torch.zeros(t.shape, dtype=t.dtype).copy_(t).");
  if (C10_UNLIKELY(impl->alias_storage().captured())) {
    // A backward formula writing through a view of a temporary of its own (householder_product's
    // backward): the temporary is plain, so without views its view was lifted like a capture.
    const auto node = torch::autograd::get_current_node();
    TORCH_CHECK_NOT_IMPLEMENTED(
        node == nullptr, "functionalize: ", op_name, ": the backward formula of ", node->name(),
        " writes through a view of a temporary of its own, which is not supported with "
        "remove=\"mutations_and_views\". Use remove=\"mutations\".");
  }
  TORCH_CHECK(!impl->alias_storage().captured(), "functionalize: ", op_name,
              ": cannot write through '", arg_name,
              "', a view of a tensor captured from outside the function (a parameter, buffer "
              "or global) that the function does not own (a view of it with "
              "remove=\"mutations_and_views\", or a tensor set_ onto its storage), under a "
              "tracer or a capture, or together with tensors of the function: no graph can "
              "write that tensor (Note [Kernel: writes into captured tensors]). Pass the tensor "
              "to the function as an input.");
  if (C10_UNLIKELY(impl->alias_storage().apart_reason() != nullptr)) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "functionalize: ", op_name, ": cannot write through '",
                                arg_name, "': ", impl->alias_storage().apart_reason(), ".");
  }
  // See Note [Alias: writes through an overlapping view]: without views the step-by-step
  // inverse of expand sums the copies of each element, so such a write would be wrong.
  if (!impl->chain().empty() && !impl->chain().back()->reapply && !is_empty_static(t)) {
    static const c10::OperatorName expand{"aten::expand", ""};
    const auto steps = impl->chain().steps();
    // An expand to sizes of only 1 and -1 (`arange(n).expand((1, -1))`, HF's position_ids
    // buffer) adds or keeps dimensions without repeating an element: its inverse sums nothing.
    const auto repeats = [](const ViewMeta& step) {
      if (step.args.empty() || !step.args[0].isList()) return true;
      for (const c10::IValue& size : step.args[0].toListRef()) {
        if (!size.isInt() || (size.toInt() != 1 && size.toInt() != -1)) return true;
      }
      return false;
    };
    for (size_t i = 0; i + 1 < steps.size(); ++i) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          steps[i]->op.operator_name() != expand || !repeats(*steps[i]), "functionalize: ", op_name,
          ": writing through '", arg_name,
          "', a view of an expanded tensor, is not supported with "
          "remove=\"mutations_and_views\" (the write would be summed over the expanded copies). "
          "Use remove=\"mutations\", or write to the tensor before expanding it.");
    }
  }
  TORCH_CHECK(impl->value().layout() != c10::kStrided ||
                  t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
                  !may_self_overlap(t.sizes(), t.strides()),
              "functionalize: ", op_name, ": the tensor passed as '", arg_name,
              "' has internal overlap (more than one element refers to the same memory "
              "location: sizes ",
              t.sizes(), ", strides ", t.strides(),
              ", e.g. from expand, unfold with size > step or as_strided), so the result "
              "of writing to it is not defined. Clone it before writing.");
}

// Note [Kernel: writes that read their own memory]
// x.masked_scatter_(m, x), torch.amax(x, 0, out=x), torch.matmul(a, b, out=a): the written tensor
// shares memory with an argument the op reads. Eager kernels of such ops read and write that memory
// in their own order (masked_scatter_ reads source elements it has already overwritten, reductions
// and matmuls initialize out before reading), so eager's numbers depend on the kernel, and the
// functional form, which reads every argument before anything is written, cannot give them. Such a
// call raises, naming the op and the argument. Elementwise ops (the pointwise tag, copy_, fill_,
// masked_fill_, where, _foreach_) are allowed one more case: an argument with the written tensor's
// exact geometry (offset, sizes, strides, item size; for lists, at the same position), since each
// element is read just before the same element is written, so x.mul_(x) and x.copy_(x) are the same
// eagerly and functionally. Any other overlap is refused for them too: `v[0::2] += v.diagonal()`
// reads elements an earlier step of the loop wrote; eager refuses it only where its own overlap
// check can decide (contiguous operands) and otherwise returns numbers that depend on its loop
// order.
// "Shares memory" is exact for wrappers of one alias storage: when the byte ranges overlap, the
// elements' byte intervals are compared, so interleaved slices (x[0::2] and x[1::2]) do not count
// as sharing. Above kExactOverlapLimit elements the range overlap alone decides (conservative:
// a refusal, never a wrong number). A custom op's companion runs the op's own kernel on one clone
// per distinct tensor (Note [Kernel: custom mutable ops]), so the same tensor passed twice keeps
// eager's order there and is allowed.
// Rejected: running the op in place on a copy of the storage to get eager's numbers: the graph
// would then hold a mutation, and the numbers a kernel detail.

namespace {

bool may_share_memory(const at::Tensor& a, const at::Tensor& b) {
  auto* ia = maybe_get_impl(a);
  auto* ib = maybe_get_impl(b);
  if (ia == nullptr || ib == nullptr || &ia->alias_storage() != &ib->alias_storage()) return false;
  // One tensor passed as both, even with no element: an out= resize grows it under the read, and
  // eager then reads memory it has just allocated (torch.mean(x, 0, keepdim=True, out=x) with an
  // empty x gives 0 or garbage eagerly, nan functionally).
  if (a.is_same(b)) return true;
  if (a.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      b.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  return spans_and_elements_overlap(a, b);
}

// Whether `read` shares memory with what out= tensor `out` covers once resized to `sizes`
// (contiguous strides at its offset, eager's resize_output), both of one alias storage.
bool shares_memory_once_resized(const at::Tensor& out, c10::IntArrayRef sizes,
                                const at::Tensor& read) {
  if (read.is_same(out)) return true;
  if (out.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      read.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  MetaComputeGuard guard;
  c10::impl::ExcludeDispatchKeyGuard untraced(layer_hidden_keys());
  const auto strides = c10::contiguous_strides(sizes);
  const auto elements = at::detail::computeStorageNbytes(sizes, strides, 1, out.storage_offset());
  const at::Tensor covered =
      at::empty({static_cast<int64_t>(elements)}, out.options().device(c10::kMeta))
          .as_strided(sizes, strides, out.storage_offset());
  return spans_and_elements_overlap(covered, meta_twin(read));
}

// The pair check of the Note: argument `read_index` (list position read_position) against the
// written argument `written_index` (list position written_position), both of one alias storage.
// An out= tensor resized before the kernel writes (`resized_to` other sizes than its own) is
// checked as the kernel writes it: torch.mul(v, x, out=x.view(-1)) of a one-element x grown to
// v's five elements reads x while writing the elements after it, in the kernel's order.
void check_pair(bool elementwise, bool keeps_identical, const std::string& op_name,
                const c10::FunctionSchema& schema, const at::Tensor& written, int written_index,
                size_t written_position, const at::Tensor& read, int read_index,
                size_t read_position, c10::OptionalIntArrayRef resized_to = std::nullopt) {
  if (read_index == written_index) return;
  const bool resized = resized_to.has_value() &&
                       !written.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
                       written.sizes() != *resized_to;
  if (!resized) {
    if (keeps_identical && read.is_same(written)) return;
    if (elementwise && read_position == written_position && same_geometry(read, written)) return;
  }
  const bool shares = resized ? shares_memory_once_resized(written, *resized_to, read)
                              : may_share_memory(written, read);
  TORCH_CHECK_NOT_IMPLEMENTED(
      !shares, "functionalize: ", op_name, ": '", schema.arguments()[read_index].name(),
      "' shares memory with '", schema.arguments()[written_index].name(),
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

}  // namespace

void check_no_read_of_written_memory(const OpInfo& info, const c10::FunctionSchema& schema,
                                     const std::vector<c10::IValue>& args,
                                     const torch::jit::Stack* results) {
  // Written wrappers sorted by alias storage, so a _foreach_ call over N tensors costs
  // O(N log N) pointer comparisons, not N * N.
  struct Written {
    const AliasStorage* storage;
    at::Tensor tensor;
    int index;
    size_t position;
    c10::OptionalIntArrayRef resized_to;  // an out= tensor's result sizes
  };
  c10::SmallVector<Written, 4> written;  // no heap allocation for the usual one or two
  for (const auto& w : info.written) {
    c10::OptionalIntArrayRef resized_to;
    if (w.is_out && results != nullptr && (*results)[w.functional_return].isTensor()) {
      const at::Tensor& result = (*results)[w.functional_return].toTensor();
      if (!result.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) resized_to = result.sizes();
    }
    for_each_positioned_tensor(args[w.index], [&](const at::Tensor& t, size_t position) {
      if (auto* impl = maybe_get_impl(t)) {
        written.push_back({&impl->alias_storage(), t, w.index, position, resized_to});
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
                   it->index, it->position, read, static_cast<int>(j), position, it->resized_to);
      }
    });
  }
}

void check_read_of_written(const c10::OperatorName& op_name, const at::Tensor& written,
                           int written_index, const at::Tensor& read, int read_index,
                           c10::OptionalIntArrayRef resized_to) {
  auto* wi = maybe_get_impl(written);
  auto* ri = maybe_get_impl(read);
  if (wi == nullptr || ri == nullptr || &wi->alias_storage() != &ri->alias_storage()) return;
  // Rare path (two arguments of one alias storage): the op's classification is looked up here.
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(op_name.name.c_str(),
                                                                 op_name.overload_name.c_str());
  const OpInfo info = classify(op);
  check_pair(info.elementwise, info.keeps_identical_arguments, info.name, op.schema(), written,
             written_index, 0, read, read_index, 0, resized_to);
}

}  // namespace tfz::detail
