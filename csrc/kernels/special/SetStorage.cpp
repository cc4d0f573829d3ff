// The set_ row: x.set_(source) shares another tensor's storage: served onto another tensor of
// the function (as `x.data = source`), and for a tensor made inside f set_ onto a wrapper's
// storage or onto a storage from outside f (cuDNN's flat-weights check); refused otherwise.
// See Note [Kernel: set_].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
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

// Note [Kernel: set_]
// x.set_(source) makes x share source's storage (or a given storage): after it, writes through
// either are seen by the other, and x's old aliases stop seeing x. torchgen gives it a functional
// variant (aten::set.source_Tensor, ...), so the generic plan would replace x's value with a copy
// and keep x in its old alias storage: silently wrong aliasing. Refused with a clear error until
// alias storages can be merged, except for the case below.
// Rejected: leaving set_ to the generic plan and that functional variant: values would read
// right until the first write through x or source, which the other would not see and x's old
// aliases still would.
//
// Note [Kernel: set_ onto a storage from outside the function]
// cuDNN's RNN (LSTM, GRU and RNN modules on CUDA) checks whether the weights already lie in one
// flat buffer by making `at::empty({0}, ...).set_(weights[0].storage())` and comparing addresses.
// Inside f that empty is a wrapper of ours, so every CUDA RNN would be refused at this set_. A set_
// of a wrapper made inside f, with no other alias and not an input, onto a storage no wrapper owns
// (a parameter's, captured by the module) is eager's aliasing of memory that the function does not
// own: the wrapper moves to a new alias storage whose base is an inner tensor set_ onto that
// storage, marked captured, so reads see that memory as eager's do and a write through it is
// eager's write, run eagerly (Note [Kernel: writes into captured tensors]). The wrapper's data
// pointer is not the parameter's, so cuDNN's check finds no flat buffer and copies the weights
// into one of its own, with the same numbers. Under a tracer it stays refused: a Storage is no
// value a graph can hold. On the CPU it stays refused too: there the same two calls are how
// torch.ByteTensor(storage) wraps a Python buffer, which all_gather_object then sends through
// collectives whose results ours cannot turn back into bytes (the error case of
// test_distributed.py), and no CPU kernel of torch makes them. Rejected: a wrapper of a copy of
// that memory (reads would miss the parameter's later writes, and writes would not reach it).
bool is_set(const c10::OperatorHandle& op) {
  return op.operator_name().name == "aten::set_";
}

namespace {

constexpr const char* kSetRefusal =
    "set_ swaps the storage of a tensor, which functionalize does not support yet. Use the source "
    "tensor directly, or copy_ into the destination";

}  // namespace

void refuse_set(const c10::OperatorHandle& op, OpInfo& info) {
  const auto& overload = op.operator_name().overload_name;
  if (overload == "source_Storage" || overload == "source_Storage_storage_offset" ||
      overload == "source_Tensor") {
    return;
  }
  unsupported(info, kSetRefusal);
}

namespace {
// Note [Kernel: set_ onto another functional tensor]
// x.set_(y) of two tensors of the function makes x show y's storage, geometry and values, and
// keeps x's autograd identity: exactly what `x.data = y` does, which the wrapper already serves
// (shallow_copy_from: x joins y's alias storage, so later writes through either reach the other,
// and x's old views keep its old storage, as eager's do). torch.nn.utils.parametrize relies on
// it: register_parametrization calls original.set_(right_inverse(original)) (original.set_(
// original) without a right inverse), and remove_parametrizations sets the original to the
// parametrized value. An input x is served too: the epilogue gives the caller's x the final value
// as eager's set_ leaves it (Note [Inputs: an input given other data]); a view of an input is a
// tensor of the function, whose set_ leaves the input as it was. Under a tracer or capture an
// input's set_ is refused: a graph cannot give its input another tensor's memory, and the caller's
// x would keep a storage of its own size (which the `x.data =` path accepts, see the Note above).
// Eager's rules first: the same dtype, and a leaf that requires grad only with grad mode off.
// Refused: a tensor resized or restrided before (its wrapper's metadata ops are replayed on the
// caller's tensor), an input set_ onto another geometry in its own memory (the caller's tensor
// would take it in its storage, which no epilogue replays), and grad mode on with a tensor that
// requires grad (set_'s derivative is not served). Rejected: the generic plan with aten::set's
// functional variant, see Note [Kernel: set_].
bool set_onto_functional_tensor(const OpInfo& info, Stack* stack, const Layer& layer) {
  const at::Tensor self = (stack->end() - 2)->toTensor();
  const at::Tensor source = (stack->end() - 1)->toTensor();
  auto* impl = maybe_get_impl(self);
  auto* from = maybe_get_impl(source);
  if (impl == nullptr || from == nullptr || impl->layer_id() != from->layer_id()) return false;
  if (impl->has_metadata_mutation() || impl->moves_within_its_memory(*from)) return false;
  // A graph cannot give its input the memory of another tensor: under a tracer the caller's x
  // would keep its own storage, of another size than eager's.
  if (impl->is_input() && (layer.entered_under_modes || ops_are_recorded())) return false;
  TORCH_CHECK(self.dtype() == source.dtype(), "Could not set tensor of type ", source.dtype(),
              " to a tensor of type ", self.dtype());
  const bool grad = c10::GradMode::is_enabled();
  TORCH_CHECK(!(grad && self.requires_grad() && self.is_leaf()),
              "a leaf Variable that requires grad is being used in an in-place operation.");
  TORCH_CHECK_NOT_IMPLEMENTED(!(grad && (self.requires_grad() || source.requires_grad())),
                              "functionalize: ", info.name, ": ", kSetRefusal,
                              " (supported with grad mode off, or for tensors that do not "
                              "require grad: set_'s derivative is not served).");
  if (self.unsafeGetTensorImpl() != source.unsafeGetTensorImpl()) {
    impl->shallow_copy_from(source.getIntrusivePtr());
  }
  impl->bump_version();  // eager's set_ counts as a write, also onto itself
  torch::jit::drop(*stack, 2);
  torch::jit::push(*stack, self);
  return true;
}
}  // namespace

namespace {
// A tensor made inside f with no other alias (no view of it alive, not an input, its storage of
// its own making): what both set_ onto a storage may replace.
bool alone_in_its_storage(const FunctionalTensorImpl* impl) {
  return impl != nullptr && impl->storage().use_count() == 1 &&
         !impl->alias_storage().has_caller_storage() && !impl->alias_storage().flat() &&
         !impl->alias_storage().bytes();
}

// Note [Kernel: set_ onto a functional tensor's storage]
// The same cuDNN check (Note [Kernel: set_ onto a storage from outside the function]) with the
// weights passed into f (torch.func.functional_call of an LSTM or GRU on CUDA): the storage is a
// wrapper's, an alias storage of ours. set_ is then eager's aliasing of memory the function owns,
// which a view serves: the tensor joins that alias storage as as_strided(sizes, strides, offset)
// of its base (the whole storage as a flat 1-d tensor for set_(storage)), so reads see the
// storage's current elements and a write through either side reaches the other, as eager's
// do. A wrapper's data pointer is null, so cuDNN's address comparison finds no flat buffer and
// copies the weights into one of its own, with the same numbers. Served on every device and under
// tracers (the view is an as_strided of the base in the graph); refused with another dtype than
// the base's (eager reads the bytes as that dtype, which no view of the base does).
// Rejected: a copy of the storage's elements marked captured, as for a storage from outside:
// correct for cuDNN's check, which only reads it once, but a read after a write through the
// weights would have seen the old numbers, silently.
bool set_onto_functional_storage(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                                 const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  if (num_args < 2 || !(first + 1)->isStorage()) return false;
  const c10::Storage storage = (first + 1)->toStorage();
  auto* source = dynamic_cast<AliasStorage*>(storage.unsafeGetStorageImpl());
  if (source == nullptr) return false;
  const at::Tensor self = first->toTensor();
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK_NOT_IMPLEMENTED(
      alone_in_its_storage(impl) && !impl->has_metadata_mutation(), "functionalize: ", info.name,
      ": ", kSetRefusal,
      " (supported onto the storage of a tensor of the function: a tensor made inside the "
      "function, with no view of it alive).");
  source->apply_updates();
  const at::Tensor base = source->base();
  TORCH_CHECK_NOT_IMPLEMENTED(
      self.dtype() == base.dtype(), "functionalize: ", info.name, ": ", kSetRefusal,
      " (supported onto the storage of a tensor of the function with the same dtype; got ",
      self.dtype(), " onto a storage of ", base.dtype(), ").");
  TORCH_CHECK(!(c10::GradMode::is_enabled() && self.requires_grad() && self.is_leaf()),
              "a leaf Variable that requires grad is being used in an in-place operation.");
  c10::SymInt offset = 0;
  std::vector<c10::SymInt> sizes{c10::SymInt(storage.sym_nbytes() / base.dtype().itemsize())};
  std::vector<c10::SymInt> strides{1};
  if (num_args == 5) {  // source_Storage_storage_offset: (self, source, offset, size, stride)
    offset = (first + 2)->toSymInt();
    sizes = (first + 3)->toSymIntVector();
    strides = (first + 4)->toSymIntVector();
  }
  // detach first: eager's tensor shares the memory, not the autograd history, so a write
  // through it leaves the source's grad_fn and version as they were (as a write through .data).
  static const c10::OperatorName detach{"aten::detach", ""};
  std::vector<std::shared_ptr<const ViewMeta>> steps{
      ViewMeta::of(detach, {}, layer.reapply_views),
      ViewMeta::as_strided(sizes, strides, offset, layer.reapply_views)};
  at::Tensor view_value;
  {
    InnerCallGuard guard;
    view_value = steps[1]->forward(steps[0]->forward(base));
  }
  auto view = c10::make_intrusive<FunctionalTensorImpl>(
      FunctionalTensorImpl::OfStorage{}, view_value, storage, impl->layer_id(), std::move(steps));
  impl->shallow_copy_from(view);
  impl->bump_version();  // eager's set_ counts as a write
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  torch::jit::push(*stack, self);
  return true;
}
}  // namespace

void set_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  if (num_args == 2 && (stack->end() - 1)->isTensor()) {
    TORCH_CHECK_NOT_IMPLEMENTED(set_onto_functional_tensor(info, stack, layer),
                                "functionalize: ", info.name, ": ", kSetRefusal,
                                " (supported: set_ onto another tensor of the function, of a "
                                "tensor whose sizes or strides no op changed before, and for an "
                                "input onto a tensor outside its memory or of its own geometry, "
                                "outside tracers and capture).");
    return;
  }
  if (set_onto_functional_storage(info, op, stack, layer)) return;
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  const at::Tensor self = first->toTensor();
  auto* impl = maybe_get_impl(self);
  const bool outside =
      num_args > 1 && (first + 1)->isStorage() &&
      dynamic_cast<const AliasStorage*>((first + 1)->toStorage().unsafeGetStorageImpl()) == nullptr;
  TORCH_CHECK_NOT_IMPLEMENTED(
      outside && self.device().type() != c10::DeviceType::CPU && !ops_are_recorded() &&
          alone_in_its_storage(impl),
      "functionalize: ", info.name, ": ", kSetRefusal,
      " (supported: a tensor made inside the function, with no view of it alive, set_ onto the "
      "storage of a tensor from outside the function, outside tracers, on devices other than the "
      "CPU).");
  at::Tensor value;
  {
    InnerCallGuard guard;
    Stack inner(first, stack->end());
    inner[0] = at::empty({0}, impl->value().options());
    op.callBoxed(inner);
    value = inner[0].toTensor();
  }
  impl->replace_storage_(value);
  impl->alias_storage().mark_captured();
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, self);
}

}  // namespace tfz::detail
