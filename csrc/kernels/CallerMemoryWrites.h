// Writes into an input (indexed writes, writes through its views) done in the caller's memory
// with an undo entry instead of functionally. See Note [Undo: writes into the caller's memory].
#pragma once

#include "core/Layer.h"
#include "core/OpSchemaInfo.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace tfz::detail {

/// Whether an in-place write of `written` would take write_into_caller_memory's path as a write
/// through a view of the caller's tensor (the unboxed kernels hand such writes to the boxed one).
bool writes_through_view_of_caller_memory(const at::Tensor& written, const Layer& layer);

/// Runs the mutable op on the stack in place on the caller's tensor when the Note's conditions
/// hold (the op is popped and its returns pushed); returns false, touching nothing, otherwise.
bool write_into_caller_memory(const OpInfo& info, const c10::OperatorHandle& op,
                              torch::jit::Stack* stack, const Layer& layer);

}  // namespace tfz::detail
