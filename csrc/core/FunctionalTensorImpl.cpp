// The wrapper TensorImpl: construction, metadata mirroring, sync / replace / commit (its shallow
// copies, x.data and x.data = y, are in WrapperShallowCopy.cpp).
#include "core/FunctionalTensorImpl.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layer.h"
#include "core/LayerAutograd.h"
#include "core/Layout.h"
#include "core/MirroredLeaf.h"
#include "core/Recording.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Functions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <typeinfo>

namespace tfz::detail {

namespace {
c10::Storage make_storage(const at::Tensor& value) {
  return c10::Storage(c10::make_intrusive<AliasStorage>(value));
}
}  // namespace

FunctionalTensorImpl::FunctionalTensorImpl(const at::Tensor& value, int64_t layer_id)
    : c10::TensorImpl(make_storage(value), wrapper_key_set(), value.dtype()), layer_id_(layer_id) {
  TORCH_INTERNAL_ASSERT(maybe_get_impl(value) == nullptr, "wrapping a wrapper");
  // The TensorImpl constructor adds ADInplaceOrView (and drops autograd keys under
  // inference_mode); a wrapper must carry exactly our keys. See Note [Which dispatch key].
  key_set_ = wrapper_key_set();
  set_value_(value);
}

FunctionalTensorImpl::FunctionalTensorImpl(const at::Tensor& view_value,
                                           const FunctionalTensorImpl& base,
                                           std::shared_ptr<const ViewMeta> step)
    : c10::TensorImpl(c10::Storage(base.storage_), wrapper_key_set(), view_value.dtype()),
      layer_id_(base.layer_id_),
      generation_(base.generation_),
      chain_(base.chain_.extended(std::move(step))),
      replays_with_grad_(c10::GradMode::is_enabled()) {
  key_set_ = wrapper_key_set();
  // Views share their base's version counter, as eager's do.
  if (base.version_counter().enabled()) set_version_counter(base.version_counter());
  set_value_(view_value);
}

FunctionalTensorImpl::FunctionalTensorImpl(OfStorage, const at::Tensor& view_value,
                                           const c10::Storage& storage, int64_t layer_id,
                                           std::vector<std::shared_ptr<const ViewMeta>> steps)
    : c10::TensorImpl(c10::Storage(storage), wrapper_key_set(), view_value.dtype()),
      layer_id_(layer_id),
      generation_(static_cast<AliasStorage*>(storage.unsafeGetStorageImpl())->generation()),
      replays_with_grad_(c10::GradMode::is_enabled()) {
  key_set_ = wrapper_key_set();
  for (auto& step : steps) chain_.push_back(std::move(step));
  set_value_(view_value);
}

FunctionalTensorImpl::FunctionalTensorImpl(ShallowCopy, const FunctionalTensorImpl& src)
    : c10::TensorImpl(c10::Storage(src.storage_), wrapper_key_set(), src.value_.dtype()) {
  src.copy_fields_to_(*this);
  set_sizes_and_strides(src.sym_sizes(), src.sym_strides(), src.sym_storage_offset());
}

// Note [Wrapper: autograd mirrored]
// Inner calls run below our key with autograd on, so an inner value computed from tensors that
// require grad carries autograd history (grad_fn, or it is such a leaf), while the wrapper, whose
// autograd key is ours, would report requires_grad=False and no grad_fn, and
// torch.autograd.grad(wrapper_output, ...) inside the function would find no graph. So the
// wrapper's AutogradMeta mirrors its value's gradient edge: a non-leaf value's (grad_fn,
// output_nr), a leaf's requires_grad with the leaf's own grad accumulator (held here, so the
// edge recorded by ops on the value and the wrapper's edge are one node). requires_grad, grad_fn
// and is_leaf then read as in eager, and the autograd engine runs the value's backward graph
// when asked from a wrapper; the gradients it computes from a wrapper seed are wrappers, so the
// backward ops go through our kernel and are functionalized too (the AOTAutograd joint recipe:
// make_fx(functionalize(joint))). The check costs one requires_grad() per new value.
// Rejected: making the wrapper a differentiable view of its value (autograd would then record
// our kernel's redispatch twice), and an autograd kernel at our key (that key is ours already).
namespace {
// Note [Wrapper: forward-mode tangents mirrored]
// torch.autograd.forward_ad's make_dual runs, like every op, on values: the value carries the
// tangent (its AutogradMeta's forward grad), and ops on values propagate it. unpack_dual reads the
// tangent with Tensor._fw_grad of the tensor it is given, a wrapper, whose AutogradMeta had none:
// the tangent came back None, silently. So a wrapper's AutogradMeta reads forward grads from its
// value and hands a tangent out as a fresh wrapper of it (kept, since the reference it returns
// must stay valid), and a value with a tangent that requires no grad gets such a meta too.
// Rejected: copying the tangent onto the wrapper's own forward grad at each sync (a second copy
// of the truth, stale after every op on the value).
struct WrapperAutogradMeta : torch::autograd::AutogradMeta {
  WrapperAutogradMeta(at::Tensor value, int64_t layer_id)
      : value_(std::move(value)), layer_id_(layer_id) {}
  const at::Tensor& fw_grad(uint64_t level, const at::TensorBase& /*self*/) const override {
    const at::Tensor& tangent = value_._fw_grad(level);
    if (!tangent.defined()) return tangent;
    if (tangent_of_ != tangent.unsafeGetTensorImpl()) {
      tangent_ = make_fresh_wrapper(tangent, layer_id_);
      tangent_of_ = tangent.unsafeGetTensorImpl();
    }
    return tangent_;
  }
  at::Tensor value_;
  int64_t layer_id_;
  mutable at::Tensor tangent_;
  mutable const c10::TensorImpl* tangent_of_ = nullptr;
};

bool has_forward_grad(const at::Tensor& value) {
  const auto* meta = static_cast<const torch::autograd::AutogradMeta*>(
      value.unsafeGetTensorImpl()->autograd_meta());
  return meta != nullptr && meta->fw_grad_ != nullptr && !meta->fw_grad_->empty();
}

// A leaf wrapper's AutogradMeta: requires_grad and the grad accumulator of its leaf, and its
// .grad is the leaf's (Note [Autograd: .backward() inside the function]). The leaf is the value,
// or the leaf the value stands for after a write autograd did not see
// (Note [Autograd: writes autograd does not see]).
// mutable_grad() hands out the leaf's .grad slot for assignment (`w.grad = t`), which no
// AccumulateGrad hook sees: the layer notes the leaf, to make its .grad plain after the call.
struct MirroredLeafMeta final : WrapperAutogradMeta {
  MirroredLeafMeta(at::Tensor leaf, at::Tensor value, int64_t layer_id)
      : WrapperAutogradMeta(std::move(value), layer_id), leaf_(std::move(leaf)) {}
  const at::Tensor& grad() const override { return leaf_.grad(); }
  at::Tensor& mutable_grad() override {
    note_grad_assigned(layer_id_, leaf_);
    return leaf_.mutable_grad();
  }
  at::Tensor leaf_;
};
}  // namespace

// Note [Autograd: hooks on leaf wrappers]
// The autograd engine runs a leaf's hooks (Tensor.register_hook, before accumulation, and
// register_post_accumulate_grad_hook) from the autograd metadata of the tensor its gradient
// accumulator belongs to, which for a leaf wrapper is the leaf it mirrors, not the wrapper: hooks
// registered on the wrapper would never be called (gradient clipping hooks and per-parameter
// optimizer hooks would silently do nothing). So Python registers them on that leaf
// (_tensor_methods.py), and a post-accumulate hook is called with the wrapper, whose .grad is the
// leaf's. Hooks on non-leaf wrappers need nothing: they go to the grad_fn the wrapper shares with
// its value. Rejected: copying hooks across at each backward (the engine reads them during the
// backward, and a hook may be removed by its handle at any time).
at::Tensor mirrored_leaf(const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  if (impl == nullptr) return {};
  // A requires_grad_() set on the wrapper reaches its value at the next sync; the hook must go
  // where the value's accumulator will read it (w.clone().requires_grad_().register_hook(h)).
  impl->sync_requires_grad_();
  const auto* meta = dynamic_cast<const MirroredLeafMeta*>(impl->autograd_meta());
  return meta != nullptr ? meta->leaf_ : at::Tensor();
}

void FunctionalTensorImpl::mirror_autograd_(const at::Tensor& value) {
  if (C10_LIKELY(!value.requires_grad())) {
    if (C10_UNLIKELY(autograd_meta() != nullptr)) {
      set_autograd_meta(nullptr);
      grad_accumulator_.reset();
    }
    // See Note [Wrapper: forward-mode tangents mirrored].
    if (C10_UNLIKELY(has_forward_grad(value))) {
      set_autograd_meta(std::make_unique<WrapperAutogradMeta>(value, layer_id_));
    }
    return;
  }
  namespace ag = torch::autograd;
  std::unique_ptr<ag::AutogradMeta> meta;
  const auto& fn = value.grad_fn();
  // A value whose grad_fn is a leaf's grad accumulator is that leaf's data after a write autograd
  // did not see (Note [Autograd: writes autograd does not see]): the wrapper reads as the leaf.
  at::Tensor leaf = fn ? leaf_standing_for(value) : value;
  if (!leaf.defined()) {
    meta = std::make_unique<WrapperAutogradMeta>(value, layer_id_);
    meta->grad_fn_ = fn;
    meta->output_nr_ = value.output_nr();
    grad_accumulator_.reset();
    note_autograd_graph(layer_id_, fn);
    if (C10_UNLIKELY(ops_are_recorded())) note_traced_output(layer_id_, value);
  } else {
    grad_accumulator_ = fn ? fn : ag::impl::grad_accumulator(value);
    meta = std::make_unique<MirroredLeafMeta>(std::move(leaf), value, layer_id_);
    note_autograd_graph(layer_id_, grad_accumulator_);
    // The weak pointer type follows the strong one (std::weak_ptr or c10::weak_intrusive_ptr).
    meta->grad_accumulator_ = decltype(meta->grad_accumulator_)(grad_accumulator_);
    meta->requires_grad_ = true;
  }
  set_autograd_meta(std::move(meta));
}

// See Note [Strides: what eager gives], case "value order".
at::Tensor FunctionalTensorImpl::in_reported_order_(const at::Tensor& value) const {
  const auto* inner = value.unsafeGetTensorImpl();
  if (has_symbolic_sizes_strides_ || inner->has_symbolic_sizes_strides() ||
      value.layout() != c10::kStrided || value.dim() < 2 || value.sizes() != sizes() ||
      ops_are_recorded() || inner->key_set().has(c10::DispatchKey::FuncTorchBatched)) {
    return value;
  }
  const auto dense = at::infer_dense_strides(sizes(), strides());
  if (!strides_differ(value.sizes(), value.strides(), dense) ||
      may_self_overlap(sizes(), strides())) {
    return value;
  }
  InnerCallGuard guard;
  at::Tensor ordered = at::empty_strided(sizes(), dense, value.options());
  // A value with a tangent keeps copy_, which carries it (forward AD). Otherwise the reordered
  // value is value's data with value's gradient edge (a leaf's accumulator included) in any grad
  // mode: a copy_ recorded under grad mode gave it CopyBackwards, and one under no_grad (an
  // optimizer's step) no history at all.
  const bool tangent = value.unsafeGetTensorImpl()->autograd_meta() != nullptr &&
                       value._fw_grad(/*level=*/0).defined();
  if (tangent) return ordered.copy_(value);
  {
    at::AutoGradMode no_grad(false);
    ordered = at::copy(ordered, value);
  }
  return with_history_of(ordered, value, {}, /*views_kept=*/true);
}

void FunctionalTensorImpl::set_value_(const at::Tensor& value_in) {
  const at::Tensor value =
      C10_UNLIKELY(has_reference_metadata_) ? in_reported_order_(value_in) : value_in;
  value_ = value;
  mirror_autograd_(value);
  // See Note [Wrapper: mirrored conjugate and negative bits]; other bits of key_set_ stay.
  const auto value_bits = mirrored_key_set(value.key_set());
  if (C10_UNLIKELY(value_bits != mirrored_key_set(key_set_))) {
    key_set_ = (key_set_ - mirrored_key_set(key_set_)) | value_bits;
  }
  if (has_reference_metadata_ && value.sym_sizes() == sym_sizes()) {
    data_type_ = value.dtype();
    return;
  }
  has_reference_metadata_ = false;
  data_type_ = value.dtype();
  const auto* inner = value.unsafeGetTensorImpl();
  // vmap's BatchedTensorImpl answers contiguity queries only for the default format (it throws
  // for channels_last), so its flags are recomputed from the sizes and strides instead.
  const bool custom_contiguity = inner->key_set().has(c10::DispatchKey::FuncTorchBatched);
  if (C10_UNLIKELY(value.layout() != c10::kStrided && !value.is_sparse())) {
    // Compressed sparse values have no strides to mirror (they throw): the sizes, row-major.
    const bool allowed = allow_tensor_metadata_change();
    set_allow_tensor_metadata_change(true);
    set_sizes_contiguous(value.sizes());
    set_allow_tensor_metadata_change(allowed);
    return;
  }
  if (!inner->has_symbolic_sizes_strides() && !has_symbolic_sizes_strides_ && !custom_contiguity) {
    copy_metadata_(*inner);
    return;
  }
  const bool allowed = allow_tensor_metadata_change();
  set_allow_tensor_metadata_change(true);
  // The SymInt overload either way: a symbolic wrapper may receive a concrete value (fake tensors
  // whose sizes the shape environment specialized), which the int overload refuses.
  set_sizes_and_strides(value.sym_sizes(), value.sym_strides(), value.sym_storage_offset());
  set_allow_tensor_metadata_change(allowed);
}

// Note [Wrapper: metadata copied, not recomputed]
// Every new wrapper and every write mirrors the inner value's sizes, strides and offset.
// set_sizes_and_strides() would recompute numel and the six contiguity flags from them (a walk
// over the dimensions per flag, ~175 instructions on a 1-d tensor, the largest part of making a
// wrapper after the allocations); the inner TensorImpl already holds those answers for the same
// sizes and strides, so they are copied through its public, policy-respecting getters (a
// subclass with custom strides answers for itself). Symbolic shapes keep the recomputing path,
// where the flags are symbolic expressions.
// Rejected: set_sizes_and_strides() on every wrapper and write (the cost above), and a
// CustomStrides policy forwarding each query to the inner value (a virtual call per
// is_contiguous(), and a wrapper could not report strides other than its value's, which it must
// under Note [Strides: what eager gives]).
void FunctionalTensorImpl::copy_metadata_(const c10::TensorImpl& inner) {
  sizes_and_strides_.set_sizes(inner.sizes());
  sizes_and_strides_.set_strides(inner.strides());
  storage_offset_ = inner.storage_offset();
  numel_ = inner.numel();
  is_contiguous_ = inner.is_contiguous(at::MemoryFormat::Contiguous);
  is_channels_last_contiguous_ = inner.is_contiguous(at::MemoryFormat::ChannelsLast);
  is_channels_last_3d_contiguous_ = inner.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  is_channels_last_ = inner.is_strides_like_channels_last();
  is_channels_last_3d_ = inner.is_strides_like_channels_last_3d();
  is_non_overlapping_and_dense_ = inner.is_non_overlapping_and_dense();
}

void FunctionalTensorImpl::set_reference_metadata_(const at::Tensor& reference) {
  const bool allowed = allow_tensor_metadata_change();
  set_allow_tensor_metadata_change(true);
  const bool symbolic = reference.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
  if (has_symbolic_sizes_strides_ || symbolic) {
    set_sizes_and_strides(reference.sym_sizes(), reference.sym_strides(),
                          reference.sym_storage_offset());
  } else {
    set_sizes_and_strides(reference.sizes(), reference.strides(), reference.storage_offset());
  }
  set_allow_tensor_metadata_change(allowed);
  has_reference_metadata_ = true;
  // See Note [Strides: what eager gives], case "value order".
  at::Tensor ordered = in_reported_order_(value_);
  if (!ordered.is_same(value_)) {
    value_ = std::move(ordered);
    mirror_autograd_(value_);
  }
}

// Note [Wrapper: requires_grad_ set on a wrapper]
// `leaf = p.detach().requires_grad_()` inside f (functional_call with fresh leaves, then
// torch.autograd.grad over them) sets requires_grad on the wrapper, which Tensor's
// set_requires_grad does directly on the wrapper's own AutogradMeta (no op, no dispatch), so the
// value would stay a plain tensor without autograd: ops on it would record nothing, and
// autograd.grad raise "element 0 of tensors does not require grad" where eager works. So when a
// wrapper is synced for an op and its own AutogradMeta asks for grad that its value does not have,
// the value (a leaf: eager allows requires_grad_ on leaves only) is made to require grad and the
// wrapper mirrors it again, taking the value's grad accumulator: the leaf is then the value, as
// autograd.grad and the AccumulateGrad hooks expect. A .grad assigned to the wrapper before that
// sync (copy.deepcopy sets requires_grad, then .grad) moves to the leaf with it. The check costs
// one pointer test for wrappers without autograd metadata. Rejected: an AutogradMeta subclass on
// every wrapper that forwards set_requires_grad (one allocation per wrapper for a rare call).
//
// Note [Wrapper: history set on a wrapper]
// Code outside the dispatcher can give a wrapper a grad_fn directly: TorchScript's
// DifferentiableGraph (a scripted function the profiling executor has optimized, from its third
// call on) runs its forward on detached inputs and then sets its own backward node as the
// outputs' history, on the tensors it was given, which are wrappers. Their values, computed from
// detached inputs, have none, and ops unwrap to values: later ops recorded nothing, and the
// leaves got no gradient, silently. So a wrapper synced for an op whose own AutogradMeta has a
// grad_fn that its value (requiring no grad) lacks hands that edge to the value, as a
// requires_grad_ set on the wrapper is handed over above; the node then receives the gradients
// computed for its outputs, and runs its backward graph on them (through our kernel: they are
// wrappers).
// Rejected: turning the executor's optimization off inside a layer (the setting is per thread,
// but a function optimized before the call keeps its optimized plan).
void FunctionalTensorImpl::adopt_requires_grad_() {
  auto* meta = autograd_meta();
  const auto& own = static_cast<torch::autograd::AutogradMeta*>(meta)->grad_fn_;
  if (C10_UNLIKELY(own != nullptr && !value_.requires_grad())) {
    // See Note [Wrapper: history set on a wrapper].
    const auto output_nr = static_cast<torch::autograd::AutogradMeta*>(meta)->output_nr_;
    torch::autograd::impl::set_gradient_edge(value_, {own, output_nr});
    mirror_autograd_(value_);
    return;
  }
  if (!meta->requires_grad() && value_.requires_grad() &&
      dynamic_cast<const MirroredLeafMeta*>(meta) != nullptr) {
    return freeze_leaf_();
  }
  if (!meta->requires_grad() || value_.requires_grad() || value_.grad_fn() != nullptr) return;
  at::Tensor grad = meta->grad();  // meta is replaced below
  value_.unsafeGetTensorImpl()->set_requires_grad(true);
  note_leaf_made_inside(value_);
  mirror_autograd_(value_);
  if (grad.defined()) value_.mutable_grad() = std::move(grad);
}

// requires_grad_(False) on a leaf wrapper (freezing a parameter, often right after an in-place
// init under no_grad made its value stand for the leaf): the flag is the wrapper's alone, while
// the value still requires grad (the leaf, or a value whose grad_fn is the leaf's accumulator), so
// later ops would record edges to the leaf (a frozen parameter would get a .grad and train), and
// the next write under no_grad would mirror requires_grad back on. The value becomes a detached
// alias (and the storage's base, for a current base wrapper), and a .grad the wrapper had stays. A
// view whose chain cuts autograd history (nn.Parameter(t) is a detach of t) keeps it frozen when
// regenerated: its replay takes the history of its value only if that requires grad. Other views
// are left as they are (their value is their base's).
void FunctionalTensorImpl::freeze_leaf_() {
  auto& storage = alias_storage();
  const bool base = chain_.empty() && !storage.has_pending_updates() && is_up_to_date();
  if (!base && !(!chain_.empty() && chain_.cuts_history())) return;
  const at::Tensor grad = autograd_meta()->grad();
  at::Tensor frozen;
  {
    InnerCallGuard guard;
    if (views_kept_()) {
      frozen = value_.detach();
    } else {  // no view in graphs without views: Note [View: detach without views]
      at::AutoGradMode no_grad(false);
      frozen = at::detach_copy(value_);
    }
  }
  if (base) storage.set_base_(frozen);
  set_value_(frozen);  // the value requires no grad: the wrapper's metadata goes
  if (base) generation_ = storage.generation();
  if (grad.defined()) mutable_grad() = grad;
}

void FunctionalTensorImpl::sync_() {
  sync_requires_grad_();
  if (is_up_to_date()) return;
  InnerCallGuard guard;
  auto& storage = alias_storage();
  storage.refresh_captured_base();
  storage.apply_updates();
  at::Tensor value = storage.base();
  if (!chain_.empty()) {
    // A view is regenerated with the history it was taken with, whatever the grad mode of the
    // read that syncs it: one taken under no_grad has none, one taken with grad mode on keeps
    // its base's (eager's view of a base written in place keeps its grad_fn too).
    c10::AutoGradMode grad_mode(replays_with_grad_);
    for (const ViewMeta* step : chain_.steps()) value = step->forward(value);
    // A view autograd does not connect to its base (x.detach(), x.data, one taken under no_grad)
    // has a history of its own, from its own writes (d.mul_(y)): the replay keeps it.
    if ((!replays_with_grad_ || chain_.cuts_history()) && value_.requires_grad()) {
      value = with_history_of_hidden_write(value, value_, {}, views_kept_());
    }
  }
  set_value_(value);
  generation_ = storage.generation();
}

bool FunctionalTensorImpl::views_kept_() const {
  if (!chain_.empty()) return chain_.back()->reapply;
  const Layer* layer = suspended_layer() != nullptr ? suspended_layer() : current_layer();
  return layer == nullptr || layer->reapply_views;
}

void FunctionalTensorImpl::replace_(const at::Tensor& new_value_in) {
  at::Tensor new_value = new_value_in;
  if (new_value.scalar_type() != value_.scalar_type()) {
    // out= ops keep the out tensor's dtype (eager casts on write).
    InnerCallGuard guard;
    new_value = new_value.to(value_.scalar_type());
  }
  if (C10_UNLIKELY(!c10::GradMode::is_enabled()) && value_.requires_grad()) {
    // A write under no_grad: see Note [Autograd: writes autograd does not see].
    InnerCallGuard guard;
    new_value = with_history_of_hidden_write(new_value, value_, {&new_value_in}, views_kept_());
  }
  set_value_(new_value);
}

void FunctionalTensorImpl::commit_update_(bool counts_version) {
  // The kernels refuse such writes by the op's name first (check_writable); this holds for
  // every other way a write reaches a wrapper.
  TORCH_CHECK_NOT_IMPLEMENTED(
      alias_storage().apart_reason() == nullptr,
      "functionalize: cannot write this tensor: ", alias_storage().apart_reason(), ".");
  // A write bumps the version counter the wrapper shares with its views, as eager's in-place
  // kernels do (Note [Inputs: version counters]).
  if (counts_version && version_counter().enabled()) bump_version();
  auto& storage = alias_storage();
  // See Note [Inputs: storage coordinates of a written own base]: the written geometry once the
  // base is placed in the caller's coordinates.
  auto note_written = [&] {
    if (C10_UNLIKELY(storage.caller_coordinates()) && !has_symbolic_sizes_strides()) {
      storage.note_written(chain_);
    }
  };
  if (chain_.empty() && !storage.has_pending_updates() && is_up_to_date()) {
    // The base itself was written and nothing else is pending: there is no inverse to run and
    // nothing to replay, so the new value becomes the base directly and this wrapper stays up to
    // date (its next sync_ is free). Views of it see the new generation and regenerate.
    storage.set_base_(value_);
    if (!storage.base().is_same(value_)) set_value_(storage.base());
    generation_ = storage.generation();
    note_written();
    return;
  }
  // A write that autograd does not connect to the base: under no_grad, or through a chain with a
  // detach step (x.detach(), x.data). See Note [Autograd: writes autograd does not see].
  storage.add_update(value_, chain_, c10::GradMode::is_enabled() && !chain_.cuts_history());
  note_written();
}

void FunctionalTensorImpl::remember_entry_() {
  if (has_metadata_mutation()) return;
  entry_.chain = chain_;
  if (!has_symbolic_sizes_strides()) {
    entry_.geometry.emplace(sizes().vec(), strides().vec(), storage_offset());
  }
}

void FunctionalTensorImpl::count_metadata_write_(const MetadataMutation& mutation) {
  // Eager's in-place view ops and resize_ bump the version (their ADInplaceOrView kernels);
  // detach_ does not. See Note [Inputs: version counters].
  if (version_counter().enabled() &&
      mutation.op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView)) {
    bump_version();
  }
}

void FunctionalTensorImpl::mutate_view_meta_(std::shared_ptr<const ViewMeta> step,
                                             MetadataMutation mutation) {
  count_metadata_write_(mutation);
  remember_entry_();
  InnerCallGuard guard;
  set_value_(step->forward(value_));
  chain_.push_back(std::move(step));
  metadata_mutations_.push_back(std::move(mutation));
}

void FunctionalTensorImpl::resize_chain_(std::shared_ptr<const ViewMeta> step,
                                         std::vector<MetadataMutation> mutations,
                                         std::vector<std::shared_ptr<const ViewMeta>> prefix,
                                         bool counts_version) {
  TORCH_INTERNAL_ASSERT(is_up_to_date(), "resize_chain_ on a stale wrapper");
  TORCH_INTERNAL_ASSERT(prefix.empty() || step, "resize_chain_: a prefix needs a step");
  if (!mutations.empty() && counts_version) count_metadata_write_(mutations.front());
  for (auto& m : mutations) m.counts_version = m.counts_version && counts_version;
  remember_entry_();
  InnerCallGuard guard;
  auto& storage = alias_storage();
  at::Tensor start = storage.base();
  for (const auto& p : prefix) start = p->forward(start);
  at::Tensor value = step ? step->forward(start) : start;
  // A conjugate or negative view (x.adjoint()) keeps its bit through resize_ and as_strided_:
  // the new chain starts from the base's elements, so it ends with the bit steps of the old one,
  // as an aliased input's as_strided is followed by them (Note [Inputs: aliased inputs]). Without
  // them x.adjoint().resize_((1, 3)) would read the elements unconjugated.
  std::vector<std::shared_ptr<const ViewMeta>> bits;
  const auto [conj_flip, neg_flip] = chain_.bit_flips();
  // Flips mean the old chain has steps; its views-kept flag is the layer's.
  const bool reapply = !chain_.empty() && chain_.back()->reapply;
  if (conj_flip) bits.push_back(ViewMeta::of({"aten::_conj", ""}, {}, reapply));
  if (neg_flip) bits.push_back(ViewMeta::of({"aten::_neg_view", ""}, {}, reapply));
  for (const auto& b : bits) value = b->forward(value);
  set_value_(value);
  // An input of a flat storage stays one: see Note [Inputs: writes outside every input's elements].
  if (flat_member_ && storage.flat() && step && prefix.empty()) {
    // The chain's first step is the member's as_strided (bit steps may follow it).
    if (!chain_.empty()) storage.retire_member_step(*chain_.steps().front(), *step);
    storage.add_member_step(step);
  }
  chain_.clear();
  for (auto& p : prefix) chain_.push_back(std::move(p));
  if (step) chain_.push_back(std::move(step));
  // A prefix makes it no resize_ chain; bit steps after the resize's step keep it one.
  chain_is_resize_ = chain_.size() == 1;
  for (auto& b : bits) chain_.push_back(std::move(b));
  for (auto& m : mutations) metadata_mutations_.push_back(std::move(m));
}

void FunctionalTensorImpl::set_chain_from_base_(
    std::vector<std::shared_ptr<const ViewMeta>> steps) {
  chain_.clear();
  for (auto& step : steps) chain_.push_back(std::move(step));
}

void FunctionalTensorImpl::replace_storage_(const at::Tensor& new_base) {
  TORCH_INTERNAL_ASSERT(storage_.use_count() == 1, "replace_storage_ with other aliases alive");
  // The new storage holds the old one's elements: if those were written, so is it (the input
  // epilogue skips storages never written, and a write before growing was lost).
  const bool written = alias_storage().generation() != 0;
  storage_ = make_storage(new_base);
  if (written) alias_storage().set_base_(new_base);  // bumps the new storage's generation
  generation_ = alias_storage().generation();
  chain_.clear();
  chain_is_resize_ = false;
  set_value_(new_base);
}

const char* FunctionalTensorImpl::tensorimpl_type_name() const {
  return "tfz::FunctionalTensorImpl";
}

FunctionalTensorImpl* maybe_get_impl(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  auto* impl = t.unsafeGetTensorImpl();
  if (!impl->key_set().has(kAutogradKey)) return nullptr;  // one bit test for plain tensors
  // The class is final, so an exact type test is a complete (and cheaper) dynamic_cast. Keys
  // alone are not trusted: another library could make TensorImpls with PrivateUse3 keys.
  return typeid(*impl) == typeid(FunctionalTensorImpl) ? static_cast<FunctionalTensorImpl*>(impl)
                                                       : nullptr;
}

FunctionalTensorImpl* get_impl(const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  TORCH_CHECK(impl != nullptr, "functionalize: expected a functional tensor, got a plain tensor");
  return impl;
}

}  // namespace tfz::detail
