// The row for torch.autograd.forward_ad's unpack_dual: a composite that reads the tangent off the
// tensor it is given, so the wrapper is synced first.
// See Note [Kernel: unpack_dual reads a synced wrapper].
#include "kernels/special/Rows.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"

namespace tfz::detail {

// Note [Kernel: unpack_dual reads a synced wrapper]
// _unpack_dual is CompositeImplicitAutograd: _fw_primal(dual) and dual._fw_grad(level), the second
// read off the tensor's AutogradMeta without any op, so our kernel never sees it. A wrapper's
// AutogradMeta mirrors its value's tangent (Note [Wrapper: forward-mode tangents mirrored]), but
// only as of its last sync: after a write through a view of it (buf[0:2].add_(dual)), the base's
// new value, with the written tangent, is made at its next sync, and unpack_dual(buf) read the
// old one (None), silently. So the row syncs the dual's wrapper and then runs the composite on
// it, as eager does. Rejected: syncing inside the mirrored fw_grad read (a wrapper whose value had
// no tangent has no AutogradMeta to read through, so the read would still miss the write).
bool is_unpack_dual(const c10::OperatorHandle& op) {
  return op.schema().name() == "aten::_unpack_dual";
}

void unpack_dual_kernel(const OpInfo& /*info*/, const c10::OperatorHandle& op, Stack* stack,
                        const Layer& /*layer*/) {
  const size_t num_args = op.schema().arguments().size();
  const c10::IValue& dual = (*stack)[stack->size() - num_args];
  if (dual.isTensor()) {
    if (auto* impl = maybe_get_impl(dual.toTensor())) impl->sync_();
  }
  op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
}

}  // namespace tfz::detail
