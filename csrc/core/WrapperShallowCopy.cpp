// The wrapper's shallow copies: x.data and x.detach()'s shallow copy (a detached alias), and
// x.data = y / x.set_(y) taking another wrapper's storage, value and chain while keeping x's
// autograd identity; copy_fields_to_ is the field copy both share.
#include "core/FunctionalTensorImpl.h"

#include "core/AutogradHistory.h"
#include "core/Layer.h"
#include "core/ViewMeta.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

void FunctionalTensorImpl::copy_fields_to_(FunctionalTensorImpl& dest) const {
  dest.value_ = value_;
  dest.layer_id_ = layer_id_;
  dest.generation_ = generation_;
  dest.chain_ = chain_;
  dest.metadata_mutations_ = metadata_mutations_;
  dest.entry_ = entry_;
  dest.has_reference_metadata_ = has_reference_metadata_;
  dest.chain_is_resize_ = chain_is_resize_;
  dest.replays_with_grad_ = replays_with_grad_;
  dest.key_set_ = key_set_;
}

// Note [Wrapper: .data is a detached alias]
// x.data (variable_data, and tensor_data in C++) is a shallow copy of x without autograd metadata:
// eager's shares x's memory and has no history. Our shallow copy shares x's alias storage, so
// writes through it reach x, but a plain copy of x's value would carry its history: x.data * 2
// would require grad, and x.data.mul_(2) give x the write's history (wrong gradients). So the copy
// is x followed by a detach step, as x.detach() is: its value has no history, and writes through it
// reach x as writes autograd does not see (Note [Autograd: writes autograd does not see]).
// Rejected: a flag on the wrapper that strips history from its values (a second way to say what a
// detach step says, which every write-back would have to ask for).
void FunctionalTensorImpl::detach_() {
  static const c10::OperatorName detach{"aten::detach", ""};
  chain_.push_back(ViewMeta::of(detach, {}, views_kept_()));
  if (!value_.requires_grad()) return;  // the same data; replays apply the step
  InnerCallGuard guard;
  set_value_(chain_.back()->forward(value_));
}

c10::intrusive_ptr<c10::TensorImpl> FunctionalTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<FunctionalTensorImpl>(ShallowCopy{}, *this);
  impl->detach_();
  impl->set_version_counter(version_counter);
  impl->set_allow_tensor_metadata_change(allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> FunctionalTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  return shallow_copy_and_detach(static_cast<const c10::VariableVersion&>(version_counter),
                                 allow_tensor_metadata_change);
}

// Note [Wrapper: x.data = y keeps x's autograd identity]
// Eager's `x.data = y` (set_data: torch.nn.utils.vector_to_parameters, weight averaging) gives x
// y's memory and metadata and keeps x's autograd metadata: a leaf that requires grad stays that
// leaf, with its .grad and hooks, and a non-leaf keeps its grad_fn. Our shallow copy takes y's
// alias storage, chain and value; the value is then given x's old gradient edge, as a write
// autograd does not see is (Note [Autograd: writes autograd does not see]), so later ops record
// the same edge and backward accumulates into the same leaf. Rejected: taking y's autograd state
// along with its value (x would stop requiring grad: "element 0 of tensors does not require
// grad" at the next backward, where eager trains on).
bool FunctionalTensorImpl::moves_within_its_memory(const FunctionalTensorImpl& other) const {
  return input_ && other.storage_.unsafeGetStorageImpl() == storage_.unsafeGetStorageImpl() &&
         (other.dtype() != dtype() || other.sym_sizes() != sym_sizes() ||
          other.sym_strides() != sym_strides() ||
          other.sym_storage_offset() != sym_storage_offset());
}

void FunctionalTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<FunctionalTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr,
              "functionalize: cannot shallow-copy a plain tensor into a functional tensor "
              "(tensor.data = ... mixing plain and functional tensors)");
  other->sync_();  // a write through a view of it may be pending (y.diagonal().fill_(1))
  TORCH_CHECK_NOT_IMPLEMENTED(
      !moves_within_its_memory(*other),
      "functionalize: `x.data = y` of an input x onto a tensor y in x's own memory with other "
      "sizes, strides, offset or dtype (x.data = x[1:], or y another input viewing the same "
      "storage) is not supported: the caller's x would take y's geometry in its storage, which "
      "the epilogue does not replay. Assign a copy (y.clone()) or slice the input outside the "
      "function.");
  // The input's own memory at its own geometry and dtype (x.data = x.detach(), x.expand_as(x)):
  // eager's x shows what it showed, so the wrapper keeps its value, chain and the metadata
  // changes the epilogue replays on the caller's x (a t_() before).
  if (input_ && other->storage_.unsafeGetStorageImpl() == storage_.unsafeGetStorageImpl()) return;
  // A requires_grad_() not yet adopted (torch.zeros(3, requires_grad=True), nn.Parameter(t)):
  // the value must be the leaf before it is replaced, or the leaf stops requiring grad.
  sync_requires_grad_();
  if (input_ && !left_behind_.defined()) {
    // Writes made before the move stay in the input's old memory, which eager's caller still
    // sees through other views of it (Note [Inputs: an input given other data]).
    auto ghost = c10::make_intrusive<FunctionalTensorImpl>(ShallowCopy{}, *this);
    ghost->flat_member_ = flat_member_;
    left_behind_ = at::Tensor(std::move(ghost));
  }
  at::Tensor old = value_;
  storage_ = other->storage_;
  other->copy_fields_to_(*this);
  if (other->has_reference_metadata_) {
    // y reports eager's geometry apart from its value's (without views): x reports y's, not its
    // own old one (a channels_last y given to a contiguous x).
    const bool allowed = allow_tensor_metadata_change();
    set_allow_tensor_metadata_change(true);
    set_sizes_and_strides(other->sym_sizes(), other->sym_strides(), other->sym_storage_offset());
    set_allow_tensor_metadata_change(allowed);
  }
  data_replaced_ = true;
  InnerCallGuard guard;
  at::Tensor value = other->value_;
  if (old.requires_grad() && old.grad_fn() == nullptr &&
      (value.scalar_type() != old.scalar_type() || value.device() != old.device() ||
       value.sym_sizes() != old.sym_sizes())) {
    // Eager resets the leaf's grad accumulator for data of another type: the new data is the
    // leaf (w.data = w.data.double()). Of another shape too: eager makes a leaf's accumulator at
    // its first use, so nn.LazyLinear's materialize (weight.data = torch.empty(shape) on a
    // parameter no op has read) trains, where our leaf's accumulator, made when the wrapper
    // mirrored it, would expect the old shape ("invalid gradient ... expected shape [0]").
    // Without views, detach is detach_copy (Note [View: detach without views]).
    if (views_kept_()) {
      value = value.detach();
    } else {
      c10::AutoGradMode no_grad(false);
      value = at::detach_copy(value);
    }
    value.set_requires_grad(true);
    note_leaf_made_inside(value);
    set_value_(value);
    return;
  }
  set_value_(with_history_of_hidden_write(value, old, {&other->value_}, views_kept_()));
  // A chain taken over from y (resize_'s restride of y, a view of y's base) replays under
  // no_grad with x's edge given back, as a detached view's does: x's identity is its own, also
  // after a write through x makes the replay run (an optimizer's step).
  if (old.requires_grad() && !chain_.empty()) replays_with_grad_ = false;
}

}  // namespace tfz::detail
