// The in-place and out= overloads of a functional ATen op (`add.Tensor` -> `add_.Tensor`,
// `mm` -> `mm.out`), found by torchgen's naming and checked against the op's schema, and whether
// an op is a view. Used by the C++ graph passes (core/GraphReinplace.h, core/GraphEdit.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace tfz::detail {

/// A view op: nothing is written, and its one return aliases an argument.
bool is_view_op(const c10::OperatorHandle& op);

/// The in-place twin of a functional op: `name_` with the same overload, whose first argument is
/// written and whose other arguments have the same names and types. For an op returning one
/// Tensor the twin returns its written self; for a `_foreach_*` op returning a Tensor[] (one
/// result per element of its first argument) the twin returns nothing.
std::optional<c10::OperatorHandle> in_place_twin(const c10::OperatorHandle& op);

/// The out= overload of a functional op with one tensor result: the op's arguments, then one
/// keyword-only written `out`. Looked up under torchgen's names ("out", "<overload>_out",
/// "IntList_out" for "dim_IntList"); an op whose out= form is named otherwise has none here.
std::optional<c10::OperatorHandle> out_variant(const c10::OperatorHandle& op);

}  // namespace tfz::detail
