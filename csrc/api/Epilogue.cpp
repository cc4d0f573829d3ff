// The input epilogue: writing inputs' mutations back to the caller's tensors. See api/Epilogue.h.
#include "api/Epilogue.h"

#include "api/InputGroups.h"
#include "api/InputOtherData.h"
#include "api/InputWrite.h"

#include "core/DispatchKey.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/MemoryOverlap.h"
#include "core/Recording.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace tfz::detail {

namespace {

// Note [Inputs: metadata epilogue]
// An input whose metadata f changed in place (t_, transpose_, squeeze_, as_strided_, resize_, ...)
// must end with eager's exact sizes, strides and storage offset, and its storage with eager's size.
// We replay the recorded metadata ops on a meta tensor that has the input's metadata (no data, no
// tracer: the caller's Python keys are excluded), read off the result, and apply it to the input
// with at most two ops: resize_ when eager's storage ends larger (the only op that grows a
// storage; sized so the storage has eager's byte count), then as_strided_(sizes, strides, offset)
// when the result differs from what the input has. A sequence that nets to nothing (t_ then t_)
// emits nothing, and a graph's epilogue speaks only copy_, as_strided_ and resize_. Inputs with
// symbolic sizes get the same from a probe of their symbolic geometry; sequences that may grow
// the storage (resize_, set_) replay as called there. detach_: below.
// Rejected: replaying every metadata op as called: exact as well, but graphs then carry every
// in-place view op for a backend to implement, no-op sequences included; and as_strided_ with the
// wrapper's current metadata (torch.func): a *_copy value's strides are not eager's.
// detach_ changes autograd metadata, not geometry: replayed as called after the geometry. It
// changes nothing of an input without autograd history, so a graph gets it only for one with
// history (for a plain buffer, HistogramObserver's histogram.detach_().resize_(..) would leave a
// mutable op in the graph for no effect).
void replay_detach(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  if (!original.requires_grad()) return;
  static const c10::OperatorName detach_name("aten::detach_", "");
  for (const auto& m : impl.metadata_mutations()) {
    if (m.op.operator_name() == detach_name) original.detach_();
  }
}

// With symbolic sizes a probe would compute with symbols, which a symbolic tracer records; the
// wrapper already reports eager's final geometry (Note [Strides: what eager gives],
// case "view wrappers"), so the input gets it by one as_strided_ with symbolic arguments, as with
// static sizes (make_fx's symbolic graphs of x.t_() kept aten.t_). Sequences that may grow the
// storage (resize_, set_) replay as called: their growth is a comparison of symbols.
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
      // A resize eager made inside a kernel bumps no version (Note [Inputs: version counters]).
      std::optional<at::AutoDispatchBelowADInplaceOrView> uncounted;
      if (!m.counts_version) uncounted.emplace();
      m.op.callBoxed(stack);
    }
  };
  // An input of static sizes may end with symbolic ones (an empty out= resized to a result of
  // symbolic sizes): the probe would make the symbols concrete, the graph then specialized.
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      impl.has_symbolic_sizes_strides()) {
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
  // Only resizes eager made inside kernels that bump nothing: the input's geometry changes without
  // a bump (Note [Inputs: version counters]).
  std::optional<at::AutoDispatchBelowADInplaceOrView> uncounted;
  if (std::none_of(mutations.begin(), mutations.end(),
                   [](const MetadataMutation& m) { return m.counts_version; })) {
    uncounted.emplace();
  }
  if (probe_bytes > storage_bytes) {
    const int64_t grown = probe_bytes / item - original.storage_offset();
    // resize_ to the sizes a tensor has already is a no-op that grows nothing: x = b.expand(3)
    // resized to (1, 3) must end with 3 elements of storage, and resize_((3,)) of x itself keeps 1.
    // Such an input is first made an empty 1-D view at its offset, whose resize_ then grows the
    // storage.
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
// reaches only the final elements, so the writes to the others would be lost. So an input whose
// metadata changed and whose storage was written first gets its entry elements back as the storage
// now holds them: its base (a lone input's base is the input itself) or, for aliased inputs,
// as_strided_copy of the flat base at the input's entry geometry. Skipped, rather than guessed,
// where the base is no longer the entry storage (grown past its end: a new storage) or is a byte
// view of mixed-dtype inputs (whose storage write_whole_bytes writes whole instead).
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
    // storage is written instead where it can be (write_whole_storage, which a graph without views
    // cannot hold after metadata ops), else refused by name.
    if (at::has_internal_overlap(original) == at::MemOverlap::Yes) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          !calls_may_be_traced() || storage.flat_views_kept(),
          "functionalize: an input whose elements share memory (expand, as_strided with a zero "
          "stride) was written and then given other sizes or strides (as_strided_, resize_); a "
          "graph without views (remove=\"mutations_and_views\" under a tracer) cannot write "
          "its first elements back. Use remove=\"mutations\", or pass the tensor before it is "
          "expanded.");
      return false;
    }
    const auto needed = static_cast<int64_t>(at::detail::computeStorageNbytes(
        original.sizes(), original.strides(), 1, original.storage_offset()));
    if (needed > base.numel()) return false;
    (records_no_history(original, base) ? unversioned(original) : original)
        .copy_(at::as_strided_copy(base, original.sizes(), original.strides(),
                                   original.storage_offset()));
    return covers_final;
  }
  if (base.sizes() != original.sizes()) return false;
  (records_no_history(original, base) ? unversioned(original) : original).copy_(base);
  return covers_final;
}

// Note [Inputs: writes to a grown storage]
// torch.ones((4, 3), out=x) grows x's storage from 6 to 12 elements and writes all 12; a later
// x.resize_((2,)) leaves x covering 2. The epilogue replays the resizes on the caller's x (its
// storage grows as eager's) and copies x's final value, so the 10 other written elements would keep
// whatever the new memory held. The grown storage's base is a 1-D tensor of the caller's storage
// elements from a known start (AliasStorage::mark_grown; an input that keeps its own base because
// it does not span its storage counts from its first element, AliasStorage::set_caller_origin,
// not from the storage's), so when x's final elements do not cover
// it, the base is copied into x.as_strided([n], [1], start) after the resizes, as
// write_whole_storage does for flat storages. A graph without views has no view to do that with:
// refused by name there.
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
  const bool recorded = calls_may_be_traced();
  const bool views_kept = !impl.chain().empty() && impl.chain().back()->reapply;
  TORCH_CHECK_NOT_IMPLEMENTED(
      !recorded || views_kept,
      "functionalize: an input's storage grew (resize_ or an out= resize), was written, and the "
      "input then covers fewer elements; a graph without views (remove=\"mutations_and_views\" "
      "under a tracer) cannot write the others back. Use remove=\"mutations\".");
  const at::Tensor whole = storage_writer(original, base);
  whole.as_strided({base.numel()}, {1}, *start).copy_(base);
}

// An own base in the caller's coordinates holds the caller's whole storage: where a write reached
// elements outside the input's entry and final ones (a view resized into the input's gaps), the
// storage is copied back whole, after the metadata ops and before the input's own copy. A graph
// without views has no view to do that with: refused by name there.
// See Note [Inputs: storage coordinates of a written own base].
void write_restored_storage(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const AliasStorage& storage = impl.alias_storage();
  const at::Tensor& base = storage.base();
  // An input left with no element (x.resize_(0) after the write) is checked too: every written
  // element is then outside its final ones.
  if (!storage.caller_coordinates() || storage.in_caller_storage(base) || storage.grown_start() ||
      original.layout() != c10::kStrided || !original.has_storage() ||
      original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      !storage.caller_entry().defined() || base.scalar_type() != original.scalar_type()) {
    return;
  }
  // The input's own copy writes its final elements, and the entry write its first ones
  // (Note [Inputs: writes before a metadata change]).
  at::Tensor final_elements;
  {
    c10::impl::ExcludeDispatchKeyGuard no_tracer(layer_hidden_keys());
    final_elements = meta_twin(original);
  }
  const at::Tensor& entry_elements = storage.caller_entry();
  const auto& regions = storage.written_regions();
  if (std::all_of(regions.begin(), regions.end(), [&](const at::Tensor& r) {
        return elements_within(r, final_elements) || elements_within(r, entry_elements);
      })) {
    return;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      !calls_may_be_traced() || storage.caller_coordinates_views_kept(),
      "functionalize: a view of an input that does not span its storage was resized into "
      "elements outside the input's (its gaps) and written there; a graph without views "
      "(remove=\"mutations_and_views\" under a tracer) cannot write those elements back. Use "
      "remove=\"mutations\", or pass the whole buffer as the input.");
  const auto item = static_cast<int64_t>(original.itemsize());
  const int64_t n = std::min(static_cast<int64_t>(original.storage().nbytes()),
                             static_cast<int64_t>(base.storage().nbytes())) /
                    item;
  const at::Tensor whole = storage_writer(original, base);
  whole.as_strided({n}, {1}, 0).copy_(base.as_strided({n}, {1}, 0));
}

// Note [Inputs: writes outside every input's elements]
// x = b[..., ::2] (or x with x[1:]) gets the flat storage as its base, and f may write elements
// of that storage that no input covers: x.as_strided((2,), (1,), 13).zero_() writes element 13.
// Eager's storage then holds the write, and so does an output that views it; copying each input
// back writes only their own elements. So when no input is the whole storage, the epilogue copies
// the whole flat base into the storage, through x.as_strided([numel], [1], 0) of a member with
// the base's dtype and bits (a view of the caller's tensor, as the region-precise epilogue of
// capture already writes), and nothing else.
// Inputs whose metadata changed get it too, after their metadata ops (x.resize_((4,)), a write
// to element 7, x.resize_((2, 1)): element 7 is neither an entry nor a final element of x); a
// graph's epilogue, which would then write through a view of an input its own as_strided_ just
// changed, writes the storage before the metadata ops instead (an as_strided fill_ at element 11
// of b[1:, ::2] followed by squeeze_), and after them where it could not before (a storage the
// metadata ops grow to the base's size: x.resize_((4, 2)) of x = b[::2], a write through x[2:],
// then x.as_strided_ to fewer elements: element 6). In views-removed programs being traced (the
// graph must hold no view), the per-input write stays.
// A write through an input whose resize_ or as_strided_ made its chain one new step from the
// base stays inside its final elements, which the per-input write covers: that step counts as a
// member's (AliasStorage::add_member_step), unless the input's geometry changes again after a
// write (the x.resize_((4,)) example above), which a graph without views then refuses.
// See Note [Inputs: writes before a metadata change].
// Rejected: tracking which storage elements were written (a copy per write to find out).
bool write_whole_storage(const std::vector<at::Tensor>& originals, c10::ArrayRef<size_t> members,
                         const AliasStorage& storage) {
  // A graph of remove="mutations_and_views" must not hold the view this write goes through.
  const bool recorded = calls_may_be_traced();
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
  if (records_no_history(*through, base)) {
    unversioned(*through).as_strided({base.numel()}, {1}, 0).copy_(base);
    return true;
  }
  if (written_unseen(*through, base)) {
    at::AutoGradMode no_grad(false);  // as write_data: eager wrote it under no_grad
    whole = through->detach().as_strided({base.numel()}, {1}, 0);
    whole.copy_(base);
    return true;
  }
  whole.copy_(base);
  return true;
}

// The byte base of inputs of different dtypes (x and x.view(torch.int32), or b[::2] and b.real of
// a complex b) may hold writes that no member covers either: x.as_strided_((2,), (3,), 0) of a
// complex member, then uniform_, writes bytes 24..31 of which b.real covers only 24..27. Eagerly
// and in graphs with views, the whole storage is written as bytes, through a member seen as its
// storage's elements (as_strided) and then as bytes (view), and nothing else; after metadata ops
// too, as flat storages are (eagerly after them, in graphs before: x1 = b.view(torch.int32)
// beside b[::2], x1.masked_fill_(..), then x1.as_strided_ to fewer elements).
// See Note [Inputs: writes outside every input's elements].
bool write_whole_bytes(const std::vector<at::Tensor>& originals, c10::ArrayRef<size_t> members,
                       const AliasStorage& storage) {
  if (!storage.bytes() || (!storage.flat_views_kept() && calls_may_be_traced())) return false;
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
// name instead (with or without a metadata change after the write).
// Writes through the inputs and their views stay inside the inputs' elements and are written
// back per input.
void check_outside_writes_expressible(const std::vector<at::Tensor>& originals,
                                      c10::ArrayRef<size_t> members, const AliasStorage& storage,
                                      bool any_metadata) {
  // After metadata ops, only a graph without views refuses: eagerly, and in a graph with views
  // (which wrote the storage whole before them where it could), what write_whole_storage could
  // not do (a storage grown past the caller's) is left to the per-input writes.
  if (!storage.flat() || !storage.written_outside_members() ||
      (any_metadata && (!calls_may_be_traced() || storage.flat_views_kept()))) {
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
// in it. A resize_ the epilogue replays bumps the input as eager's did (the wrapper counted it
// too), except one eager made inside a kernel that bumps nothing, which replays below
// ADInplaceOrView (Note [Schema: in-place arguments an op resizes]). Under torch.inference_mode()
// an ordinary input's wrapper is made outside it, an ordinary tensor that counts as its input
// does (eager's writes there bump ordinary tensors); an inference tensor's counts nothing.
// Rejected: sharing the caller's counter with the wrapper (the epilogue's copy_ would
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
  std::vector<size_t> moved;
  // The wrapper each input's own memory is written from: an input given other data leaves one
  // behind in that memory (Note [Inputs: an input given other data]).
  std::vector<at::Tensor> own_memory = wrappers;
  for (size_t i = 0; i < wrappers.size(); ++i) {
    if (!originals[i].defined()) continue;
    auto* impl = get_impl(wrappers[i]);
    TORCH_CHECK(impl->is_up_to_date(), "functionalize: write-back: sync the wrappers first.");
    if (moved_to_other_data(originals[i], *impl)) {
      moved.push_back(i);
      // (Under a tracer the input's own memory takes the new data: nothing else may see it.)
      if (!impl->left_behind().defined() || calls_may_be_traced()) continue;
      own_memory[i] = impl->left_behind();
      impl = unsafe_get_impl(own_memory[i]);
      impl->sync_();
    }
    auto& group = groups[&impl->alias_storage()];
    if (group.empty()) order.push_back(&impl->alias_storage());
    // One tensor passed twice is written back once (Note [Inputs: one tensor passed twice]).
    if (same_object(originals, group, originals[i])) continue;
    group.push_back(i);
  }
  // Before any write: a refusal must leave every input as it was.
  std::vector<OtherData> other_data;
  other_data.reserve(moved.size());
  for (size_t i : moved) other_data.push_back(plan_other_data(originals, wrappers, i));
  auto has_metadata = [&](const AliasStorage* storage) {
    return std::any_of(groups[storage].begin(), groups[storage].end(), [&](size_t i) {
      return unsafe_get_impl(own_memory[i])->has_metadata_mutation();
    });
  };
  // The metadata ops below set each input's geometry in storage coordinates (as_strided_ with
  // its offset): a make_fx graph then holds only for inputs laid out like these, and checks so
  // before any write (Note [Inputs: storage coordinates under a tracer]).
  if (traced_without_guards()) {
    for (const auto* storage : order) {
      if (has_metadata(storage)) guard_traced_input(*storage);
    }
  }
  // A recorded epilogue writes a flat storage (or a byte base) whole before the metadata ops, not
  // after them (Note [Inputs: writes outside every input's elements]); such a storage needs no
  // other write.
  std::unordered_set<const AliasStorage*> written_whole;
  if (calls_may_be_traced()) {
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
      auto* impl = unsafe_get_impl(own_memory[i]);
      if (impl->has_metadata_mutation() && written_whole.count(storage) == 0 &&
          write_entry_elements(originals[i], own_memory[i])) {
        final_written.insert(i);
      }
      apply_metadata_mutations(originals[i], *impl);
      write_grown_storage(originals[i], *impl);
      write_restored_storage(originals[i], *impl);
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
        (!any_metadata || !calls_may_be_traced() || storage->flat_views_kept()) &&
        write_whole_storage(originals, members, *storage)) {
      continue;
    }
    if ((!any_metadata || !calls_may_be_traced()) &&
        write_whole_bytes(originals, members, *storage)) {
      continue;
    }
    check_outside_writes_expressible(originals, members, *storage, any_metadata);
    // A member that is now its whole storage holds every element the others do: written alone,
    // the others need no write (and one whose elements share memory could not take one:
    // x.expand(3) beside x.view(-1)).
    const auto whole = std::find_if(members.begin(), members.end(), [&](size_t i) {
      return storage->flat() && is_whole_storage(originals[i]);
    });
    if (whole != members.end()) {
      write_data(originals[*whole], *unsafe_get_impl(own_memory[*whole]));
      continue;
    }
    const int cover =
        members.size() > 1 && !any_metadata ? covering_member(originals, members) : -1;
    if (cover >= 0) {
      write_data(originals[members[cover]], *unsafe_get_impl(own_memory[members[cover]]));
      continue;
    }
    for (size_t i : members) {
      if (final_written.count(i) == 0) write_data(originals[i], *unsafe_get_impl(own_memory[i]));
    }
  }
  for (const auto& plan : other_data) {
    give_other_data(originals[plan.index], wrappers[plan.index], plan);
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

}  // namespace tfz::detail
