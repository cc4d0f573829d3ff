// The set_ row: x.set_(source) shares another tensor's storage. Refused, except a tensor made
// inside f set_ onto a storage from outside it (cuDNN's flat-weights check).
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
// refused by name (Note [Kernel: views of captured tensors]). The wrapper's data pointer is not the
// parameter's, so cuDNN's check finds no flat buffer and copies the weights into one of its own,
// with the same numbers. Under a tracer it stays refused: a Storage is no value a graph can hold.
// On the CPU it stays refused too: there the same two calls are how torch.ByteTensor(storage) wraps
// a Python buffer, which all_gather_object then sends through collectives whose results ours cannot
// turn back into bytes (the error case of test_distributed.py), and no CPU kernel of torch makes
// them.
// Rejected: letting writes through that storage reach the memory, as eager's would: it belongs to
// a tensor the function captured, so the write would be a side effect that no graph input or
// output carries (the reason Note [Kernel: views of captured tensors] refuses such writes).
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
  if (overload == "source_Storage" || overload == "source_Storage_storage_offset") return;
  unsupported(info, kSetRefusal);
}

void set_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                const Layer& /*layer*/) {
  const size_t num_args = op.schema().arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  const at::Tensor self = first->toTensor();
  auto* impl = maybe_get_impl(self);
  const bool outside =
      num_args > 1 && (first + 1)->isStorage() &&
      dynamic_cast<const AliasStorage*>((first + 1)->toStorage().unsafeGetStorageImpl()) == nullptr;
  TORCH_CHECK_NOT_IMPLEMENTED(
      impl != nullptr && outside && self.device().type() != c10::DeviceType::CPU &&
          !ops_are_recorded() && impl->storage().use_count() == 1 &&
          !impl->alias_storage().has_caller_storage() && !impl->alias_storage().flat() &&
          !impl->alias_storage().bytes(),
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
