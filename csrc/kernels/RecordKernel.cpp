// The capture's record kernel: a boxed fallback at kRecordKey that shows each op called on plain
// tensors to the thread's Recorder and runs it. Registered on the first capture.
// See Note [Capture: how ops are recorded] and Note [Capture: the record key].
#include "kernels/Registration.h"

#include "core/DispatchKey.h"
#include "core/FunctorchInterop.h"
#include "core/Recorder.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace tfz::detail {

namespace {

void record_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                   torch::jit::Stack* stack) {
  const auto below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kRecordKey);
  Recorder* recorder = active_recorder();
  // A composite decomposes into ops we record, as a tracer below autograd would see it.
  if (recorder == nullptr ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return op.redispatchBoxed(below, stack);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      !c10::impl::tls_local_dispatch_key_set().included_.has_any(functorch_mode_keys()),
      "capture: ", op.operator_name(),
      ": a torch.func transform is active; capture records ops before transforms rewrite them. "
      "Use make_fx(functionalize(f)) for programs that use torch.func transforms.");
  GraphNode node = recorder->begin(op, *stack);
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
