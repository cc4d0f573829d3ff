// What the rest of the library needs from the kernels: registering them (once, then for operators
// defined later), the boxed entry point they install, and diagnostics (which ops got which
// kernel, how an op is planned). See Note [Kernel: registration].
#pragma once

#include "kernels/SpecialOps.h"

#include <optional>
#include <string>
#include <vector>

namespace tfz::detail {

/// Registers our kernel for every operator known now (idempotent and thread-safe); operators
/// registered later are picked up by the next call. Called on every layer entry.
void ensure_registered();

/// Entry point at every key we own (`ks`: the keys the op reached us with): autograd's kernel
/// while a torch.func transform processes the op, the foreign-wrapper check, pass-through when
/// every argument is plain, else the special row's handler or the generic one of the op's kind
/// (BoxedKernel.cpp).
void run_boxed_kernel(const KernelPlan& plan, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                      torch::jit::Stack* stack);

/// Bumped whenever an operator's schema is deregistered (a torch.library Library destroyed): the
/// name may come back with another schema, so cached plans are redone. See
/// Note [Kernel: registration].
uint64_t schema_epoch();

/// The unboxed kernel of `op`, if it has one and its plan is the one that kernel implements;
/// otherwise nullopt and the boxed kernel serves it. See Note [Kernel: unboxed fast path].
std::optional<c10::KernelFunction> unboxed_kernel(const c10::OperatorHandle& op);
/// The ops listed for an unboxed kernel, as "name.overload" (for tests and diagnostics).
std::vector<std::string> unboxed_listed_ops();
/// The ops that got one (listed, registered, not CompositeImplicitAutograd, plan matched).
std::vector<std::string> unboxed_registered_ops();

/// Registers pending operators, then plans the named one (for tests and diagnostics).
/// Throws if no such operator is registered.
KernelPlan plan_by_name(const std::string& name, const std::string& overload);

/// Registers the capture's record kernel (RecordKernel.cpp) on first use; throws if another
/// library holds its key. See Note [Capture: the record key].
void ensure_record_kernel();

/// Number of operators with our per-op kernel (for tests and diagnostics).
size_t registered_op_count();

}  // namespace tfz::detail
