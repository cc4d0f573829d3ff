// Declarations shared by the kernel files: the boxed entry point registered for every op, the
// per-kind handlers it dispatches to, and registration. Kernels are thin: the state changes they
// make are methods of core/ types.
#pragma once

#include "core/Layer.h"
#include "core/OpSchemaInfo.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string_view>

namespace tfz::detail {

class FunctionalTensorImpl;

/// Entry point at every key we own: pass-through for plain arguments, else by OpInfo::kind.
void run_boxed_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// A wrapper of another layer (or of none) reached op `op_name`'s kernel: throws the error that
/// says why (a torch.func transform inside the function, or an escaped wrapper).
[[noreturn]] void report_foreign_wrapper(const std::string& op_name,
                                         const FunctionalTensorImpl& impl, const Layer* layer);

/// The unboxed kernel of `op`, if it has one and its OpInfo is the plan that kernel implements;
/// otherwise nullopt and the boxed kernel serves it. See Note [Kernel: unboxed fast path].
std::optional<c10::KernelFunction> unboxed_kernel(const c10::OperatorHandle& op);
/// The ops listed for an unboxed kernel, as "name.overload" (for tests and diagnostics).
std::vector<std::string> unboxed_listed_ops();
/// The ops that got one (listed, registered, not CompositeImplicitAutograd, plan matched).
std::vector<std::string> unboxed_registered_ops();

// Handlers. Preconditions: some argument is a wrapper of `layer`.
void functional_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Layer& layer);
void view_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 const Layer& layer);
void inplace_view_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                         torch::jit::Stack* stack, const Layer& layer);
void mutable_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const Layer& layer);

// Pieces of mutable_kernel shared with the unboxed in-place/out= kernels.
/// Eager's rules for writing `value` into `written` (Note [Kernel: eager errors of in-place ops]).
void check_eager_rules(std::string_view op_name, const at::Tensor& written,
                       const at::Tensor& value, bool resizes);
/// `t`, passed as written argument `arg_name`, must be a wrapper without internal overlap.
void check_writable(std::string_view op_name, std::string_view arg_name, const at::Tensor& t);
/// The written wrapper now holds `value`: replace, commit to its alias storage, sync.
void write_back(const at::Tensor& wrapper, const at::Tensor& value);

void native_batch_norm_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                              torch::jit::Stack* stack, const Layer& layer);

/// Un-hides the Python key (but not PythonTLSSnapshot) for a composite op's work on wrappers under
/// a TorchDispatchMode: ATen's dispatch_mode_enabled() then holds, so CIA kernels take their
/// dispatcher-only paths. Every op they call still reaches our key first (it is in the included
/// set and above Python), so nothing reaches the mode except through an inner call. See Note
/// [Kernel: composites intercepted whole].
class PythonUnhiddenGuard {
 public:
  PythonUnhiddenGuard() : guard_(unhidden()) {}

 private:
  static c10::impl::LocalDispatchKeySet unhidden();
  c10::impl::ForceDispatchKeyGuard guard_;
};

/// Runs a composite op intercepted whole as its CompositeImplicitAutograd decomposition on the
/// wrappers (under a TorchDispatchMode; see Note [Kernel: composites intercepted whole]).
void composite_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// True if an in-place _foreach_ op's written elements alias another of its tensor arguments.
bool foreach_lists_alias(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
/// Applies an in-place _foreach_ op one index at a time (single-element lists), in order.
void foreach_sequential_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

void resize_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const Layer& layer);

/// Wraps every tensor among the last `count` stack entries as a fresh base wrapper.
void wrap_outputs(torch::jit::Stack* stack, size_t count, int64_t layer_id);

/// Registers our kernel for every operator known now (idempotent and thread-safe); operators
/// registered later are picked up by the next call. Called on every layer entry.
void ensure_registered();

/// classify(), plus a registered functional companion for custom ops that mutate their arguments
/// (Note [Kernel: custom mutable ops]). What the kernel uses.
OpInfo classify_for_kernel(const c10::OperatorHandle& op);

/// Bumped whenever an operator's schema is deregistered (a torch.library Library destroyed): the
/// name may come back with another schema, so cached classifications are redone. See Note
/// [Kernel: registration].
uint64_t schema_epoch();

/// The functional companion of a custom mutable op, registered on first request (again, under a
/// new name, if the op was redefined with another schema).
std::optional<c10::OperatorHandle> functional_companion(const c10::OperatorHandle& op);

/// Registers pending operators, then classifies the named one (for tests and diagnostics).
/// Throws if no such operator is registered.
OpInfo classify_by_name(const std::string& name, const std::string& overload);

/// Number of operators with our per-op kernel (for tests and diagnostics).
size_t registered_op_count();

}  // namespace tfz::detail
