// The capture's record kernel: a boxed fallback at kRecordKey that shows each op called on plain
// tensors to the thread's Recorder and runs it. Registered on the first capture.
// See Note [Capture: how ops are recorded] and Note [Capture: the record key].
#include "kernels/Registration.h"

#include "core/DispatchKey.h"
#include "core/Recorder.h"

#include <ATen/SavedTensorHooks.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>

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
// Note [Capture: composites taken whole under autograd]
// An op recorded whole (Note [Kernel: composites intercepted whole]) runs its decomposition below
// the record key with autograd on, so the backward nodes it makes save tensors made inside it
// (ctc_loss's log_alpha and negative log likelihood, max_pool1d's indices, an RNN's gates) that
// no recorded op produced: a backward inside f read them as graph constants, and the captured
// graph gave the traced inputs' gradients on every other input, silently. Rule: the record kernel
// notes the sequence numbers of the autograd nodes made during such an op, and an op recorded
// while one of those nodes runs (its backward) is refused with the message that makes capture
// record the program through make_fx(functionalize(f)) instead (Note [Capture: control flow]),
// which traces the decomposition op by op. A forward alone, or one without grad, stays one node.
// Rejected: refusing the whole op whenever an argument requires grad (a forward-only capture of
// a packed RNN, whose packing make_fx cannot trace, would then fail), and mapping the hidden
// tensors to recorded values (the recorder never sees the ops that made them).
// Note [Capture: saved-tensor hooks inside the function]
// torch.autograd.graph.saved_tensors_hooks (save_on_cpu, allow_mutation_on_saved_tensors, a
// user's own pair) run their pack hook while autograd saves a tensor, inside the op being
// recorded, so the ops a pack hook runs are not recorded (the record key is excluded there): a
// pack that makes a new tensor (t * 1, a copy) left the graph's backward reading it as a
// constant, silently wrong on other inputs. So the record kernel refuses any op recorded with
// grad mode on while such hooks are pushed, and capture() records the program through make_fx,
// which sees the pack hook's ops (they reach it below autograd). Rejected: recording the ops
// pack hooks run (autograd calls them from inside the recorded op's kernel, where everything
// else it runs is the op's own implementation, which capture records as one node).
void check_no_saved_tensor_hooks(const c10::OperatorHandle& op) {
  if (C10_LIKELY(at::SavedTensorDefaultHooks::get_tls_state().stack.empty()) ||
      !c10::GradMode::is_enabled()) {
    return;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "capture: saved-tensor hooks are active inside the function (",
                              op.operator_name(),
                              "); the ops their pack hooks run happen inside recorded ops.");
}

void check_not_backward_of_whole_op(const Recorder& recorder, const c10::OperatorHandle& op) {
  if (C10_LIKELY(!recorder.has_hidden_nodes())) return;  // no node to look up on most captures
  const auto node = torch::autograd::get_current_node();
  if (node == nullptr || !recorder.is_hidden_node(node->sequence_nr())) return;
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "functionalize: ", node->name(), " (", op.operator_name(),
      ") is the backward of an op taken whole under capture with an argument that requires "
      "grad: it reads tensors made inside that op's decomposition, which capture does not "
      "record. Use make_fx(functionalize(f)), which records the decomposition.");
}

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
  check_not_backward_of_whole_op(*recorder, op);
  check_no_saved_tensor_hooks(op);
  GraphNode node = recorder->begin(op.operator_name() == lift_fresh ? lift_fresh_copy : op, *stack);
  const bool whole = c10::GradMode::is_enabled() && is_composite_taken_whole(op);
  const uint64_t first_node = whole ? at::sequence_number::peek() : 0;
  {
    c10::impl::ExcludeDispatchKeyGuard implementation_not_recorded(kRecordKey);
    op.redispatchBoxed(below, stack);
  }
  if (whole && at::sequence_number::peek() != first_node) {
    recorder->note_hidden_nodes(first_node, at::sequence_number::peek());
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
