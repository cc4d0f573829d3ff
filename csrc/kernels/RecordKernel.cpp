// The capture's record kernel: a boxed fallback at kRecordKey that shows each op called on plain
// tensors to the thread's Recorder and runs it. Registered on the first capture.
// See Note [Capture: how ops are recorded] and Note [Capture: the record key].
#include "kernels/Registration.h"

#include "core/DispatchKey.h"
#include "core/Recorder.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace tfz::detail {

namespace {

// Note [Capture: autocast inside the function]
// Autocast casts at its own key, which applies to the inner (CPU, CUDA) tensors our kernels call
// ops on, below the record key: a capture of f with torch.autocast inside recorded each op with
// its arguments before the casts (an addmm in float32 where eager's ran in bfloat16) and the
// casts autocast cached as constants, silently wrong on other inputs. The record kernel refuses
// any op while autocast is enabled, and capture() records such programs through make_fx, whose
// tracer sits below autocast (Note [Capture: control flow]). Rejected: recording below autocast
// (the record key's place above the functorch keys is what lets torch.func transforms inside f
// be recorded, Note [Capture: the record key]).
void record_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                   torch::jit::Stack* stack) {
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRecordKey);
  Recorder* recorder = active_recorder();
  // A composite decomposes into ops we record, as a tracer below autograd would see it, except
  // those whose decomposition computes on raw memory on plain tensors: no op of theirs would
  // reach us, so they are recorded whole (Note [Kernel: composites intercepted whole]).
  if (recorder == nullptr ||
      (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
       !is_composite_taken_whole(op))) {
    return op.redispatchBoxed(below, stack);
  }
  // lift_fresh hands torch.tensor's fresh constant over as a view of itself; the graph records
  // lift_fresh_copy, as make_fx does, so no graph value aliases a constant and views-removed
  // graphs hold no view.
  static const c10::OperatorName lift_fresh("aten::lift_fresh", "");
  static const auto lift_fresh_copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::lift_fresh_copy", "");
  // See Note [Capture: autocast inside the function].
  TORCH_CHECK_NOT_IMPLEMENTED(!at::autocast::is_autocast_enabled(c10::DeviceType::CPU) &&
                                  !at::autocast::is_autocast_enabled(c10::DeviceType::CUDA),
                              "capture: autocast is enabled inside the function (",
                              op.operator_name(),
                              "); its casts happen below the key capture records at.");
  GraphNode node = recorder->begin(op.operator_name() == lift_fresh ? lift_fresh_copy : op, *stack);
  {
    c10::impl::ExcludeDispatchKeyGuard implementation_not_recorded(kRecordKey);
    op.redispatchBoxed(below, stack);
  }
  recorder->finish(std::move(node), *stack);
}

}  // namespace

void ensure_record_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& d = c10::Dispatcher::singleton();
    TORCH_CHECK(!d.hasBackendFallbackForDispatchKey(kRecordKey), "capture: dispatch key ",
                kRecordKey,
                " already has a fallback from another library; capture borrows it (see Note "
                "[Capture: the record key] in csrc/core/DispatchKey.h). Use "
                "make_fx(functionalize(f)) instead.");
    // Kept for the life of the process, like every registration of ours
    // (Note [Kernel: registration]).
    new c10::RegistrationHandleRAII(
        d.registerFallback(kRecordKey, c10::KernelFunction::makeFromBoxedFunction<&record_kernel>(),
                           "torch_functionalize capture"));
  });
}

}  // namespace tfz::detail
