// The tfz::_guard_layout nodes a make_fx graph holds for inputs it reads through their storage
// (their strides, offset, storage size and shared storage), recorded under a Python tracer, whose
// graphs check nothing about their inputs otherwise. See
// Note [Inputs: storage coordinates under a tracer].
#pragma once

#include "core/AliasStorage.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <string>

namespace tfz::detail {

/// Records a tfz::_guard_layout call on the caller's input `index` (`input`): a replay on an input
/// of other strides, offset or storage size (or, with `shares_with`, one that does not share that
/// tensor's storage) raises naming it.
void record_layout_guard(const at::Tensor& input, size_t index,
                         const std::optional<at::Tensor>& shares_with = std::nullopt);

/// The same for any tensor of the graph whose layout a value depends on, named by `what`.
void record_layout_guard(const at::Tensor& t, const std::string& what,
                         const std::optional<at::Tensor>& shares_with = std::nullopt);

/// Guards the traced input `storage` wraps, the first time its storage coordinates are used
/// (as_strided, resize_, a metadata change the epilogue replays); nothing for other storages.
void guard_traced_input(const AliasStorage& storage);

}  // namespace tfz::detail
