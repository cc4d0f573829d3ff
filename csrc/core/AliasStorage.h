// AliasStorage: the StorageImpl shared by every wrapper that aliases one base. Holds the current
// base value (a plain tensor), the queue of pending updates and a generation counter.
// See Note [Alias: storage and generations].
#pragma once

#include "core/ViewChain.h"
#include "core/ViewMeta.h"

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace tfz::detail {

class AliasStorage : public c10::StorageImpl {
 public:
  /// `base` must be a plain (inner) tensor.
  explicit AliasStorage(const at::Tensor& base);

  const at::Tensor& base() const { return base_; }
  /// Bumped by every queued update; wrappers whose generation differs are stale.
  uint64_t generation() const { return generation_; }

  /// Queues "the view reached through `chain` now holds `value`". `visible`: autograd sees the
  /// write at the base (made in grad mode, through no detach step); a hidden one changes the
  /// base's data but not its gradient edge (Note [Autograd: writes autograd does not see]).
  void add_update(const at::Tensor& value, const ViewChain& chain, bool visible);
  /// "The base itself now holds `value`", applied at once. Only when nothing is queued (the
  /// caller is up to date), so no earlier update can be lost. Bumps the generation. The new base
  /// may be `value` copied into the old base's storage
  /// (Note [Alias: writes to a value that is not its whole storage]): read it back with base().
  void set_base_(const at::Tensor& value);
  bool has_pending_updates() const { return !updates_.empty(); }
  /// Folds queued updates into the base (inverse chains, last step first). Returns whether
  /// anything was applied. Runs its ops under an InnerCallGuard.
  bool apply_updates();

  /// A storage lifted from a tensor captured from outside the function, only to view it without
  /// views (Note [Kernel: views of captured tensors]); writes to it are refused.
  void mark_captured();
  bool captured() const { return captured_; }
  /// The captured base was written since its views were last regenerated: in place by an op on
  /// plain tensors (its version moved), or unseen (mark_captured_base_written).
  /// See Note [Alias: captured bases written in place].
  bool captured_base_written() const {
    return C10_UNLIKELY(captured_) && (captured_written_ || captured_version_changed_());
  }
  void mark_captured_base_written() { captured_written_ = true; }
  /// Makes every view of a written captured base stale (bumps the generation) and notes the
  /// base's version as seen.
  void refresh_captured_base();

  /// A storage whose base is the flat storage of aliased inputs (Note [Inputs: aliased inputs]):
  /// element i of the base is element i of eager's storage.
  /// `views_kept`: the base is a view of the caller's storage (remove="mutations").
  void mark_flat(bool views_kept) {
    flat_ = true;
    flat_views_kept_ = views_kept;
  }
  bool flat() const { return flat_; }
  /// A storage whose base is the byte storage of aliased inputs of different dtypes
  /// (Note [Inputs: aliased inputs]): element i of the base is byte i of eager's storage.
  void mark_bytes(bool views_kept) {
    bytes_ = true;
    flat_views_kept_ = views_kept;
  }
  bool bytes() const { return bytes_; }
  bool flat_views_kept() const { return flat_views_kept_; }
  /// The step that makes an input of a flat storage a view of it: writes through chains that
  /// begin elsewhere (an as_strided from the base) may reach elements no input covers.
  /// See Note [Inputs: writes outside every input's elements].
  void add_member_step(const ViewMeta* step) { member_steps_.push_back(step); }
  /// A member's new step after resize_ or as_strided_ replaced its chain: writes through it stay
  /// inside the member's final elements, which the epilogue writes (kept alive here, since the
  /// member's chain may be replaced again).
  void add_member_step(std::shared_ptr<const ViewMeta> step) {
    member_steps_.push_back(step.get());
    kept_member_steps_.push_back({std::move(step), generation_});
  }
  /// A member's step `old` is replaced by `replacement`: a replacement step (`old`, or an
  /// earlier one `old` covered) whose elements `replacement` may not cover stops counting as a
  /// member's, and if the storage was written since it was added, those writes may lie outside
  /// the member's final elements.
  void retire_member_step(const ViewMeta& old, const ViewMeta& replacement);
  void mark_written_outside_members() { written_outside_members_ = true; }
  bool is_member_step(const ViewMeta* step) const {
    return std::find(member_steps_.begin(), member_steps_.end(), step) != member_steps_.end();
  }
  bool written_outside_members() const { return written_outside_members_; }
  /// Traced without views: the strides eager's tensor has where the base's value (a fresh
  /// result computed from *_copy values) has others.
  /// See Note [Strides: what eager gives], case "storage coordinates".
  void set_eager_geometry(c10::IntArrayRef sizes, c10::IntArrayRef strides) {
    eager_sizes_ = sizes.vec();
    eager_strides_ = strides.vec();
  }
  /// Those strides, when the base still has the sizes they were recorded for; nullopt otherwise.
  std::optional<c10::IntArrayRef> eager_strides() const {
    if (eager_strides_.empty() || base_.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
        base_.sizes() != c10::IntArrayRef(eager_sizes_)) {
      return std::nullopt;
    }
    return c10::IntArrayRef(eager_strides_);
  }
  /// A storage that replaced a lone input's when resize_ grew it: its base (1-D) holds the
  /// caller's storage elements from `start` on (Note [Inputs: writes to a grown storage]).
  void mark_grown(int64_t start) { grown_start_ = start; }
  std::optional<int64_t> grown_start() const { return grown_start_; }
  /// A lone input's own base: the caller's storage element its element 0 is (the input's
  /// storage offset on entry; an input that does not start its storage keeps its own base under
  /// a tracer, Note [Inputs: storage coordinates under a tracer]). 0 for every other storage.
  /// `tail_covered`: the input's elements are every element of the caller's storage from its
  /// first one to the storage's end, so a storage grown from the base holds all of them.
  void set_caller_origin(int64_t element, bool tail_covered) {
    caller_origin_ = element;
    caller_tail_covered_ = tail_covered;
  }
  int64_t caller_origin() const { return caller_origin_; }
  bool caller_tail_covered() const { return caller_tail_covered_; }
  /// That input itself (the caller's plain tensor), for restore_caller_coordinates.
  void set_caller_input(const at::Tensor& input);
  /// Undefined for every other storage.
  const at::Tensor& caller_input() const { return caller_input_; }
  /// A meta tensor of that input's geometry on entry (the epilogue's metadata ops change the
  /// caller's tensor itself).
  const at::Tensor& caller_entry() const { return caller_entry_; }
  /// From now on, keeps a lone input's own base in the caller's storage coordinates, so that a
  /// resize_ within the storage addresses eager's elements: a written base (a fresh value whose
  /// element 0 is the input's first one) becomes a view at the input's geometry of a copy of the
  /// caller's whole storage with the written elements in it (the layout of a traced input is
  /// guarded), an unwritten one stays the caller's tensor, and later values of the base are
  /// copied in the same way. Nothing for other storages. Call with no update pending. Returns
  /// whether the base changed (wrappers then sync again). `views_kept`: remove="mutations" (the
  /// epilogue can write the storage through a view).
  /// See Note [Inputs: storage coordinates of a written own base].
  bool restore_caller_coordinates(bool views_kept);
  bool caller_coordinates_views_kept() const { return caller_views_kept_; }
  /// Whether `inner`'s storage coordinates are the caller's storage's: it lies in that storage,
  /// or it is the base after restore_caller_coordinates.
  bool in_caller_coordinates(const at::Tensor& inner) const {
    return in_caller_storage(inner) || (caller_coordinates_ && inner.is_same(base_));
  }
  bool caller_coordinates() const { return caller_coordinates_; }
  /// A write through `chain` (a view of the base, or the base itself when empty), noted on a
  /// storage in the caller's coordinates only: the epilogue writes the storage whole when one
  /// lies outside the input's entry and final elements.
  void note_written(const ViewChain& chain);
  const std::vector<at::Tensor>& written_regions() const { return written_regions_; }
  /// A storage whose base's element 0 is not eager's storage element 0, so storage coordinates
  /// (as_strided) cannot be expressed on it. `why` (a string literal) completes the error that
  /// as_strided raises: an input that starts inside a larger storage and is not flat
  /// (Note [Inputs: inputs that do not start their storage]), or a value that is not its whole
  /// storage (Note [Alias: writes to a value that is not its whole storage]).
  void mark_offset_base(const char* why) { offset_base_ = why; }
  bool offset_base() const { return offset_base_ != nullptr; }
  const char* offset_base_reason() const { return offset_base_; }
  /// The storage of one of several inputs that share the caller's storage but could not be
  /// grouped (symbolic sizes, another layout): each input has its own, so a write through one
  /// would not reach the others, and writes are refused; `why` (a string literal) completes the
  /// error. See Note [Inputs: aliased inputs].
  void mark_apart(const char* why) { apart_ = why; }
  const char* apart_reason() const { return apart_; }
  /// A storage that wraps inputs: `storage` is the caller's, which the epilogue writes.
  void mark_caller_storage(const c10::StorageImpl* storage) { caller_storage_ = storage; }
  /// Under a Python tracer, the caller's input this lone storage wraps and its index, until its
  /// storage coordinates are first used (guard_traced_input in core/LayoutGuards.h); handed over
  /// once. See Note [Inputs: storage coordinates under a tracer].
  void set_traced_input(const at::Tensor& input, size_t index) {
    traced_input_ = input;
    traced_index_ = index;
  }
  std::optional<std::pair<at::Tensor, size_t>> take_traced_input() const {
    if (!traced_input_.defined()) return std::nullopt;
    return std::make_pair(std::exchange(traced_input_, at::Tensor()), traced_index_);
  }
  /// Whether this is an input's storage (it has the caller's storage).
  bool has_caller_storage() const { return caller_storage_ != nullptr; }
  /// Whether `inner` lies in the caller's memory (the input itself, or a view of it with views
  /// kept): see Note [Kernel: writes to inputs under autograd].
  bool in_caller_storage(const at::Tensor& inner) const {
    return caller_storage_ != nullptr && inner.unsafeGetTensorImpl()->has_storage() &&
           inner.storage().unsafeGetStorageImpl() == caller_storage_;
  }

 private:
  // `value`, the new value of the whole base, placed where eager's write leaves it.
  at::Tensor in_own_storage_(const at::Tensor& value);
  struct Update {
    at::Tensor value;
    ViewChain chain;
    bool visible;  // see add_update
  };
  // The base after `update` (inverse chain, last step first), under the current grad mode.
  at::Tensor folded_(const Update& update);
  at::Tensor base_;
  std::vector<Update> updates_;
  uint64_t generation_ = 0;
  bool captured_ = false;
  bool captured_written_ = false;
  std::optional<uint32_t> captured_version_;  // none for inference tensors (no counter)
  bool captured_version_changed_() const;
  bool flat_ = false;
  bool bytes_ = false;
  bool flat_views_kept_ = false;
  const char* offset_base_ = nullptr;        // why, when the base is offset (see mark_offset_base)
  const char* apart_ = nullptr;              // why writes are refused (see mark_apart)
  int64_t caller_origin_ = 0;                // see set_caller_origin
  bool caller_tail_covered_ = true;          // see set_caller_origin
  at::Tensor caller_input_, caller_entry_;   // see set_caller_input
  bool caller_coordinates_ = false;          // see restore_caller_coordinates
  bool caller_views_kept_ = false;           // see restore_caller_coordinates
  std::vector<at::Tensor> written_regions_;  // meta tensors, see note_written
  const c10::StorageImpl* caller_storage_ = nullptr;  // compared, never dereferenced
  mutable at::Tensor traced_input_;                   // see set_traced_input
  size_t traced_index_ = 0;
  std::vector<const ViewMeta*> member_steps_;
  // Replacement member steps, with the generation when each was added.
  std::vector<std::pair<std::shared_ptr<const ViewMeta>, uint64_t>> kept_member_steps_;
  // Replaced member steps still counted as members' (their replacement covered them).
  std::vector<const ViewMeta*> retired_;
  bool written_outside_members_ = false;
  std::vector<int64_t> eager_sizes_, eager_strides_;  // see set_eager_geometry
  std::optional<int64_t> grown_start_;
};

}  // namespace tfz::detail
