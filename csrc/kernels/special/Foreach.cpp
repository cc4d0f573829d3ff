// The in-place _foreach_ row: lists whose elements alias each other are applied one index at a
// time, as eager's loop does.
// See Note [Kernel: _foreach_ ops on aliased lists].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/MemoryOverlap.h"
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

bool is_inplace_foreach(const c10::OperatorHandle& op) {
  return op.operator_name().name.rfind("aten::_foreach_", 0) == 0 && writes_an_argument(op) &&
         op.schema().returns().empty();
}

namespace {

const AliasStorage* alias_of(const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  return impl != nullptr ? &impl->alias_storage() : nullptr;
}

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
    const bool written = is_written(args[j]);
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

// The op as called on the inner values, when every written element may be written in place
// (Note [Kernel: in-place on the inner value]); eager's own kernel then also gives eager's answer
// for aliased lists. Returns false, having changed nothing it could not redo, to take the
// functional path (which reports errors in eager's words under the op's name).
bool foreach_in_place(const c10::OperatorHandle& op, Stack* stack) {
  const auto& args = op.schema().arguments();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(args.size());
  std::vector<at::Tensor> written;
  for (size_t j = 0; j < args.size(); ++j) {
    if (!is_written(args[j])) continue;
    const c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(j));
    if (!v.isTensorList()) return false;
    for (const at::Tensor& t : v.toTensorList()) {
      if (!can_write_inner_in_place(t)) return false;
      written.push_back(t);
    }
  }
  if (written.empty()) return false;
  Stack inner(first, stack->end());
  for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
  try {
    InnerCallGuard guard;
    op.callBoxed(inner);
  } catch (const c10::Error&) {
    return false;
  }
  inner.clear();
  for (const auto& t : written) commit_written_in_place(t);
  torch::jit::drop(*stack, args.size());
  return true;
}

// Note [Kernel: _foreach_ ops on aliased lists on CUDA]
// The one-index-at-a-time order above is eager's on the CPU. Eager's CUDA kernels for in-place
// _foreach_ ops are fused: one multi-tensor launch whose blocks run all elements concurrently, so
// where a written element overlaps memory that another position reads or writes, eager's result
// depends on block scheduling. Measured on an H100 (docs/cuda.md): _foreach_lerp_([x, y], [y, x],
// 0.25) gives other values than the CPU loop, and two eager runs of _foreach_add_([a, b, a], [1.,
// 2., 3.]) left a + 3 once and a + 1 once: a race, not an order. No functional program restates a
// race, and running eager's own kernel on the values (foreach_in_place) only reproduces one draw of
// it. So on any device but the CPU (and meta, which has no values), lists whose elements overlap
// across positions with a write are refused by name, before the in-place path. Lists that only
// share a storage (disjoint views of one base, the common case of a flat parameter buffer) are not
// a race: no element reads what another writes, so the functional variant is eager's answer and
// they take it, unsplit.
// Overlap is judged by each element's byte extent in its alias storage (offset to last element),
// which counts interleaved but disjoint views (two columns) as overlapping: refused,
// conservatively. Rejected: the functional variant for overlapping lists (reads everything first),
// which is one possible outcome of the race, silently different from what eager gives on another
// run.

// The lists' device where its in-place _foreach_ kernels are fused (not the CPU, not meta), if
// any. Eager requires every list element on one device (a CPU scalars tensor beside CUDA lists is
// not a list), so the first element of the first list decides, in O(1) on the optimizer's path.
std::optional<c10::Device> fused_foreach_device(const c10::OperatorHandle& op,
                                                const torch::jit::Stack& stack) {
  const auto num_args = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  for (auto it = stack.end() - num_args; it != stack.end(); ++it) {
    if (!it->isTensorList()) continue;
    const auto list = it->toTensorList();
    if (list.empty()) return std::nullopt;
    const c10::Device device = list.get(0).device();
    if (device.type() == c10::DeviceType::CPU || device.type() == c10::DeviceType::Meta) {
      return std::nullopt;
    }
    return device;
  }
  return std::nullopt;
}

// Whether an element written by the op overlaps, in memory, a tensor argument at another position
// (or the same position viewed differently); see the Note above for how overlap is judged.
bool foreach_elements_overlap(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  struct Extent {
    const AliasStorage* storage;
    int64_t begin;  // bytes, in the alias storage
    int64_t end;
    int64_t position;  // index in its list; -1 for a tensor outside any list
    bool written;
    at::Tensor tensor;
  };
  std::vector<Extent> extents;
  auto add = [&](const at::Tensor& t, int64_t position, bool written) {
    const auto* storage = alias_of(t);
    if (storage == nullptr || t.numel() == 0) return;
    const Span span = span_of(t);
    extents.push_back({storage, span.begin, span.end, position, written, t});
  };
  const auto& args = op.schema().arguments();
  const auto first = stack.end() - static_cast<std::ptrdiff_t>(args.size());
  for (size_t j = 0; j < args.size(); ++j) {
    const bool written = is_written(args[j]);
    const c10::IValue& v = *(first + static_cast<std::ptrdiff_t>(j));
    if (v.isTensorList()) {
      int64_t i = 0;
      for (const at::Tensor& t : v.toTensorList()) add(t, i++, written);
    } else if (v.isTensor()) {
      add(v.toTensor(), -1, written);
    }
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.storage != b.storage ? std::less<>()(a.storage, b.storage) : a.begin < b.begin;
  });
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& a = extents[i];
    for (size_t j = i + 1; j < extents.size(); ++j) {
      const Extent& b = extents[j];
      if (b.storage != a.storage || b.begin >= a.end) break;
      if (!a.written && !b.written) continue;
      // x written at index i from x at the same index (add_(xs, xs)) is elementwise, not a race.
      const bool same_view = a.position == b.position && a.position != -1 &&
                             same_geometry(a.tensor, b.tensor) &&
                             a.tensor.dtype() == b.tensor.dtype();
      if (!same_view) return true;
    }
  }
  return false;
}

}  // namespace

void foreach_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                    const Layer& layer) {
  const auto fused_device = fused_foreach_device(op, *stack);
  if (fused_device && foreach_lists_alias(op, *stack)) {
    // See Note [Kernel: _foreach_ ops on aliased lists on CUDA]
    TORCH_CHECK_NOT_IMPLEMENTED(
        !foreach_elements_overlap(op, *stack), "functionalize: ", op.operator_name().name,
        ": the tensor lists overlap in memory on ", *fused_device,
        ", where eager's fused kernel runs all elements at once and its result depends on "
        "block scheduling (a race; see docs/cuda.md). Clone the overlapping operands first so "
        "the lists share no memory, or run the op on CPU tensors.");
    if (foreach_in_place(op, stack)) return;
    return generic_kernel(info, op, stack, layer);  // disjoint: the functional variant is eager's
  }
  if (foreach_in_place(op, stack)) return;
  if (foreach_lists_alias(op, *stack)) return foreach_sequential_kernel(op, stack);
  generic_kernel(info, op, stack, layer);
}

}  // namespace tfz::detail
