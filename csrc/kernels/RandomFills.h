// Seeded random fills (x.normal_(), x.bernoulli_(p), dropout's mask) of a tensor that is not
// contiguous: the two ways the mutation kernel draws eager's numbers for them, in place when
// nothing records and through a functional layout measured against eager's kernel in graphs.
// See Note [Kernel: random fills of strided tensors].
#pragma once

#include "core/OpSchemaInfo.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

namespace tfz::detail {

/// Whether a schema argument is a Generator (optional or not).
bool is_generator_arg(const c10::Argument& arg);

/// Untraced: the op run as called on a private tensor of the written tensor's geometry, which
/// becomes the new value; nullopt where that does not apply. `inner` holds the unwrapped arguments
/// (its written entry is replaced by that tensor).
std::optional<at::Tensor> random_fill_in_eager_order(const OpInfo& info,
                                                     const c10::OperatorHandle& op,
                                                     const std::vector<c10::IValue>& args,
                                                     std::vector<c10::IValue>& inner);

/// Traced (or otherwise recorded): the functional variant called on the layout whose numbers
/// were measured equal to eager's in-place fill of the written geometry, its result in the
/// written tensor's sizes; nullopt where no layout matched or none could be measured (the
/// caller's plain functional call stays).
std::optional<at::Tensor> random_fill_in_memory_order(const OpInfo& info,
                                                      const c10::OperatorHandle& op,
                                                      const std::vector<c10::IValue>& args,
                                                      const std::vector<c10::IValue>& inner,
                                                      bool reapply_views);

}  // namespace tfz::detail
