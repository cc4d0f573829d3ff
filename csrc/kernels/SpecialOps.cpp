// The table of special operators: every operator whose schema does not tell the whole story, as
// one row (matcher, plan adjustment, handler); the rows live in kernels/special/, one file per row
// family, each with its Note saying what eager does and why the generic path is not enough.
// Nothing else in the engine names an operator. See Note [Kernel: special ops].
#include "kernels/SpecialOps.h"

#include "kernels/special/Rows.h"

#include <array>

namespace tfz::detail {

// Note [Kernel: special ops]
// The generic kernel does what an operator's schema says (OpKind, core/OpSchemaInfo.cpp). A few
// operators need more: their schema hides a write (native_batch_norm), changes storage (resize_,
// set_), says "fresh tensor" for an alias (_unsafe_view), or their eager kernel bypasses the
// dispatcher on our wrappers (composite ops with raw fast paths). Each is a row of kSpecialOps
// below:
//   matches   which operators the row takes (by name, or by a schema property);
//   adjust    how the row changes the op's plan, once, at classification (optional);
//   handle    what runs instead of the generic handler when a wrapper is among the arguments
//             (optional; calls with plain arguments always pass through);
//   intercepts_composite   register our kernel although the op is CompositeImplicitAutograd.
// The first matching row wins. Adding a special operator is adding a row and its Note.
// Rejected: special OpKinds (BatchNorm, Resize, ...) mixed into the schema's classification, with
// their handling spread over the classifier, the dispatch switch and registration: finding "the
// rule for native_batch_norm" takes four files.
// Not rows, because their schemas tell the whole story: `detach`/`alias` are views whose inverse
// is the identity (core/ViewInverses.cpp); in-place random ops (`normal_`, `random_`,
// `bernoulli_`, ...) are ordinary mutations whose functional companions (`normal_functional`,
// `random`, `bernoulli.p`, ...) draw from the same generator in the same order, so eager's
// numbers come out under one seed.
// copy_ is a row only for eager's early exit (Note [Kernel: copy_ onto itself], which says where
// its other details live); every other copy_ is the ordinary mutation whose companion is `copy`.
namespace {

constexpr std::array<SpecialOp, 17> kSpecialOps{{
    // name                      matches               adjust                handle composite
    {"set_", &is_set, &refuse_set, &set_kernel, false},
    {"cuDNN's dropout state (ATen's cache)", &is_cudnn_dropout_state, &leave_plain, nullptr, false},
    {"batch norm (hidden stat writes)", &is_batch_norm_with_hidden_stats, &plan_batch_norm,
     &batch_norm_kernel, false},
    {"resize_", &is_resize, nullptr, &resize_kernel, false},
    {"copy_ onto itself", &is_copy_, nullptr, &copy_kernel, false},
    {"lift_fresh", &is_lift, &wrap_lifted, nullptr, false},
    {"_unsafe_view", &is_unsafe_view, &plan_unsafe_view, nullptr, false},
    {"_reshape_alias", &is_reshape_alias, &plan_reshape_alias, nullptr, false},
    {"unsafe_split", &is_unsafe_split, &plan_unsafe_split, &unsafe_split_kernel, false},
    {"composite with raw fast path", &has_raw_fast_path, nullptr, &composite_kernel, true},
    {"tensor_split by a tensor", &is_tensor_split_by_tensor, nullptr, &tensor_split_kernel, true},
    {"forward-mode unpack_dual", &is_unpack_dual, nullptr, &unpack_dual_kernel, true},
    {"memory-efficient attention (bias rows)", &is_efficient_attention, nullptr,
     &efficient_attention_kernel, false},
    {"in-place _foreach_", &is_inplace_foreach, nullptr, &foreach_kernel, false},
    {"c10d collective", &is_c10d_collective, nullptr, &collective_kernel, false},
    {"custom mutable op", &is_custom_mutable, &plan_custom_mutable, nullptr, false},
    {"custom view op", &is_custom_view, &refuse_custom_view, nullptr, false},
}};

}  // namespace

bool is_composite_taken_whole(const c10::OperatorHandle& op) {
  return has_raw_fast_path(op);
}

const SpecialOp* find_special_op(const c10::OperatorHandle& op) {
  for (const auto& row : kSpecialOps) {
    if (row.matches(op)) return &row;
  }
  return nullptr;
}

KernelPlan plan_for_kernel(const c10::OperatorHandle& op) {
  KernelPlan plan{classify(op), find_special_op(op)};
  if (plan.special != nullptr && plan.special->adjust != nullptr)
    plan.special->adjust(op, plan.info);
  return plan;
}

bool is_intercepted(const c10::OperatorHandle& op) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return true;
  const auto* row = find_special_op(op);
  return row != nullptr && row->intercepts_composite;
}

}  // namespace tfz::detail
