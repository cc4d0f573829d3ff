// Input wrapping with alias groups. See api/InputGroups.h.
#include "api/InputGroups.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/MemoryOverlap.h"
#include "core/Recorder.h"
#include "core/Recording.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace tfz::detail {

namespace {
// A wrapper is an inference tensor exactly when its input is one: under torch.inference_mode()
// a wrapper made of an ordinary input would otherwise be an inference tensor, which counts no
// writes (Note [Inputs: version counters]).
at::Tensor wrap_input(const at::Tensor& value, const at::Tensor& input, int64_t layer_id) {
  if (C10_UNLIKELY(c10::InferenceMode::is_enabled() != input.is_inference())) {
    c10::InferenceMode as_the_input(input.is_inference());
    return make_fresh_wrapper(value, layer_id);
  }
  return make_fresh_wrapper(value, layer_id);
}
}  // namespace

// Note [Inputs: aliased inputs]
// f(x, x.view(-1)), f(x, x[1:]), f(x, x.t()), f(x, x): in eager a write through one argument is
// visible through the other. torch.func.functionalize wraps each argument with its own storage,
// so inside f the other argument keeps its old value (wrong numbers). Here arguments that share a
// storage are grouped: the group gets one synthetic base, the whole storage seen as a flat 1-D
// tensor (as_strided(first, [numel], [1], 0), or its _copy when views are removed), and each
// member becomes a view of it through one as_strided(size, stride, offset) step. A write through
// any member is then committed to the shared base with as_strided_scatter and the other members
// regenerate from it, exactly like ordinary views. Members report their original metadata.
// The epilogue writes a group back once, through a member that covers all the others (dense, and
// its span contains theirs: typical for x with x.view(-1) / x[1:] / x.t()); when none does (two
// overlapping slices), each member is written, which writes shared elements with equal values.
// The base holds the storage's physical elements: a member with the conjugate or negative bit
// (x with x.conj()) gets a _conj / _neg_view step after its as_strided, and the base is built with
// the first member's bits undone. Members of different dtypes (x with x.view(torch.int32)) share
// a byte base (the flat storage viewed as uint8); each member is then view(dtype) of it before its
// as_strided, so a float write is seen as int32 bits through the other member, as in eager. The
// base's dtype is the smallest member's, so every member's bytes lie inside it.
// Members with symbolic sizes (torch.compile(dynamic=True), make_fx's symbolic mode) or of
// another layout cannot be grouped (the base's size and the members' steps need concrete
// storage coordinates): each keeps a storage of its own, and a write through any of them (or
// their views) is refused by name, since it would not be seen through the others; reads are
// right.
// Rejected: wrapping mixed-dtype members independently with a warning (what torch.func does): a
// write through one is silently not seen through the other. (Members that cannot be grouped had
// that warning too, and gave wrong values under torch.compile(dynamic=True).)
// Rejected: AOTAutograd's "synthetic base" as an extra graph input: a calling convention change
// that user code calling functionalize(f) directly could not follow.

namespace {

// Note [Inputs: inputs that do not start their storage]
// Storage coordinates (as_strided's offset, resize_'s room to grow, the elements a shrunk input
// keeps) are only right on a base whose element i is the storage's element i. An input that is
// its whole storage, densely from offset 0 (the usual case), is such a base, and so is every new
// value a write gives it (same sizes, dense). An input like b[1:] or b[::2] is not: its base starts
// at b's element 1, and after a write its fresh value starts at 0, so x.add_(1);
// x.as_strided((2,), (1,), 1) would read the wrong elements. Such an input gets
// the base aliased inputs get (Note [Inputs: aliased inputs]): the flat storage, with the input
// as one as_strided view of it. That costs a scatter into the storage per write, so it is done
// only when the storage is at most twice the input's extent plus 4 KiB; a slice of a large
// buffer (a KV cache's used part), and an input with no element inside a storage that has some
// (b[1:] of a one-row b), keep their own base, marked offset_base: as_strided and
// as_strided_ on it and its views are refused by name (their inverse would write the base's
// coordinates, not the storage's), and resize_ past its end too (Note [Kernel: resize_]).
// Rejected: the flat base for every such input (a decode step writing one row of a slice
// would scatter into the whole cache); translating offsets at each as_strided (only possible for
// inputs without gaps, and every view inverse would need it too).
constexpr const char* kApart =
    "it is (a view of) an input that shares its storage with another input, and inputs with "
    "symbolic sizes (torch.compile(dynamic=True), make_fx's symbolic mode) or of another layout "
    "than strided are functionalized apart, so the write would not be seen through the other "
    "(Note [Inputs: aliased inputs]). Pass them with static sizes (torch.compile(..., "
    "dynamic=False)), or pass the tensor they view once and take the views inside the function";

constexpr const char* kInsideLargerStorage =
    "the tensor is (a view of) an input that starts inside a larger storage (e.g. a slice of a "
    "big buffer), and as_strided addresses that storage's elements, which the function does not "
    "see. Pass the whole buffer as the input";

// Note [Inputs: storage coordinates under a tracer]
// make_fx's graphs carry no input guards, so what a graph reads of an input's layout must hold
// on any input of its sizes, or the graph must check it. The flat base reads the input's
// storage as it is at trace time: as_strided(x, [storage numel], [1], 0) and the input's offset
// become constants, so a graph traced on batch[0] and replayed on batch[3] read batch[0]'s
// elements, silently, and torch's own tracers hand such inputs to us (scan traces its body on
// clone_input's padded copies). Under a Python tracer (traced_without_guards()):
//  - A lone input that does not span its storage keeps its own base, marked offset_base like a
//    slice of a large buffer: the graph reads the input itself and is right on any input of its
//    sizes; as_strided on it is refused by name. Not one whose elements overlap
//    (b.as_strided((2, 2), (1, 1))): a copy of its elements would let a write to one of them
//    miss the others that are the same memory.
//  - The flat bases left (an input whose elements overlap, as an expanded one's do; inputs
//    sharing a storage) start the graph with a tfz::_guard_layout node per
//    member: strides, offset, the storage's size and the storage it shares, checked on replay.
//  - A lone input whose layout the program depends on (as_strided, resize_, a write through
//    unfold, a metadata change the epilogue replays as as_strided_ with its offset) gets that
//    guard where it first does (core/LayoutGuards.h): x.t_() traced at offset 0 would move a
//    replayed x at offset 3 to offset 0. So does any tensor a seeded random fill draws into in
//    an order measured on its traced strides (Note [Kernel: random fills of strided tensors]),
//    which may follow an input's (dropout's mask of a transposed x).
// capture keeps the flat base for every input: its graphs check the offset and the storage's size
// before each replay (Note [Capture: guards on inputs]). What make_fx itself specializes stays
// make_fx's: one tensor passed twice is one placeholder in its graph (the last), and a reshape that
// copied a non-contiguous input is a copy on any input.
// Rejected: the flat base under make_fx with no guard (right only on inputs laid out like the
// traced one, with nothing to say so); guards on every input (a graph traced on batch[0] would
// refuse batch[3], and make_fx graphs would gain a node per input that torch.func's do not have).
constexpr const char* kTracedInsideStorage =
    "the tensor is (a view of) an input that does not span its storage, and under make_fx (whose "
    "graphs check nothing about their inputs) as_strided on it would put that storage's size and "
    "the input's offset into the graph as constants, wrong on inputs laid out otherwise ("
    "Note [Inputs: storage coordinates under a tracer]). Call the function without tracing, use "
    "capture(f, ...), whose graphs check the storage's layout before each replay, pass the whole "
    "buffer as the input";

// An offset input's own base starts at the input's first element, the caller's storage element at
// its offset: what a storage grown from it counts from (Note [Inputs: writes to a grown storage]).
void note_caller_origin(const at::Tensor& input, const at::Tensor& wrapper) {
  if (input.has_storage() && !input.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    const bool tail_covered =
        input.is_non_overlapping_and_dense() &&
        (input.storage_offset() + input.numel()) * static_cast<int64_t>(input.itemsize()) ==
            static_cast<int64_t>(input.storage().nbytes());
    auto& storage = unsafe_get_impl(wrapper)->alias_storage();
    storage.set_caller_origin(input.storage_offset(), tail_covered);
    storage.set_caller_input(input);
  }
}

// `traced`: traced_without_guards(), read once per call.
bool wants_flat_base(const at::Tensor& t, bool traced) {
  return flat_base_suits(t) &&
         (spans_its_storage(t) || !traced || may_self_overlap(t.sizes(), t.strides()));
}

// An input with its own base whose storage coordinates are not its base's: one with elements
// that does not start its storage (a slice of a large buffer), or one with no element inside a
// storage that has some, which as_strided can still address (a write through
// x.as_strided((1,), (1,), 4) of an empty x = b[1:, ::2]). An empty input keeps
// its own base rather than the flat one so that an out= op can still grow it as eager does
// (Note [Inputs: writes to a grown storage]).
bool is_offset_input(const at::Tensor& t) {
  if (plain_strided(t)) return !is_whole_storage(t);
  return t.layout() == c10::kStrided && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
         t.has_storage() && t.storage().nbytes() > 0;
}

// Why as_strided is refused on an input with its own base that is_offset_input.
const char* offset_reason(const at::Tensor& t) {
  return flat_base_suits(t) ? kTracedInsideStorage : kInsideLargerStorage;
}

bool can_group(const std::vector<at::Tensor>& members) {
  for (const auto& t : members) {
    if (t.layout() != c10::kStrided || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      return false;
    }
  }
  return true;
}

// Runs `step` on `value` and returns the view wrapper of `base` it gives.
at::Tensor view_step(const at::Tensor& base, at::Tensor& value,
                     std::shared_ptr<const ViewMeta> step) {
  {
    InnerCallGuard guard;
    value = step->forward(value);
  }
  return make_view_wrapper(value, base, std::move(step));
}

std::vector<at::Tensor> wrap_group(const std::vector<at::Tensor>& members, const Layer& layer) {
  const bool reapply = layer.reapply_views;
  // The member with the smallest element: its dtype addresses every byte the others can.
  const at::Tensor* first = &members[0];
  bool mixed = false;
  for (const auto& m : members) {
    mixed |= m.scalar_type() != first->scalar_type();
    if (m.itemsize() < first->itemsize()) first = &m;
  }
  const int64_t numel = static_cast<int64_t>(first->storage().nbytes() / first->itemsize());
  at::Tensor base_value;
  {
    // The storage's physical elements: conjugate and negative bits undone, then (mixed dtypes)
    // seen as bytes. See Note [Inputs: aliased inputs].
    // With views the bits are undone first, as views (no copy). Without, no view may enter the
    // graph, and as_strided_copy of a tensor with a bit goes through the conjugate (negative)
    // fallback, which first copies the tensor's own elements: the storage read from that copy
    // is the input's only where the input is its whole storage; otherwise the copy would be read
    // past its end.
    InnerCallGuard guard;
    if (reapply) {
      at::Tensor physical = *first;
      if (physical.is_conj()) physical = at::_conj(physical);
      if (physical.is_neg()) physical = at::_neg_view(physical);
      base_value = physical.as_strided({numel}, {1}, 0);
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(
          !(first->is_conj() || first->is_neg()) || is_whole_storage(*first),
          "functionalize: inputs that share a storage, one of them a conjugate or negative view "
          "(x.conj()) that is not its whole storage (a row of a buffer, say), are not supported "
          "with remove=\"mutations_and_views\": the storage cannot be read through the bit "
          "without a view op. Use remove=\"mutations\", or pass x.resolve_conj().");
      base_value = at::as_strided_copy(*first, {numel}, {1}, 0);
      if (first->is_conj()) base_value = at::_conj_copy(base_value);
      if (first->is_neg()) base_value = at::_neg_view_copy(base_value);
    }
    if (mixed) {
      base_value = reapply ? base_value.view(at::kByte) : at::view_copy(base_value, at::kByte);
    }
  }
  const at::Tensor base = wrap_input(base_value, *first, layer.id);
  if (!mixed) {
    unsafe_get_impl(base)->alias_storage().mark_flat(reapply);
  } else {
    unsafe_get_impl(base)->alias_storage().mark_bytes(reapply);
  }
  const int64_t base_bytes = numel * static_cast<int64_t>(first->itemsize());
  std::vector<at::Tensor> wrapped;
  for (const auto& m : members) {
    at::Tensor value = base_value;
    at::Tensor w = base;
    if (mixed) {
      const int64_t item = static_cast<int64_t>(m.itemsize());
      const int64_t usable = base_bytes / item * item;
      if (usable != base_bytes) {
        w = view_step(
            w, value,
            ViewMeta::as_strided({c10::SymInt(usable)}, {c10::SymInt(1)}, c10::SymInt(0), reapply));
      }
      w = view_step(w, value,
                    ViewMeta::of({"aten::view", "dtype"}, {c10::IValue(m.scalar_type())}, reapply));
    }
    w = view_step(
        w, value,
        ViewMeta::as_strided(m.sym_sizes(), m.sym_strides(), m.sym_storage_offset(), reapply));
    if (!mixed) {
      unsafe_get_impl(w)->alias_storage().add_member_step(unsafe_get_impl(w)->chain().back());
      unsafe_get_impl(w)->mark_flat_member();
    }
    if (m.is_conj()) w = view_step(w, value, ViewMeta::of({"aten::_conj", ""}, {}, reapply));
    if (m.is_neg()) w = view_step(w, value, ViewMeta::of({"aten::_neg_view", ""}, {}, reapply));
    if (!reapply) unsafe_get_impl(w)->set_reference_metadata_(m);
    wrapped.push_back(std::move(w));
  }
  return wrapped;
}

// Under a Python tracer, a tfz::_guard_layout node per member of a flat base: the graph reads
// them through their storage, so it holds only for inputs laid out as these are
// (Note [Inputs: storage coordinates under a tracer]).
void guard_layouts(const std::vector<at::Tensor>& members, c10::ArrayRef<size_t> indices) {
  for (size_t k = 0; k < members.size(); ++k) {
    record_layout_guard(members[k], indices[k],
                        k == 0 ? std::nullopt : std::optional<at::Tensor>(members[0]));
  }
}

}  // namespace

// Note [Inputs: one tensor passed twice]
// f(x, x) passes one tensor object twice. In eager the two parameters are the same object, so a
// metadata change through one (x1.t_(), x1.resize_(...)) is seen through the other, not only its
// writes. Both parameters therefore get the same wrapper, and the epilogue treats the tensor once
// (replaying its metadata ops twice would undo a t_()).
// Rejected: grouping them as two aliases of one storage (what aliased inputs get): data stays
// shared, but each alias has its own metadata, so x0 would keep its old strides after
// x1.swapaxes_().
std::optional<size_t> same_object(const std::vector<at::Tensor>& tensors,
                                  c10::ArrayRef<size_t> group, const at::Tensor& t) {
  for (size_t j : group) {
    if (tensors[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return j;
  }
  return std::nullopt;
}

std::vector<at::Tensor> wrap_inputs(const std::vector<at::Tensor>& inputs, const Layer& layer) {
  std::vector<at::Tensor> out(inputs.size());
  // Most inputs are alone in their storage: one inline slot per group, no allocation.
  std::unordered_map<const c10::StorageImpl*, c10::SmallVector<size_t, 1>> groups;
  groups.reserve(inputs.size());
  std::vector<const c10::StorageImpl*> order;  // groups in first-appearance order
  order.reserve(inputs.size());
  std::vector<std::pair<size_t, size_t>> repeats;  // (i, j): input i is input j (Note above)
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined()) continue;
    TORCH_CHECK_NOT_IMPLEMENTED(
        !t.is_nested(), "functionalize: input ", i,
        " is a nested tensor, which functionalize does not support. Pass its components "
        "(t.unbind()) and rebuild it inside the function with torch.nested.nested_tensor.");
    if (auto* impl = maybe_get_impl(t)) {
      TORCH_CHECK(impl->layer_id() == layer.id,
                  "functionalize: got a functional tensor that escaped the functionalize call "
                  "that made it as an input. Pass plain tensors.");
      out[i] = t;
      continue;
    }
    const auto* storage =
        t.unsafeGetTensorImpl()->has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    if (storage == nullptr) {
      out[i] = wrap_input(t, t, layer.id);
      continue;
    }
    auto& group = groups[storage];
    if (group.empty()) order.push_back(storage);
    if (auto j = same_object(inputs, group, t)) {
      repeats.emplace_back(i, *j);
      continue;
    }
    group.push_back(i);
  }
  const bool traced = traced_without_guards();
  for (const auto* storage : order) {
    const auto& indices = groups[storage];
    if (indices.size() == 1 && !wants_flat_base(inputs[indices[0]], traced)) {  // the common case
      const size_t i = indices[0];
      out[i] = wrap_input(inputs[i], inputs[i], layer.id);
      if (traced) unsafe_get_impl(out[i])->alias_storage().set_traced_input(inputs[i], i);
      if (is_offset_input(inputs[i])) {
        unsafe_get_impl(out[i])->alias_storage().mark_offset_base(offset_reason(inputs[i]));
        note_caller_origin(inputs[i], out[i]);
      }
      continue;
    }
    std::vector<at::Tensor> members;
    for (size_t i : indices) members.push_back(inputs[i]);
    if ((members.size() == 1 && !wants_flat_base(members[0], traced)) || !can_group(members)) {
      for (size_t i : indices) {
        out[i] = wrap_input(inputs[i], inputs[i], layer.id);
        if (traced && indices.size() == 1) {
          unsafe_get_impl(out[i])->alias_storage().set_traced_input(inputs[i], i);
        }
        if (is_offset_input(inputs[i])) {
          unsafe_get_impl(out[i])->alias_storage().mark_offset_base(offset_reason(inputs[i]));
          note_caller_origin(inputs[i], out[i]);
        }
        if (indices.size() > 1) unsafe_get_impl(out[i])->alias_storage().mark_apart(kApart);
      }
      continue;
    }
    if (traced) guard_layouts(members, indices);  // before the base reads them
    auto wrapped = wrap_group(members, layer);
    for (size_t k = 0; k < indices.size(); ++k) out[indices[k]] = wrapped[k];
  }
  for (const auto& [i, j] : repeats) out[i] = out[j];
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || maybe_get_impl(t) != nullptr) continue;
    auto* impl = unsafe_get_impl(out[i]);
    impl->mark_input();
    if (t.unsafeGetTensorImpl()->has_storage()) {
      impl->alias_storage().mark_caller_storage(t.storage().unsafeGetStorageImpl());
    }
    // See Note [Inputs: version counters].
    if (t.unsafeGetTensorImpl()->version_counter().enabled() && impl->version_counter().enabled()) {
      impl->set_version_counter(c10::VariableVersion(t._version()));
    }
  }
  return out;
}

}  // namespace tfz::detail
