// Classifies an operator from its FunctionSchema (functional / view / inplace-view / mutable /
// unsupported) and, for mutable ops, finds the functional variant and how arguments and returns
// map onto it. Pure schema analysis over the dispatcher's op table; no registration.
#pragma once

#include "core/ViewMeta.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

namespace tfz::detail {

enum class OpKind {
  Functional,   // no alias annotations: sync + unwrap, call, wrap
  View,         // a return aliases self, nothing is written: record a ViewMeta
  InplaceView,  // tag inplace_view (t_, transpose_, squeeze_, ...): change self's view chain
  Mutable,      // some argument is written: call the functional variant, then commit
  Unsupported,  // mutable with no functional variant, or an op we refuse (reason says why)
  BatchNorm,    // aten::native_batch_norm: writes running stats its schema does not annotate
  Resize,       // aten::resize_ / resize_as_: a view of the storage, or a new storage
};

/// Where a functional-variant argument comes from.
struct ArgSource {
  enum Kind { FromMutableArg, Default, OutDtype, OutLayout, OutDevice, None } kind;
  int index = -1;  // FromMutableArg: index into the mutable op's arguments
};

struct OpInfo {
  OpKind kind = OpKind::Functional;
  std::string name;            // "aten::add_.Tensor", for messages
  std::string unsupported_reason;
  bool has_tensor_args = false;  // false: a factory; its outputs are wrapped inside a layer
  bool wraps_plain_input = false;  // lift / lift_fresh / lift_fresh_copy: wrap even plain inputs

  // View and InplaceView: the out-of-place view op, its *_copy twin, the inverse.
  std::optional<c10::OperatorHandle> view_op;
  std::optional<c10::OperatorHandle> copy_op;
  InverseFn inverse = nullptr;
  // View ops replayed as another view op (only _reshape_alias -> view): keep this many leading
  // arguments after self. -1: the op itself with all its arguments.
  int replay_arg_count = -1;

  // Mutable: the functional variant and the argument/return plan.
  std::optional<c10::OperatorHandle> functional_op;
  std::vector<ArgSource> functional_args;  // one per functional-op argument
  std::vector<int> mutated_args;           // mutable-op argument indices, functional-return order
                                           // after the mutable op's own returns
  std::vector<int> return_aliases;         // per mutable-op return: written argument it aliases,
                                           // or -1 for a fresh return
  bool is_out = false;                     // an out= op (written kwarg-only arguments)

  // A CompositeImplicitAutograd op we intercept whole instead of letting it decompose
  // (Note [Kernel: composites intercepted whole]).
  bool composite_whole = false;

  // An in-place aten::_foreach_* op (returns nothing): applied one index at a time when its
  // lists alias each other (Note [Kernel: _foreach_ ops on aliased lists]).
  bool foreach_inplace = false;
};

/// Computes the OpInfo for `op` (slow: schema analysis and a table lookup; cache the result).
OpInfo classify(const c10::OperatorHandle& op);

/// Adds a non-mutable op to the table of functional-variant candidates. Call for every op
/// before classifying mutable ones; later ops (custom ops) may be added at any time.
void index_functional_candidate(const c10::OperatorHandle& op);

/// Removes a deregistered op from the candidate table (its name may be defined again with another
/// schema, and the handle would then carry the new one under the old signature).
void forget_functional_candidate(const c10::OperatorName& name);

/// Like classify() for a mutable op, with its functional variant given (a functional companion
/// of a custom op: same arguments without alias annotations, returns as normalized_signature).
OpInfo classify_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional);

/// Written arguments that the op does not return, in torchgen's order (self, out=, positional):
/// the new values a functional variant appends to its returns.
std::vector<int> appended_mutated_args(const c10::FunctionSchema& schema);

/// True for the CompositeImplicitAutograd ops we register a kernel for, instead of letting them
/// decompose (Note [Kernel: composites intercepted whole]).
bool intercepts_composite_whole(const c10::OperatorHandle& op);

/// True if any argument is or contains a Tensor (Tensor, Tensor?, Tensor[], Tensor?[]).
bool has_tensor_arguments(const c10::FunctionSchema& schema);

/// The torchgen-style normalized signature of a schema (exposed for tests).
std::string normalized_signature(const c10::FunctionSchema& schema);

}  // namespace tfz::detail
