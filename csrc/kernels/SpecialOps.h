// The table of special operators: the ones whose schema does not tell the whole story, each a row
// with its matcher, its plan adjustment and its handler (SpecialOps.cpp, one Note per row), and the
// kernel plan (schema classification + row) that the registered kernels run.
// See Note [Kernel: special ops].
#pragma once

#include "kernels/Handlers.h"

#include <optional>

namespace tfz::detail {

/// One row of the table. `adjust` and `handle` may be null (the schema's plan / generic handler).
struct SpecialOp {
  const char* name;                                             // the row's name, for diagnostics
  bool (*matches)(const c10::OperatorHandle& op);               // which operators the row takes
  void (*adjust)(const c10::OperatorHandle& op, OpInfo& info);  // plan changes at classification
  Handler handle;  // runs calls with wrapper arguments instead of the generic handler
  bool
      intercepts_composite;  // registered although CompositeImplicitAutograd (decomposes otherwise)
};

/// What the kernel runs for an operator: its classification and its row (nullptr: none).
struct KernelPlan {
  OpInfo info;
  const SpecialOp* special = nullptr;
};

/// The row that takes `op`, or nullptr.
const SpecialOp* find_special_op(const c10::OperatorHandle& op);

/// classify(op), then the row's adjustment (slow: cache the result).
KernelPlan plan_for_kernel(const c10::OperatorHandle& op);

/// True if our kernel is registered for `op`: every op that is not CompositeImplicitAutograd
/// (those decompose into ops we see), and the composite ones a row intercepts whole.
bool is_intercepted(const c10::OperatorHandle& op);

/// True for the composite ops taken whole because their decomposition reads raw memory or
/// resizes out= natively (Note [Kernel: composites intercepted whole]).
bool is_composite_taken_whole(const c10::OperatorHandle& op);

/// The functional companion of a custom mutable op, registered on first request (again, under a
/// new name, if the op was redefined with another schema). See Note [Kernel: custom mutable ops].
c10::OperatorHandle functional_companion(const c10::OperatorHandle& op);

/// The row for torch.distributed's c10d ops (every c10d:: op that takes a ProcessGroup) and its
/// handler, in CollectiveKernels.cpp. See Note [Collectives: in-place c10d ops].
bool is_c10d_collective(const c10::OperatorHandle& op);
void collective_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const Layer& layer);
/// The row's call with only plain tensors, inside a layer: passes through, except under a tracer
/// (raises). See Note [Collectives: captured tensors].
void check_plain_collective(const c10::OperatorHandle& op);

}  // namespace tfz::detail
