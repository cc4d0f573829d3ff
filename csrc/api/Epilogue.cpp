// The input epilogue: writing inputs' mutations back to the caller's tensors. See api/Epilogue.h.
#include "api/Epilogue.h"

#include "api/InputGroups.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/MemoryOverlap.h"
#include "core/Recorder.h"

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

// `t`'s .data, through which a write bumps no version, where the write records no history and
// .data exists: the wrapper counted eager's writes already (Note [Inputs: version counters]). A
// sparse tensor's shallow copy holds its own indices and values, an inference tensor keeps eager's
// error, a torch.func or subclass wrapper has no .data to give, and a recorded epilogue speaks of
// the placeholder itself: those are written as they are.
bool has_data_of_its_own(const at::Tensor& t) {
  static const auto wrapped_keys =
      c10::python_ks | c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper});
  return !calls_may_be_traced() && t.layout() == c10::kStrided && !t.is_inference() &&
         !t.key_set().has_any(wrapped_keys);
}
at::Tensor unversioned(const at::Tensor& t) {
  return has_data_of_its_own(t) ? t.variable_data() : t;
}

// A write of `value` into input `original` records no history: neither requires grad.
bool without_history(const at::Tensor& original, const at::Tensor& value) {
  return !original.requires_grad() && !value.requires_grad();
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
    (without_history(original, base) ? unversioned(original) : original)
        .copy_(at::as_strided_copy(base, original.sizes(), original.strides(),
                                   original.storage_offset()));
    return covers_final;
  }
  if (base.sizes() != original.sizes()) return false;
  (without_history(original, base) ? unversioned(original) : original).copy_(base);
  return covers_final;
}

// Whether `value`, the final value of input `original`, was written only where autograd does not
// see: it kept the input's own gradient edge, or it is a leaf's value with no history (in grad
// mode eager raises on writing such a leaf, so it was written under no_grad, through .data, or
// while f had turned its requires_grad off). Its write-back then records no history either, so
// the input keeps its grad_fn or stays a leaf (Note [Autograd: writes autograd does not see]).
bool written_unseen(const at::Tensor& original, const at::Tensor& value) {
  return has_history_of(value, original) ||
         (original.requires_grad() && original.is_leaf() && value.grad_fn() == nullptr);
}

// The tensor through which the epilogue writes `base`'s elements into `original`'s storage: its
// .data where the write records no history, a detached alias where autograd must not see it.
at::Tensor storage_writer(const at::Tensor& original, const at::Tensor& base) {
  if (without_history(original, base)) return unversioned(original);
  return written_unseen(original, base) ? original.detach() : original;
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

void write_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const at::Tensor& value = impl.value();
  // An input whose elements share memory (x.expand(3, 3)) is written through its whole storage
  // (write_whole_storage); where that cannot be done, copy_ into it would raise torch's
  // internal-overlap error, so the reason is named instead.
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
  // A leaf value over an input that does not require grad: a write with no history (below).
  if (unseen ||
      (!original.requires_grad() && (!value.requires_grad() || value.grad_fn() == nullptr))) {
    // No history to record. Eagerly through x.data, which bumps no version: the wrapper counted
    // eager's writes, and a write through x.data counts none (Note [Inputs: version counters]).
    // Grad mode changes only where it matters, so a graph switches it only for such inputs.
    at::AutoGradMode no_grad(!unseen && c10::GradMode::is_enabled());
    unversioned(original).copy_(value);
    // A leaf value that requires grad over an input that does not: f wrote the input, then
    // called requires_grad_() on it, and eager's input ends a leaf that requires grad (a graph's
    // caller sets that flag itself: no op records it).
    if (!original.requires_grad() && value.requires_grad() && !calls_may_be_traced()) {
      original.requires_grad_(true);
    }
    return;
  }
  original.copy_(value);
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
  if (without_history(*through, base)) {
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
// Note [Inputs: an input given other data]
// `x.data = y` or x.set_(y) inside f on an input x (torch.nn.utils.vector_to_parameters, weight
// averaging, parametrize) moves x's wrapper into y's alias storage
// (Note [Wrapper: x.data = y keeps x's autograd identity]). Eager's caller then holds x with y's
// memory, geometry and dtype, and x's old memory, which a buffer x views still shows, keeps the
// values it had, writes made before the move included. So the wrapper leaves a copy of itself
// behind in its old storage (left_behind), which the epilogue writes back as any input; then,
// untraced, the caller's x is given the final value's memory as eager's `x.data =` gives it
// (set_data): x keeps its autograd identity and version counter, and shares memory with what f
// returns of y. Where y lies in another input's memory, x is given a tensor on that memory at
// its geometry, which is in the caller's coordinates while the storage's base holds them (a flat
// base of y's dtype, an unwritten base, or a written one laid out as an input that is its whole
// storage); otherwise refused by name. A graph cannot hand its internal buffer to the caller, nor
// change its input's dtype or device, so under a tracer or capture the caller's x is resized to
// the wrapper's sizes (its strides where they are dense, no version bump) and written in its own
// memory, a storage of x's size: eager's values only where nothing else views that memory, so the
// traced input must own its whole storage alone and keep its dtype and device (else refused by
// name), and make_fx's graph checks that layout before it writes (capture's guards check every
// input's storage). Every refusal is decided before any input is written. Rejected: writing x's
// own memory untraced too (what was done first: a buffer x views, such as a flat parameter
// buffer whose slices are the parameters, silently took y's values, a float64 y was written into
// a float32 x, and writes made before the move were lost), and set_ in a graph (every replay
// would hand the caller memory the graph's next replay overwrites).
namespace {
bool moved_to_other_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  // Only after x.data = y, and not where y lives in x's own memory. (An input that is itself a
  // wrapper, of an enclosing functionalize, marks no caller storage.)
  const AliasStorage& storage = impl.alias_storage();
  return impl.data_replaced() && original.unsafeGetTensorImpl()->has_storage() &&
         maybe_get_impl(original) == nullptr && !storage.in_caller_storage(original);
}

// How the caller's input `original` takes its wrapper's other data, decided (and refused) before
// any input is written, so a refusal leaves every input as it was.
struct OtherData {
  size_t index;          // of the input
  at::Tensor in_caller;  // untraced, a tensor on another input's memory: the data to give
  bool eager_data;       // untraced: set_data with the wrapper's value (or in_caller)
};

OtherData plan_other_data(const std::vector<at::Tensor>& originals,
                          const std::vector<at::Tensor>& wrappers, size_t i) {
  const at::Tensor& original = originals[i];
  const at::Tensor& wrapper = wrappers[i];
  const auto& impl = *unsafe_get_impl(wrapper);
  const AliasStorage& storage = impl.alias_storage();
  const std::string what = "input given other data (x.data = y or x.set_(y) inside the function)";
  OtherData plan{i, at::Tensor(), false};
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return plan;  // written as any input; nothing specialized on a concrete layout
  }
  // Another input's storage that a resize grew is the caller's too, reallocated (it no longer
  // names the caller's): eager's x shares it.
  const bool grown_input_storage =
      storage.grown_start() &&
      std::any_of(wrappers.begin(), wrappers.end(), [&](const at::Tensor& w) {
        return w.defined() && !w.is_same(wrapper) && maybe_get_impl(w) != nullptr &&
               &unsafe_get_impl(w)->alias_storage() == &storage;
      });
  TORCH_CHECK_NOT_IMPLEMENTED(
      !grown_input_storage, "functionalize: an ", what,
      " onto the memory of another input whose storage grew inside the function is not "
      "supported: eager's x then shares that reallocated storage. Assign a copy (y.clone()) "
      "instead.");
  if (storage.has_caller_storage()) {
    // y lies in another input's memory: eager's x shares it. Untraced, x is given a tensor on
    // that memory at the wrapper's geometry, which is in the caller's coordinates where the
    // storage's base is (a flat base of y's dtype, y's own unwritten base, or a written one laid
    // out as an input that is its whole storage).
    TORCH_CHECK_NOT_IMPLEMENTED(
        !calls_may_be_traced(), "functionalize: an ", what,
        " onto another input's memory is not supported under a tracer or capture: eager's x "
        "then shares that input's memory, which no graph gives its input. Assign a copy "
        "(y.clone()), or call the function without tracing.");
    const at::Tensor* holder = nullptr;
    for (size_t j = 0; j < originals.size() && holder == nullptr; ++j) {
      if (j != i && originals[j].defined() && maybe_get_impl(originals[j]) == nullptr &&
          storage.in_caller_storage(originals[j])) {
        holder = &originals[j];
      }
    }
    // A written own base of an input that is its whole storage is laid out as that input (its
    // strides, from offset 0): its coordinates are still the caller's.
    const at::Tensor& base = storage.base();
    const bool caller_coordinates =
        storage.flat()
            ? !storage.bytes() && base.scalar_type() == wrapper.scalar_type()
            : storage.in_caller_coordinates(base) ||
                  (holder != nullptr && plain_strided(*holder) && is_whole_storage(*holder) &&
                   plain_strided(base) && base.storage_offset() == 0 &&
                   base.sizes() == holder->sizes() && base.strides() == holder->strides() &&
                   base.scalar_type() == holder->scalar_type());
    TORCH_CHECK_NOT_IMPLEMENTED(
        caller_coordinates && holder != nullptr && wrapper.layout() == c10::kStrided &&
            has_data_of_its_own(original),
        "functionalize: an ", what,
        " onto another input's memory, after the function wrote that memory, is not supported "
        "there (its values are no longer held in the caller's coordinates). Assign a copy "
        "(y.clone()) instead.");
    plan.in_caller =
        at::empty({0}, holder->options().dtype(wrapper.scalar_type()))
            .set_(holder->storage(), wrapper.storage_offset(), wrapper.sizes(), wrapper.strides());
    plan.eager_data = true;
    return plan;
  }
  const at::Tensor& value = impl.value();
  if (has_data_of_its_own(original) && value.layout() == original.layout() &&
      original.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(value.key_set())) {
    plan.eager_data = true;
    return plan;
  }
  if (calls_may_be_traced()) {
    const bool owns_its_memory =
        original.layout() == c10::kStrided && original.has_storage() &&
        (original.numel() == 0 ? original.storage().nbytes() == 0 : is_whole_storage(original));
    const bool shared = std::any_of(originals.begin(), originals.end(), [&](const at::Tensor& o) {
      return o.defined() && !o.is_same(original) && o.has_storage() &&
             o.storage().is_alias_of(original.storage());
    });
    TORCH_CHECK_NOT_IMPLEMENTED(
        owns_its_memory && !shared, "functionalize: an ", what,
        " is not supported under a tracer or capture when the input does not span its whole "
        "storage (a view of a larger buffer) or shares it with another input: eager's x leaves "
        "that memory as it was and takes other memory, which a graph cannot hand to the caller. "
        "Pass a tensor that owns its memory (x.clone()), or call the function without tracing.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        original.dtype() == wrapper.dtype() && original.device() == wrapper.device(),
        "functionalize: an ", what, " of another dtype or device (", original.dtype(), " on ",
        original.device(), " given ", wrapper.dtype(), " on ", wrapper.device(),
        ") is not supported under a tracer or capture: eager's x changes dtype or device, which "
        "no op of a graph does to its input. Return the converted tensor instead, or call the "
        "function without tracing.");
    // The graph writes x's own memory: it checks the layout that makes that eager's first.
    if (traced_without_guards()) record_layout_guard(original, what);
  }
  return plan;
}

void give_other_data(const at::Tensor& original, const at::Tensor& wrapper, const OtherData& plan) {
  const auto& impl = *unsafe_get_impl(wrapper);
  if (plan.in_caller.defined()) {
    original.set_data(plan.in_caller);  // eager's own `x.data =`: autograd and version stay
    return;
  }
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return write_data(original, impl);
  }
  // Eager's geometry is the wrapper's: without views its value may be laid out otherwise.
  const bool dense = wrapper.layout() == c10::kStrided && wrapper.is_non_overlapping_and_dense();
  const at::Tensor& value = impl.value();
  if (plan.eager_data) {
    at::Tensor data;
    {
      c10::AutoGradMode no_grad(false);
      data =
          dense && same_sizes_other_strides(wrapper, value)
              ? restrided_copy(
                    at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options()), value)
              : value.detach();
    }
    original.set_data(data);  // eager's own `x.data =`: autograd and version stay
    return;
  }
  const bool resized = original.sizes() != wrapper.sizes();
  // (A torch.func wrapper of the input has no storage to restride: written as it is.)
  const bool restrided = dense && original.has_storage() && original.strides() != wrapper.strides();
  if (resized || restrided) {
    // Eager's `x.data =` bumps no version; set_ bumped the wrapper's (brought over below).
    at::AutoDispatchBelowADInplaceOrView uncounted;
    if (resized) original.resize_(wrapper.sizes());
    if (dense && original.has_storage() && original.strides() != wrapper.strides()) {
      original.as_strided_(wrapper.sizes(), wrapper.strides(), original.storage_offset());
    }
  }
  write_data(original, impl);
}
}  // namespace

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
