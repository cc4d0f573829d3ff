// The rows of the special-operator table (kernels/SpecialOps.cpp): each row's matcher, plan
// adjustment and handler, defined in this folder, one file per row family, plus the small schema
// predicates the rows share. Only SpecialOps.cpp and the row files include this.
// See Note [Kernel: special ops].
#pragma once

#include "kernels/SpecialOps.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace tfz::detail {

using Stack = torch::jit::Stack;

inline bool named(const c10::OperatorHandle& op, std::string_view name, std::string_view overload) {
  const auto& n = op.operator_name();
  return n.name == name && n.overload_name == overload;
}

inline bool is_aten(const c10::OperatorHandle& op) {
  return op.operator_name().name.rfind("aten::", 0) == 0;
}

inline bool returns_an_alias(const c10::OperatorHandle& op) {
  const auto& rets = op.schema().returns();
  return std::any_of(rets.begin(), rets.end(),
                     [](const c10::Argument& r) { return r.alias_info() != nullptr; });
}

/// Marks the plan Unsupported with `reason` (the kernel raises it, naming the op).
inline void unsupported(OpInfo& info, std::string reason) {
  info.kind = OpKind::Unsupported;
  info.unsupported_reason = std::move(reason);
}

// SetStorage.cpp
bool is_set(const c10::OperatorHandle& op);
void refuse_set(const c10::OperatorHandle& op, OpInfo& info);
void set_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                const Layer& layer);

// BatchNorm.cpp
bool is_batch_norm_with_hidden_stats(const c10::OperatorHandle& op);
void plan_batch_norm(const c10::OperatorHandle& op, OpInfo& info);
void batch_norm_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                       const Layer& layer);

// Resize.cpp (resize_functional, shared with out= writes, is in Handlers.h)
bool is_resize(const c10::OperatorHandle& op);
void resize_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                   const Layer& layer);

// Lift.cpp
bool is_lift(const c10::OperatorHandle& op);
void wrap_lifted(const c10::OperatorHandle& op, OpInfo& info);
bool is_cudnn_dropout_state(const c10::OperatorHandle& op);
void leave_plain(const c10::OperatorHandle& op, OpInfo& info);

// AliasingViews.cpp
bool is_unsafe_view(const c10::OperatorHandle& op);
void plan_unsafe_view(const c10::OperatorHandle& op, OpInfo& info);
bool is_reshape_alias(const c10::OperatorHandle& op);
void plan_reshape_alias(const c10::OperatorHandle& op, OpInfo& info);
bool is_unsafe_split(const c10::OperatorHandle& op);
void plan_unsafe_split(const c10::OperatorHandle& op, OpInfo& info);
void unsafe_split_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                         const Layer& layer);

// Composites.cpp
bool has_raw_fast_path(const c10::OperatorHandle& op);
void composite_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                      const Layer& layer);
bool is_tensor_split_by_tensor(const c10::OperatorHandle& op);
void tensor_split_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                         const Layer& layer);

// Attention.cpp
bool is_efficient_attention(const c10::OperatorHandle& op);
void efficient_attention_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                                const Layer& layer);

// Foreach.cpp
bool is_inplace_foreach(const c10::OperatorHandle& op);
void foreach_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                    const Layer& layer);

// Copy.cpp
bool is_copy_(const c10::OperatorHandle& op);
void copy_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                 const Layer& layer);

// ForwardAD.cpp
bool is_unpack_dual(const c10::OperatorHandle& op);
void unpack_dual_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                        const Layer& layer);

// CustomOps.cpp (functional_companion, in AutoFunctional.cpp, is in SpecialOps.h)
bool is_custom_mutable(const c10::OperatorHandle& op);
void plan_custom_mutable(const c10::OperatorHandle& op, OpInfo& info);
bool is_custom_view(const c10::OperatorHandle& op);
void refuse_custom_view(const c10::OperatorHandle& op, OpInfo& info);

}  // namespace tfz::detail
