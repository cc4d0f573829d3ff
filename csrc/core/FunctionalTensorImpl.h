// FunctionalTensorImpl: the wrapper TensorImpl. Holds the current inner value, its view chain
// from the alias storage's base, and the generation it last synced to. Sizes, strides and dtype
// mirror the inner value. See Note [Alias: storage and generations] for the update protocol.
#pragma once

#include "core/AliasStorage.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/function.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tfz::detail {

/// An in-place view op applied to a wrapper, kept to replay it on the user's input at the end.
struct MetadataMutation {
  c10::OperatorHandle op;         // the in-place op as called (e.g. aten::t_)
  std::vector<c10::IValue> args;  // arguments after self
  // Whether eager's call bumped the version (false: a resize inside a kernel that bumps none,
  // replayed on the input without a bump). See Note [Inputs: version counters].
  bool counts_version = true;
};

class FunctionalTensorImpl final : public c10::TensorImpl {
 public:
  /// A base wrapper with its own fresh AliasStorage. `value` must be plain.
  FunctionalTensorImpl(const at::Tensor& value, int64_t layer_id);
  /// A view wrapper: shares `base`'s storage, chain = base's chain + `step`.
  FunctionalTensorImpl(const at::Tensor& view_value, const FunctionalTensorImpl& base,
                       std::shared_ptr<const ViewMeta> step);
  struct OfStorage {};
  /// A view through `steps` of the base of `storage`, an AliasStorage of layer `layer_id`, whose
  /// pending updates are applied: a tensor set_ onto a wrapper's storage
  /// (Note [Kernel: set_ onto a functional tensor's storage]).
  FunctionalTensorImpl(OfStorage, const at::Tensor& view_value, const c10::Storage& storage,
                       int64_t layer_id, std::vector<std::shared_ptr<const ViewMeta>> steps);
  struct ShallowCopy {};
  /// A second wrapper sharing every field of `src` (for shallow_copy_and_detach).
  FunctionalTensorImpl(ShallowCopy, const FunctionalTensorImpl& src);

  const at::Tensor& value() const { return value_; }
  int64_t layer_id() const { return layer_id_; }
  const ViewChain& chain() const { return chain_; }
  AliasStorage& alias_storage() const {
    return *static_cast<AliasStorage*>(storage_.unsafeGetStorageImpl());
  }
  bool is_up_to_date() const {
    return generation_ == alias_storage().generation() && !alias_storage().captured_base_written();
  }
  bool has_metadata_mutation() const { return !metadata_mutations_.empty(); }
  /// Whether `x.data = y` gave this wrapper another tensor's data (shallow_copy_from): see
  /// Note [Inputs: an input given other data].
  bool data_replaced() const { return data_replaced_; }
  const std::vector<MetadataMutation>& metadata_mutations() const { return metadata_mutations_; }
  /// The chain, sizes, strides and offset this wrapper had before its first metadata mutation
  /// (its current ones if it had none; no geometry for symbolic shapes). Views taken before a
  /// t_() or resize_() derive from them (Note [Inputs: outputs that alias inputs]).
  struct EntryState {
    ViewChain chain;
    std::optional<std::tuple<std::vector<int64_t>, std::vector<int64_t>, int64_t>> geometry;
  };
  const ViewChain& entry_chain() const { return has_metadata_mutation() ? entry_.chain : chain_; }
  const EntryState& entry_state() const { return entry_; }

  /// Applies pending updates of the storage and, if this wrapper is stale, replays its chain
  /// from the new base. Runs its ops under an InnerCallGuard.
  void sync_();
  /// Makes the next sync_() replay this view's chain from the base whatever the generation (its
  /// value came from an untraced inner call: Note [Graphs: views taken with the tracer set aside]).
  void mark_stale_() { generation_ = kNeverSynced; }
  /// Whether mark_stale_() was called and no sync_() has run since.
  bool marked_stale() const { return generation_ == kNeverSynced; }
  /// The part of sync_() that view ops (which do not sync) need too: a requires_grad_ set on the
  /// wrapper reaches its value (Note [Wrapper: requires_grad_ set on a wrapper]).
  void sync_requires_grad_() {
    if (C10_UNLIKELY(autograd_meta() != nullptr)) adopt_requires_grad_();
  }
  /// A mutation produced `new_value` for this wrapper: adopt it (cast back to this wrapper's
  /// dtype if the functional op promoted it). Follow with commit_update_().
  void replace_(const at::Tensor& new_value);
  /// Queues this wrapper's value on the storage so the base and the other aliases see it (or,
  /// for an up-to-date base wrapper, makes it the storage's base at once).
  /// `counts_version`: the write bumps the version counter, as eager's kernel of the op does.
  void commit_update_(bool counts_version = true);
  /// An in-place view op (t_, squeeze_, ...): extend the chain with `step`, replay it on the
  /// value, and remember `mutation` for the input epilogue.
  void mutate_view_meta_(std::shared_ptr<const ViewMeta> step, MetadataMutation mutation);

  /// Views removed: report `reference`'s sizes/strides/offset (eager's, computed on meta) instead
  /// of the *_copy value's, for as long as the value keeps these sizes.
  /// See Note [Strides: what eager gives], case "view wrappers".
  void set_reference_metadata_(const at::Tensor& reference);
  /// True while this wrapper reports a reference's metadata (set_reference_metadata_), which is
  /// the only way its sizes and strides can differ from its value's.
  bool has_reference_metadata() const { return has_reference_metadata_; }

  /// resize_: make this wrapper `step` applied to the storage's base, replacing its
  /// chain (nullptr: the base itself), and remember `mutations` (in order) for the input
  /// epilogue. `prefix`: steps before `step` that reinterpret the base in this wrapper's dtype
  /// (as_strided_ of a view of another dtype, see base_in_dtype_of in ViewKernels.cpp); a chain
  /// with a prefix is no resize_ chain. See Note [Kernel: resize_].
  /// `counts_version`: false for a resize inside a kernel that bumps no version (eager resizes
  /// natively there, bumping nothing).
  void resize_chain_(std::shared_ptr<const ViewMeta> step, std::vector<MetadataMutation> mutations,
                     std::vector<std::shared_ptr<const ViewMeta>> prefix = {},
                     bool counts_version = true);
  /// A fresh view whose steps apply to the storage's base rather than to the tensor it was
  /// taken from (as_strided without views): its chain becomes `steps` (the as_strided step,
  /// after the base's reinterpretation in the view's dtype where it has another).
  void set_chain_from_base_(std::vector<std::shared_ptr<const ViewMeta>> steps);
  /// resize_ past the storage: this wrapper (the storage's only user) moves to a new storage
  /// whose base is `new_base`, with an empty chain.
  void replace_storage_(const at::Tensor& new_base);
  /// True if the chain is empty or only holds a resize_ step: resize_ may apply again.
  bool is_resizable_base() const { return chain_.empty() || chain_is_resize_; }
  /// Whether this wrapper shows exactly its storage's base (a detached alias: torch.tensor([]),
  /// which lift_fresh hands over as a view of itself, or x.detach()): resized as the base would be.
  bool views_all_of_its_base() const {
    const at::Tensor& base = alias_storage().base();
    return dtype() == base.dtype() && sym_sizes() == base.sym_sizes() &&
           sym_strides() == base.sym_strides() && sym_storage_offset() == base.sym_storage_offset();
  }
  /// This wrapper is an input of a flat storage (Note [Inputs: aliased inputs]): the steps its
  /// resize_ / as_strided_ give it count as a member's.
  void mark_flat_member() { flat_member_ = true; }
  /// This wrapper stands for one of the function's inputs (wrap_inputs marks it; its shallow
  /// copies and views do not stand for it).
  void mark_input() { input_ = true; }
  bool is_input() const { return input_; }
  /// Whether giving this input `other`'s data would move it within its own memory to another
  /// geometry, which the epilogue does not replay (Note [Inputs: an input given other data]).
  bool moves_within_its_memory(const FunctionalTensorImpl& other) const;
  /// An input given other data: a wrapper standing where it stood in its own memory when it
  /// first moved, so that the epilogue writes that memory as eager left it (undefined if it
  /// never moved).
  const at::Tensor& left_behind() const { return left_behind_; }

  // TensorImpl overrides.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override;
  // Asked for a wrapper that carries the SparseCsr bit: which compressed layout (CSR, CSC, BSR,
  // BSC) its value has. See Note [Wrapper: mirrored conjugate and negative bits]
  c10::Layout layout_impl() const override { return value_.layout(); }
  bool views_kept_() const;  // the remove mode of this wrapper's layer
  void detach_();            // See Note [Wrapper: .data is a detached alias]
  void count_metadata_write_(const MetadataMutation& mutation);  // eager's version bump
  void set_value_(const at::Tensor& value);                      // value_ + mirrored metadata
  void mirror_autograd_(const at::Tensor& value);  // See Note [Wrapper: autograd mirrored]
  void adopt_requires_grad_();  // See Note [Wrapper: requires_grad_ set on a wrapper]
  void freeze_leaf_();          // requires_grad_(False) on a leaf wrapper
  // See Note [Strides: what eager gives], case "value order".
  at::Tensor in_reported_order_(const at::Tensor& value) const;
  void copy_metadata_(const c10::TensorImpl& inner);  // non-symbolic sizes/strides + flags
  void copy_fields_to_(FunctionalTensorImpl& dest) const;

  at::Tensor value_;
  int64_t layer_id_;
  // No storage reaches this generation (they count up from 0).
  static constexpr uint64_t kNeverSynced = ~uint64_t{0};
  uint64_t generation_ = 0;
  ViewChain chain_;
  std::vector<MetadataMutation> metadata_mutations_;
  EntryState entry_;  // set at the first metadata mutation
  void remember_entry_();
  bool has_reference_metadata_ = false;
  bool data_replaced_ = false;
  bool chain_is_resize_ = false;
  bool flat_member_ = false;  // an input of a flat storage (see mark_flat_member)
  bool input_ = false;        // see mark_input
  at::Tensor left_behind_;    // see left_behind
  // Grad mode when this view was taken: its chain replays under it (see sync_).
  bool replays_with_grad_ = true;
  // torch's owning pointer to an autograd Node: std::shared_ptr up to torch 2.11,
  // c10::intrusive_ptr since. Read from TensorBase::grad_fn()'s return type (a feature check, not
  // a version test), so one source builds against both.
  using NodePtr = std::decay_t<decltype(std::declval<const at::TensorBase&>().grad_fn())>;
  // A leaf value's grad accumulator, kept alive for the wrapper's AutogradMeta (a weak pointer).
  NodePtr grad_accumulator_;
};

/// nullptr unless `t` is one of our wrappers.
FunctionalTensorImpl* maybe_get_impl(const at::Tensor& t);
/// The wrapper impl of `t`; throws if `t` is not a wrapper.
FunctionalTensorImpl* get_impl(const at::Tensor& t);
/// Fast cast, no check: only for tensors already known to be wrappers.
inline FunctionalTensorImpl* unsafe_get_impl(const at::Tensor& t) {
  return static_cast<FunctionalTensorImpl*>(t.unsafeGetTensorImpl());
}

}  // namespace tfz::detail
