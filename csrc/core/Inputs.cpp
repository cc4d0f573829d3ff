// Input wrapping with alias groups, and the input-mutation epilogue.
#include "core/Inputs.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layout.h"
#include "core/Recorder.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace tfz::detail {

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
// Rejected: wrapping mixed-dtype members independently with a warning (what we did first, and
// what torch.func does): a write through one was silently not seen through the other.
// Rejected: AOTAutograd's "synthetic base" as an extra graph input: a calling convention change
// that user code calling functionalize(f) directly could not follow.

namespace {

// Note [Inputs: inputs that do not start their storage]
// Storage coordinates (as_strided's offset, resize_'s room to grow, the elements a shrunk input
// keeps) are only right on a base whose element i is the storage's element i. An input that is
// its whole storage, densely from offset 0 (the usual case), is such a base, and so is every new
// value a write gives it (same sizes, dense). An input like b[1:] or b[::2] is not: its base starts
// at b's element 1, and after a write its fresh value starts at 0, so x.add_(1);
// x.as_strided((2,), (1,), 1) read the wrong elements (found by the fuzzer). Such an input gets
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
constexpr const char* kInsideLargerStorage =
    "the tensor is (a view of) an input that starts inside a larger storage (e.g. a slice of a "
    "big buffer), and as_strided addresses that storage's elements, which the function does not "
    "see. Pass the whole buffer as the input";

bool wants_flat_base(const at::Tensor& t) {
  return plain_strided(t) && !is_whole_storage(t) && storage_is_small(t);
}

// An input with its own base whose storage coordinates are not its base's: one with elements
// that does not start its storage (a slice of a large buffer), or one with no element inside a
// storage that has some, which as_strided can still address (fuzzer program 719144: the write
// through x.as_strided((1,), (1,), 4) of an empty x = b[1:, ::2] was lost). An empty input keeps
// its own base rather than the flat one so that an out= op can still grow it as eager does
// (Note [Inputs: writes to a grown storage]).
bool is_offset_input(const at::Tensor& t) {
  if (plain_strided(t)) return !is_whole_storage(t);
  return t.layout() == c10::kStrided && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
         t.has_storage() && t.storage().nbytes() > 0;
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
    InnerCallGuard guard;
    base_value =
        reapply ? first->as_strided({numel}, {1}, 0) : at::as_strided_copy(*first, {numel}, {1}, 0);
    if (first->is_conj()) base_value = reapply ? at::_conj(base_value) : at::_conj_copy(base_value);
    if (first->is_neg()) {
      base_value = reapply ? at::_neg_view(base_value) : at::_neg_view_copy(base_value);
    }
    if (mixed) {
      base_value = reapply ? base_value.view(at::kByte) : at::view_copy(base_value, at::kByte);
    }
  }
  const at::Tensor base = make_fresh_wrapper(base_value, layer.id);
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

}  // namespace

// Note [Inputs: one tensor passed twice]
// f(x, x) passes one tensor object twice. In eager the two parameters are the same object, so a
// metadata change through one (x1.t_(), x1.resize_(...)) is seen through the other, not only its
// writes. Both parameters therefore get the same wrapper, and the epilogue treats the tensor once
// (replaying its metadata ops twice would undo a t_()).
// Rejected: grouping them as two aliases of one storage (what aliased inputs get, and what we did
// first): data stays shared, but each alias has its own metadata, so x0 kept its old strides
// after x1.swapaxes_() (found by the fuzzer).
namespace {
// The member of `group` (indices into `tensors`) that is the same tensor object as t, if any.
std::optional<size_t> same_object(const std::vector<at::Tensor>& tensors,
                                  c10::ArrayRef<size_t> group, const at::Tensor& t) {
  for (size_t j : group) {
    if (tensors[j].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return j;
  }
  return std::nullopt;
}
}  // namespace

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
      out[i] = make_fresh_wrapper(t, layer.id);
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
  for (const auto* storage : order) {
    const auto& indices = groups[storage];
    if (indices.size() == 1 && !wants_flat_base(inputs[indices[0]])) {  // the common case
      const size_t i = indices[0];
      out[i] = make_fresh_wrapper(inputs[i], layer.id);
      if (is_offset_input(inputs[i])) {
        unsafe_get_impl(out[i])->alias_storage().mark_offset_base(kInsideLargerStorage);
      }
      continue;
    }
    std::vector<at::Tensor> members;
    for (size_t i : indices) members.push_back(inputs[i]);
    if (members.size() > 1 && !can_group(members)) {
      TORCH_WARN("functionalize: ", members.size(),
                 " inputs share a storage but are not all strided tensors with static shapes; "
                 "they are functionalized independently, so a write through one is not seen "
                 "through the others inside the function.");
    }
    if ((members.size() == 1 && !wants_flat_base(members[0])) || !can_group(members)) {
      for (size_t i : indices) {
        out[i] = make_fresh_wrapper(inputs[i], layer.id);
        if (is_offset_input(inputs[i])) {
          unsafe_get_impl(out[i])->alias_storage().mark_offset_base(kInsideLargerStorage);
        }
      }
      continue;
    }
    auto wrapped = wrap_group(members, layer);
    for (size_t k = 0; k < indices.size(); ++k) out[indices[k]] = wrapped[k];
  }
  for (const auto& [i, j] : repeats) out[i] = out[j];
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || maybe_get_impl(t) != nullptr) continue;
    auto* impl = unsafe_get_impl(out[i]);
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

namespace {

// Note [Inputs: metadata epilogue]
// An input whose metadata f changed in place (t_, transpose_, squeeze_, as_strided_, resize_, ...)
// must end with eager's exact sizes, strides and storage offset, and its storage with eager's size.
// We replay the recorded metadata ops on a meta tensor that has the input's metadata (no data, no
// tracer: the caller's Python keys are excluded), read off the result, and apply it to the input
// with at most two ops: resize_ when eager's storage ends larger (the only op that grows a
// storage; sized so the storage has eager's byte count), then as_strided_(sizes, strides, offset)
// when the result differs from what the input has. A sequence that nets to nothing (t_ then t_)
// emits nothing, and a graph's epilogue speaks only copy_, as_strided_ and resize_.
// detach_ (autograd metadata, not geometry) is applied as called, to an input that requires grad
// (on any other it changes nothing). Inputs with symbolic sizes get the same from a probe of their
// symbolic geometry; sequences that may grow the storage (resize_, set_) replay as called there.
// Rejected: replaying every metadata op as called (what we did first): exact as well, but graphs
// then carry every in-place view op for a backend to implement, no-op sequences included; and
// as_strided_ with the wrapper's current metadata (torch.func): a *_copy value's strides are not
// eager's.
// detach_ changes autograd metadata, not geometry: replayed as called after the geometry. It
// changes nothing of an input without autograd history, so a graph gets it only for one with
// history (HistogramObserver's histogram.detach_().resize_(..) of a plain buffer left a mutable
// op in the graph for no effect).
void replay_detach(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  if (!original.requires_grad()) return;
  static const c10::OperatorName detach_name("aten::detach_", "");
  for (const auto& m : impl.metadata_mutations()) {
    if (m.op.operator_name() == detach_name) original.detach_();
  }
}

// With symbolic sizes a probe would compute with symbols, which a symbolic tracer records; the
// wrapper already reports eager's final geometry (Note [Kernel: eager strides without views]), so
// the input gets it by one as_strided_ with symbolic arguments, as with static sizes (make_fx's
// symbolic graphs of x.t_() kept aten.t_). Sequences that may grow the storage (resize_, set_)
// replay as called: their growth is a comparison of symbols.
template <class Replay>
void apply_symbolic_metadata_mutations(const at::Tensor& original, const FunctionalTensorImpl& impl,
                                       const Replay& replay_on) {
  static const c10::OperatorName resize{"aten::resize_", ""};
  const bool may_grow = std::any_of(impl.metadata_mutations().begin(),
                                    impl.metadata_mutations().end(), [](const MetadataMutation& m) {
                                      return m.op.operator_name() == resize ||
                                             m.op.operator_name().name == "aten::set_";
                                    });
  if (may_grow) {
    replay_on(original, /*geometry_only=*/false);
    return;
  }
  original.as_strided__symint(impl.sym_sizes(), impl.sym_strides(), impl.sym_storage_offset());
  replay_detach(original, impl);
}

void apply_metadata_mutations(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const auto& mutations = impl.metadata_mutations();
  if (mutations.empty()) return;
  // detach_ changes autograd metadata, not geometry: it is replayed as called.
  static const c10::OperatorName detach_name("aten::detach_", "");
  auto replay_on = [&](const at::Tensor& target, bool geometry_only) {
    for (const auto& m : mutations) {
      if (geometry_only && m.op.operator_name() == detach_name) continue;
      torch::jit::Stack stack;
      stack.emplace_back(target);
      stack.insert(stack.end(), m.args.begin(), m.args.end());
      m.op.callBoxed(stack);
    }
  };
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    apply_symbolic_metadata_mutations(original, impl, replay_on);
    return;
  }
  const auto item = static_cast<int64_t>(original.itemsize());
  const auto storage_bytes = static_cast<int64_t>(original.storage().nbytes());
  at::Tensor probe;
  {
    c10::impl::ExcludeDispatchKeyGuard no_tracer(layer_hidden_keys());
    // Not a view of the meta storage (in-place view ops refuse some views), but sharing it.
    const auto meta = original.options().device(at::kMeta);
    const at::Tensor storage = at::empty({storage_bytes / item}, meta);
    probe = at::empty({0}, meta).set_(storage.storage(), original.storage_offset(),
                                      original.sizes(), original.strides());
    replay_on(probe, /*geometry_only=*/true);
  }
  const auto probe_bytes = static_cast<int64_t>(probe.storage().nbytes());
  if (probe_bytes > storage_bytes) {
    const int64_t grown = probe_bytes / item - original.storage_offset();
    // resize_ to the sizes a tensor has already is a no-op that grows nothing: x = b.expand(3)
    // resized to (1, 3) must end with 3 elements of storage (fuzzer program 742437), and
    // resize_((3,)) of x itself kept 1. Such an input is first made an empty 1-D view at its
    // offset, whose resize_ then grows the storage.
    if (original.dim() == 1 && original.size(0) == grown) {
      original.as_strided_({0}, {1}, original.storage_offset());
    }
    original.resize_({grown});
  }
  if (original.sizes() != probe.sizes() || original.strides() != probe.strides() ||
      original.storage_offset() != probe.storage_offset()) {
    original.as_strided_(probe.sizes(), probe.strides(), probe.storage_offset());
  }
  replay_detach(original, impl);
}

// Note [Inputs: writes before a metadata change]
// x.add_(1); x.resize_(2) (or torch.neg(y, out=x) with a smaller result, or a write through a view
// of x after it shrank): eager wrote every element of x's storage that x covered on entry, and x
// then covers fewer. The epilogue replays the metadata change and copies x's final value, which
// reaches only the final elements, so the writes to the others were lost (the fuzzer's largest
// remaining class of wrong storages). So an input whose metadata changed and whose storage was
// written first gets its entry elements back as the storage now holds them: its base (a lone
// input's base is the input itself) or, for aliased inputs, as_strided_copy of the flat base at
// the input's entry geometry. Skipped, rather than guessed, where the base is no longer the entry
// storage (grown past its end: a new storage) or is a byte view of mixed-dtype inputs (whose
// storage write_whole_bytes writes whole instead).
// Rejected: copying the whole flat storage back for aliased inputs (a view of the caller's
// tensor in the epilogue, which speaks only copy_, as_strided_ and resize_).
// Returns whether that write also wrote every element the input has at the end (a dense entry
// whose storage span holds the final one: x.as_strided_((2, 2), (1, 2), 1) of a written x), so
// that the final copy would write the same values again.
bool write_entry_elements(const at::Tensor& original, const at::Tensor& wrapper) {
  const FunctionalTensorImpl& impl = *unsafe_get_impl(wrapper);
  const AliasStorage& storage = impl.alias_storage();
  const at::Tensor& base = storage.base();
  if (storage.generation() == 0 || base.scalar_type() != original.scalar_type() ||
      original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  const Span entry = span_of(original), final = span_of(wrapper);
  if (wrapper.is_non_overlapping_and_dense() && final.begin <= entry.begin &&
      entry.end <= final.end) {
    return false;
  }
  const bool covers_final = original.is_non_overlapping_and_dense() && entry.begin <= final.begin &&
                            final.end <= entry.end && !storage.grown_start();
  if (storage.flat()) {
    if (base.is_conj() != original.is_conj() || base.is_neg() != original.is_neg()) return false;
    // An input whose elements share memory (x.expand(3, 3)) cannot be copied into; the whole
    // storage is written instead where it can be (write_whole_storage), else refused by name.
    if (at::has_internal_overlap(original) == at::MemOverlap::Yes) return false;
    const auto needed = static_cast<int64_t>(at::detail::computeStorageNbytes(
        original.sizes(), original.strides(), 1, original.storage_offset()));
    if (needed > base.numel()) return false;
    original.copy_(
        at::as_strided_copy(base, original.sizes(), original.strides(), original.storage_offset()));
    return covers_final;
  }
  if (base.sizes() != original.sizes()) return false;
  original.copy_(base);
  return covers_final;
}

// A tracer or a capture records the epilogue: it must speak the graph's vocabulary.
bool epilogue_is_recorded() {
  return c10::impl::TorchDispatchModeTLS::any_modes_set() || ops_are_recorded() ||
         c10::impl::tls_local_dispatch_key_set().included_.has_any(c10::python_ks);
}

// Whether `value`, the final value of input `original`, was written only where autograd does not
// see: it kept the input's own gradient edge, or it is a leaf's value with none (in grad mode
// eager raises on writing such a leaf). Its write-back then records no history either, so the
// input keeps its grad_fn or stays a leaf (Note [Autograd: writes autograd does not see]).
bool written_unseen(const at::Tensor& original, const at::Tensor& value) {
  return has_history_of(value, original) ||
         (original.requires_grad() && original.is_leaf() && !value.requires_grad());
}

// Note [Inputs: writes to a grown storage]
// torch.ones((4, 3), out=x) grows x's storage from 6 to 12 elements and writes all 12; a later
// x.resize_((2,)) leaves x covering 2. The epilogue replays the resizes on the caller's x (its
// storage grows as eager's) and copies x's final value, so the 10 other written elements kept
// whatever the new memory held (fuzzer program 404368). The grown storage's base is a 1-D tensor
// of the caller's storage elements from a known start (AliasStorage::mark_grown), so when x's
// final elements do not cover it, the base is copied into x.as_strided([n], [1], start) after the
// resizes, as write_whole_storage does for flat storages. A graph without views has no view to
// do that with: refused by name there.
// Rejected: replaying the writes' regions (their chains are gone by the epilogue).
void write_grown_storage(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const AliasStorage& storage = impl.alias_storage();
  const auto start = storage.grown_start();
  const at::Tensor& base = storage.base();
  if (!start || storage.generation() == 0 || base.dim() != 1 ||
      base.scalar_type() != original.scalar_type() || base.is_conj() || base.is_neg() ||
      original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      base.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return;
  }
  const auto item = static_cast<int64_t>(original.itemsize());
  const Span grown{*start * item, (*start + base.numel()) * item}, final = span_of(original);
  if (original.is_non_overlapping_and_dense() && final.begin <= grown.begin &&
      grown.end <= final.end) {
    return;  // the final copy_ writes every grown element
  }
  if (grown.end > static_cast<int64_t>(original.storage().nbytes())) return;
  const bool recorded = epilogue_is_recorded();
  const bool views_kept = !impl.chain().empty() && impl.chain().back()->reapply;
  TORCH_CHECK_NOT_IMPLEMENTED(
      !recorded || views_kept,
      "functionalize: an input's storage grew (resize_ or an out= resize), was written, and the "
      "input then covers fewer elements; a graph without views (remove=\"mutations_and_views\" "
      "under a tracer) cannot write the others back. Use remove=\"mutations\".");
  at::Tensor whole = written_unseen(original, base) ? original.detach() : original;
  whole.as_strided({base.numel()}, {1}, *start).copy_(base);
}

void write_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const at::Tensor& value = impl.value();
  // An input whose elements share memory (x.expand(3, 3)) is written through its whole storage
  // (write_whole_storage); where that cannot be done, copy_ into it would raise torch's
  // internal-overlap error, so the reason is named instead (fuzzer program 300631, captured).
  TORCH_CHECK_NOT_IMPLEMENTED(
      original.layout() != c10::kStrided ||
          original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
          at::has_internal_overlap(original) != at::MemOverlap::Yes,
      "functionalize: writing back an input of sizes ", original.sizes(), " and strides ",
      original.strides(),
      ", whose elements share memory (expand, as_strided with a zero stride), is not supported "
      "in a graph without views (remove=\"mutations_and_views\" under a tracer) or after its "
      "metadata changed. Use remove=\"mutations\", or pass the tensor before it is expanded.");
  if (!impl.has_metadata_mutation() && original.sym_sizes() != value.sym_sizes()) {
    original.resize__symint(value.sym_sizes());
  }
  // See written_unseen. Every other write-back records the copy, so gradients flow through
  // written inputs as through eager's in-place op.
  const bool unseen = written_unseen(original, value);
  if (unseen || (!original.requires_grad() && !value.requires_grad())) {
    // No history to record. Eagerly through x.data, which bumps no version: the wrapper counted
    // eager's writes, and a write through x.data counts none (Note [Inputs: version counters]).
    // Grad mode changes only where it matters, so a graph switches it only for such inputs.
    at::AutoGradMode no_grad(!unseen && c10::GradMode::is_enabled());
    // (A sparse tensor's shallow copy holds its own indices and values, an inference tensor
    // keeps eager's error, and a torch.func or subclass wrapper has no .data to give: those are
    // written as they are.)
    static const auto wrapped_keys =
        c10::python_ks | c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                              c10::DispatchKey::FuncTorchGradWrapper});
    const bool through_data = !epilogue_is_recorded() && original.layout() == c10::kStrided &&
                              !original.is_inference() && !original.key_set().has_any(wrapped_keys);
    (through_data ? original.variable_data() : original).copy_(value);
    return;
  }
  original.copy_(value);
}

// Note [Inputs: writes outside every input's elements]
// x = b[..., ::2] (or x with x[1:]) gets the flat storage as its base, and f may write elements
// of that storage that no input covers: x.as_strided((2,), (1,), 13).zero_() writes element 13.
// Eager's storage then holds the write, and so does an output that views it; copying each input
// back wrote only their own elements (fuzzer program 114188 and ~40 others). So when no input
// is the whole storage, the epilogue copies the whole flat base into the storage, through
// x.as_strided([numel], [1], 0) of a member with the base's dtype and bits (a view of the
// caller's tensor, as the region-precise epilogue of capture already writes), and nothing else.
// Inputs whose metadata changed get it too, after their metadata ops (x.resize_((4,)), a write
// to element 7, x.resize_((2, 1)): element 7 is neither an entry nor a final element of x,
// fuzzer program 409938); a graph's epilogue, which would then write through a view of an input
// its own as_strided_ just changed, writes the storage before the metadata ops instead (an
// as_strided fill_ at element 11 of b[1:, ::2] followed by squeeze_ was lost from graphs, fuzzer
// program 506674), and after them where it could not before (a storage the metadata ops grow to
// the base's size: x.resize_((4, 2)) of x = b[::2], a write through x[2:], then x.as_strided_ to
// fewer elements lost the write to element 6, fuzzer program 926672). In views-removed programs
// being traced (the graph must hold no view), the per-input write stays.
// A write through an input whose resize_ or as_strided_ made its chain one new step from the
// base stays inside its final elements, which the per-input write covers: that step counts as a
// member's (AliasStorage::add_member_step), unless the input's geometry changes again after a
// write (409938's shape), which a graph without views then refuses.
// See Note [Inputs: writes before a metadata change].
// Rejected: tracking which storage elements were written (a copy per write to find out).
bool write_whole_storage(const std::vector<at::Tensor>& originals, c10::ArrayRef<size_t> members,
                         const AliasStorage& storage) {
  // A graph of remove="mutations_and_views" must not hold the view this write goes through.
  const bool recorded = epilogue_is_recorded();
  if (!storage.flat_views_kept() && recorded) return false;
  const at::Tensor& base = storage.base();
  const at::Tensor* through = nullptr;
  for (size_t i : members) {
    const at::Tensor& t = originals[i];
    if (is_whole_storage(t) || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
    if (through == nullptr && t.scalar_type() == base.scalar_type() && !t.is_conj() &&
        !t.is_neg() && !base.is_conj() && !base.is_neg()) {
      through = &t;
    }
  }
  if (through == nullptr || base.dim() != 1 ||
      base.numel() * static_cast<int64_t>(base.itemsize()) !=
          static_cast<int64_t>(through->storage().nbytes())) {
    return false;
  }
  at::Tensor whole = through->as_strided({base.numel()}, {1}, 0);
  if (written_unseen(*through, base)) {
    at::AutoGradMode no_grad(false);  // as write_data: eager wrote it under no_grad
    whole = through->detach().as_strided({base.numel()}, {1}, 0);
    whole.copy_(base);
    return true;
  }
  whole.copy_(base);
  return true;
}

// The whole storage of `t` (strided, no conjugate or negative bit, whose storage is a whole
// number of its elements) as a 1-D uint8 view: what a byte base (Note [Inputs: aliased inputs])
// stands for.
at::Tensor storage_as_bytes(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  at::Tensor whole = t.as_strided({static_cast<int64_t>(t.storage().nbytes()) / item}, {1}, 0);
  if (t.is_complex()) whole = at::view_as_real(whole).view(-1);
  return whole.view(c10::kByte);
}

// The byte base of inputs of different dtypes (x and x.view(torch.int32), or b[::2] and b.real of
// a complex b) may hold writes that no member covers either: x.as_strided_((2,), (3,), 0) of a
// complex member, then uniform_, writes bytes 24..31 of which b.real covers only 24..27 (fuzzer
// program 534085). Eagerly and in graphs with views, the whole storage is written as bytes,
// through a member seen as its storage's elements (as_strided) and then as bytes (view), and
// nothing else; after metadata ops too, as flat storages are (eagerly after them, in graphs
// before): x1 = b.view(torch.int32) beside b[::2], x1.masked_fill_(..), then x1.as_strided_ to
// fewer elements lost the writes to the others (fuzzer program 605568).
// See Note [Inputs: writes outside every input's elements].
bool write_whole_bytes(const std::vector<at::Tensor>& originals, c10::ArrayRef<size_t> members,
                       const AliasStorage& storage) {
  if (!storage.bytes() || (!storage.flat_views_kept() && epilogue_is_recorded())) return false;
  const at::Tensor& base = storage.base();
  if (base.dim() != 1 || base.scalar_type() != c10::kByte || base.is_conj() || base.is_neg()) {
    return false;
  }
  for (size_t i : members) {
    const at::Tensor& t = originals[i];
    const auto item = static_cast<int64_t>(t.itemsize());
    if (t.layout() != c10::kStrided || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
        t.is_conj() || t.is_neg() || t.requires_grad() ||
        static_cast<int64_t>(t.storage().nbytes()) != base.numel() || base.numel() % item != 0) {
      continue;
    }
    storage_as_bytes(t).copy_(base);
    return true;
  }
  return false;
}

// Where write_whole_storage cannot run (a graph without views: no view to write the storage
// through), a write that may have reached elements no input covers would be lost: refused by
// name instead (fuzzer program 300118, captured; 506674 with a metadata change after the write).
// Writes through the inputs and their views stay inside the inputs' elements and are written
// back per input.
void check_outside_writes_expressible(const std::vector<at::Tensor>& originals,
                                      c10::ArrayRef<size_t> members, const AliasStorage& storage,
                                      bool any_metadata) {
  // After metadata ops, only a graph without views refuses: eagerly, and in a graph with views
  // (which wrote the storage whole before them where it could), what write_whole_storage could
  // not do (a storage grown past the caller's) is left to the per-input writes.
  if (!storage.flat() || !storage.written_outside_members() ||
      (any_metadata && (!epilogue_is_recorded() || storage.flat_views_kept()))) {
    return;
  }
  for (size_t i : members) {
    if (is_whole_storage(originals[i])) return;  // the per-input write covers every element
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "functionalize: the function wrote elements of an input's storage through ",
      "as_strided (or through a view taken before a resize_ or as_strided_ of the input), and "
      "the inputs do not cover every element of that storage; a graph without "
      "views (remove=\"mutations_and_views\" under a tracer) cannot write those elements back. "
      "Use remove=\"mutations\", or pass the whole storage's tensor as the input.");
}

// Index (into `members`) of a member whose elements include every other member's, or -1.
int covering_member(const std::vector<at::Tensor>& originals, c10::ArrayRef<size_t> members) {
  for (size_t k = 0; k < members.size(); ++k) {
    const auto& candidate = originals[members[k]];
    if (!candidate.is_non_overlapping_and_dense()) continue;
    const Span outer = span_of(candidate);
    bool covers = true;
    for (size_t i : members) {
      const Span s = span_of(originals[i]);
      covers &= s.begin >= outer.begin && s.end <= outer.end;
    }
    if (covers) return static_cast<int>(k);
  }
  return -1;
}

}  // namespace

// Note [Inputs: version counters]
// Eager bumps an input's version once per in-place write (x._version, read by autograd's
// saved-tensor check and by user code). Each input's wrapper starts at the input's version and
// counts the writes made inside f (its views share its counter), so code inside f reads eager's
// versions; here the input is brought to its wrapper's count, the epilogue's own copy_ included
// in it. Rejected: sharing the caller's counter with the wrapper (the epilogue's copy_ would
// count once more than eager, and a call that raises would leave versions bumped for writes
// that never reached the input).
void write_back_inputs(const std::vector<at::Tensor>& originals,
                       const std::vector<at::Tensor>& wrappers) {
  TORCH_CHECK(originals.size() == wrappers.size(), "functionalize: write-back got ",
              originals.size(), " inputs and ", wrappers.size(), " wrappers.");
  std::unordered_map<const AliasStorage*, c10::SmallVector<size_t, 1>> groups;
  groups.reserve(wrappers.size());
  std::vector<const AliasStorage*> order;
  order.reserve(wrappers.size());
  for (size_t i = 0; i < wrappers.size(); ++i) {
    if (!originals[i].defined()) continue;
    auto* impl = get_impl(wrappers[i]);
    TORCH_CHECK(impl->is_up_to_date(), "functionalize: write-back: sync the wrappers first.");
    auto& group = groups[&impl->alias_storage()];
    if (group.empty()) order.push_back(&impl->alias_storage());
    // One tensor passed twice is written back once (Note [Inputs: one tensor passed twice]).
    if (same_object(originals, group, originals[i])) continue;
    group.push_back(i);
  }
  auto has_metadata = [&](const AliasStorage* storage) {
    return std::any_of(groups[storage].begin(), groups[storage].end(), [&](size_t i) {
      return unsafe_get_impl(wrappers[i])->has_metadata_mutation();
    });
  };
  // A recorded epilogue writes a flat storage (or a byte base) whole before the metadata ops, not
  // after them (Note [Inputs: writes outside every input's elements]); such a storage needs no
  // other write.
  std::unordered_set<const AliasStorage*> written_whole;
  if (epilogue_is_recorded()) {
    for (const auto* storage : order) {
      if (storage->generation() != 0 && has_metadata(storage) &&
          ((storage->flat() && write_whole_storage(originals, groups[storage], *storage)) ||
           write_whole_bytes(originals, groups[storage], *storage))) {
        written_whole.insert(storage);
      }
    }
  }
  // Inputs whose entry write already wrote their final elements: their final copy would write
  // the same values twice. See Note [Inputs: writes before a metadata change].
  std::unordered_set<size_t> final_written;
  for (const auto* storage : order) {
    for (size_t i : groups[storage]) {
      auto* impl = unsafe_get_impl(wrappers[i]);
      if (impl->has_metadata_mutation() && written_whole.count(storage) == 0 &&
          write_entry_elements(originals[i], wrappers[i])) {
        final_written.insert(i);
      }
      apply_metadata_mutations(originals[i], *impl);
      write_grown_storage(originals[i], *impl);
    }
  }
  for (const auto* storage : order) {
    if (storage->generation() == 0) continue;  // nothing was written to this storage
    if (written_whole.count(storage) != 0) continue;
    const auto& members = groups[storage];
    const bool any_metadata = has_metadata(storage);
    // After a metadata change too, eagerly; a graph's epilogue with views wrote the storage
    // before its metadata ops where it could, and here where it could not: a storage the
    // metadata ops just grew to the base's size (Note [Inputs: writes to a grown storage]).
    if (storage->flat() &&
        (!any_metadata || !epilogue_is_recorded() || storage->flat_views_kept()) &&
        write_whole_storage(originals, members, *storage)) {
      continue;
    }
    if ((!any_metadata || !epilogue_is_recorded()) &&
        write_whole_bytes(originals, members, *storage)) {
      continue;
    }
    check_outside_writes_expressible(originals, members, *storage, any_metadata);
    // A member that is now its whole storage holds every element the others do: written alone,
    // the others need no write (and one whose elements share memory could not take one; fuzzer
    // program 400329: x.expand(3) beside x.view(-1)).
    const auto whole = std::find_if(members.begin(), members.end(), [&](size_t i) {
      return storage->flat() && is_whole_storage(originals[i]);
    });
    if (whole != members.end()) {
      write_data(originals[*whole], *unsafe_get_impl(wrappers[*whole]));
      continue;
    }
    const int cover =
        members.size() > 1 && !any_metadata ? covering_member(originals, members) : -1;
    if (cover >= 0) {
      write_data(originals[members[cover]], *unsafe_get_impl(wrappers[members[cover]]));
      continue;
    }
    for (size_t i : members) {
      if (final_written.count(i) == 0) write_data(originals[i], *unsafe_get_impl(wrappers[i]));
    }
  }
  // See Note [Inputs: version counters].
  for (size_t i = 0; i < wrappers.size(); ++i) {
    const at::Tensor& original = originals[i];
    if (!original.defined() || !original.unsafeGetTensorImpl()->version_counter().enabled()) {
      continue;
    }
    const uint32_t target = unsafe_get_impl(wrappers[i])->version_counter().current_version();
    while (original._version() < target) original.unsafeGetTensorImpl()->bump_version();
  }
}

namespace {
// The caller's storage of a flat or byte base, seen as that base (1-D, the base's dtype or bytes,
// its number of elements), through a member input without conjugate or negative bits; undefined
// where no member can give it.
at::Tensor caller_storage_as_base(const std::vector<at::Tensor>& originals,
                                  const std::vector<at::Tensor>& wrappers,
                                  const AliasStorage& storage) {
  const at::Tensor& base = storage.base();
  if (base.is_conj() || base.is_neg()) return {};
  for (size_t i = 0; i < wrappers.size(); ++i) {
    auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
    const at::Tensor& t = originals[i];
    if (in == nullptr || &in->alias_storage() != &storage || t.layout() != c10::kStrided ||
        t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || t.is_conj() || t.is_neg() ||
        (!storage.bytes() && t.scalar_type() != base.scalar_type()) ||
        static_cast<int64_t>(t.storage().nbytes()) % static_cast<int64_t>(t.itemsize()) != 0 ||
        static_cast<int64_t>(t.storage().nbytes()) <
            base.numel() * static_cast<int64_t>(base.itemsize())) {
      continue;
    }
    at::Tensor whole = storage.bytes() ? storage_as_bytes(t) : t.as_strided({base.numel()}, {1}, 0);
    return whole.numel() == base.numel() ? whole : whole.as_strided({base.numel()}, {1}, 0);
  }
  return {};
}
}  // namespace

// Note [Inputs: outputs that alias inputs]
// In eager, `x.add_(1); return x.view(-1)` returns a view of the caller's x. torch.func returns a
// view of the new inner value instead: equal numbers, but a later write through the output does
// not reach x. With views kept (remove="mutations") we rebuild such outputs after the epilogue:
// if an input's view chain is a prefix of the output's (same shared steps, same alias storage),
// the remaining steps are replayed on the caller's tensor, so `return x` gives back x itself and
// `return x[0]` a real view of x. An input whose metadata f changed (x.t_(), an out= resize)
// is matched by its chain before the change, and the steps replay on x.as_strided at its
// geometry then: a view taken before x.t_() still views x's storage in eager (the fuzzer's
// largest class, "alias", until this). An as_strided of a view is a step from the storage's base
// (Note [Kernel: as_strided without views]), so its chain has no input's as prefix; where the
// base's element i is the storage's element i (a flat base, or an input that is the base), the
// caller's x.as_strided(...) is that step too, and the output is rebuilt from it. Where such a
// chain begins with the base's reinterpretation in the output's dtype (the byte base of inputs of
// two dtypes, or a flat base viewed in another dtype), it replays whole on the caller's storage
// seen as the base sees it (caller_storage_as_base).
// Under a tracer (make_fx) the Python API turns this off: a graph's outputs never alias its
// inputs, and the replayed views would read a placeholder after its write-back.
at::Tensor unwrap_output(const at::Tensor& out, const std::vector<at::Tensor>& originals,
                         const std::vector<at::Tensor>& wrappers, bool alias_inputs) {
  auto* impl = maybe_get_impl(out);
  if (impl == nullptr) return out;
  impl->sync_();
  if (!alias_inputs) return impl->value();
  for (size_t i = 0; i < wrappers.size(); ++i) {  // `return x`: x itself, as in eager
    if (originals[i].defined() && wrappers[i].unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) {
      return originals[i];
    }
  }
  const auto& chain = impl->chain();
  // The input whose chain is the longest beginning of the output's: first its chain now (the
  // rest replays on the caller's tensor as the epilogue left it), then its chain before its
  // first metadata mutation (the rest replays on the caller's tensor at its geometry then).
  int best = -1;
  size_t best_len = 0;
  bool at_entry = false;
  for (bool entry : {false, true}) {
    for (size_t i = 0; i < wrappers.size(); ++i) {
      auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
      if (in == nullptr || &in->alias_storage() != &impl->alias_storage()) continue;
      if (entry && (!in->has_metadata_mutation() || !in->entry_state().geometry)) continue;
      const auto& prefix = entry ? in->entry_chain() : in->chain();
      if (prefix.size() <= chain.size() && chain.starts_with(prefix) &&
          (best < 0 || prefix.size() > best_len)) {
        best = static_cast<int>(i);
        best_len = prefix.size();
        at_entry = entry;
      }
    }
    if (best >= 0) break;
  }
  if (best < 0 && !chain.steps().empty() && chain.steps()[0]->name() == "aten::as_strided") {
    for (size_t i = 0; i < wrappers.size() && best < 0; ++i) {
      auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
      if (in != nullptr && &in->alias_storage() == &impl->alias_storage() &&
          (in->alias_storage().flat() || in->entry_chain().empty())) {
        best = static_cast<int>(i);  // best_len 0: every step replays on the caller's tensor
      }
    }
  }
  at::Tensor result;
  if (best >= 0) {
    result = originals[best];
    if (at_entry) {
      // The input's geometry when the output's view was taken: eager's view derives from it.
      const auto& [sizes, strides, offset] =
          *unsafe_get_impl(wrappers[best])->entry_state().geometry;
      result = result.as_strided(sizes, strides, offset);
    }
  } else if (!chain.steps().empty() &&
             (impl->alias_storage().bytes() ||
              (impl->alias_storage().flat() && chain.steps()[0]->name() != "aten::as_strided"))) {
    // A flat or byte base's chains that begin with its reinterpretation in another dtype
    // (as_strided from the base, see base_in_dtype_of in ViewKernels.cpp) replay whole on the
    // caller's storage seen as the base sees it: as bytes, or as elements of the base's dtype
    // (fuzzer program 597756).
    result = caller_storage_as_base(originals, wrappers, impl->alias_storage());
  }
  if (!result.defined()) return impl->value();
  const auto steps = chain.steps();
  for (size_t k = best_len; k < steps.size(); ++k) {
    if (!steps[k]->reapply) return impl->value();  // a *_copy step: the output is not a view
    result = steps[k]->forward(result);
  }
  return result;
}

// Note [Inputs: outputs in eager's strides without views]
// Without views an output is a copy, and its value is dense in the order of the strides its
// wrapper reports (Note [Wrapper: values in eager's stride order without views]). Eager's output
// may have gaps (`return x1` of an input b[:, 1:] has strides (5, 1)) or stride-0 dims
// (x.expand(3, 4)), which the dense value has not: such outputs came back with packed strides
// (fuzzer program 623356), and so did overlapping ones (`x.unfold(1, 2, 1)`, fuzzer program
// 676336). So when nothing records, an output whose reported strides differ from its value's
// becomes a fresh tensor of eager's sizes and strides (storage offset 0: a copy owns its storage)
// holding the value; where elements share memory, each storage element is written once. A value
// that requires grad stays packed (a copy would cut its autograd history). Under a
// tracer a graph's outputs keep their values' strides (no contract on them, and no extra copy in
// the graph). Rejected: eager's strides for every value inside the function (gaps need storage no
// *_copy has, and each op would pay for it); here one copy per such output, at the end.
at::Tensor output_in_eager_strides(const at::Tensor& wrapper, const at::Tensor& value) {
  if (wrapper.layout() != c10::kStrided || value.layout() != c10::kStrided ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      value.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.sizes() != value.sizes() || value.numel() == 0 ||
      !strides_differ(value.sizes(), value.strides(), wrapper.strides()) || value.requires_grad() ||
      value.key_set().has_any(c10::python_ks)) {
    return value;  // requires_grad: the copy would cut the value's autograd history
  }
  InnerCallGuard guard;
  if (!may_self_overlap(wrapper.sizes(), wrapper.strides())) {
    return at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options()).copy_(value);
  }
  // Elements share memory (expand, unfold): each storage element takes the value of the elements
  // that lie on it, which are equal (the value was read through such a view). copy_ refuses an
  // overlapping destination; index_put_ of the storage at each element's offset does not.
  const auto numel = static_cast<int64_t>(
      at::detail::computeStorageNbytes(wrapper.sizes(), wrapper.strides(), 1, 0));
  at::Tensor storage = at::empty({numel}, value.options());
  const at::Tensor offsets = at::arange(numel, value.options().dtype(c10::kLong))
                                 .as_strided(wrapper.sizes(), wrapper.strides())
                                 .reshape(-1);
  storage.index_put_({offsets}, value.reshape(-1));
  return storage.as_strided(wrapper.sizes(), wrapper.strides());
}

}  // namespace tfz::detail
