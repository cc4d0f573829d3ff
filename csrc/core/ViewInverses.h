// Inverses of the non-composite ATen view ops: given the base before a mutation and the mutated
// view, return the new base. One function per view op, looked up by operator name.
#pragma once

#include "core/ViewMeta.h"

#include <ATen/core/operator_name.h>

#include <vector>

namespace tfz::detail {

/// The inverse for a view op ("aten::slice" overload "Tensor"), or nullptr if it has none.
InverseFn find_inverse(const c10::OperatorName& view_op);

/// True for steps that only regroup elements in row-major order (view, _reshape_alias, squeeze):
/// a run of them is inverted by one regrouping into the shape before the run.
/// See Note [Alias: runs of regrouping views].
bool is_regrouping(const ViewMeta& step);

/// Every view op with an inverse (the table's rows; tests check each against eager).
std::vector<c10::OperatorName> view_ops_with_inverse();

/// as_strided_scatter with eager's gradient. See Note [Alias: as_strided_scatter's gradient].
at::Tensor strided_scatter(const at::Tensor& base, const at::Tensor& src, c10::SymIntArrayRef sizes,
                           c10::SymIntArrayRef strides, std::optional<c10::SymInt> offset);

}  // namespace tfz::detail
