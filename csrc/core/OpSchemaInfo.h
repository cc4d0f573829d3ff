// Classifies an operator from its FunctionSchema alone (functional / view / in-place view /
// mutable / unsupported) and, for mutable ops, finds the functional variant and the argument plan
// that maps the mutable op onto it. Pure schema analysis over the dispatcher's op table: operators
// whose behaviour their schema does not tell are rows of kernels/SpecialOps.cpp, not cases here.
#pragma once

#include "core/ViewMeta.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <vector>

namespace tfz::detail {

enum class OpKind {
  Functional,   // no argument is written and no return aliases one: sync + unwrap, call, wrap
  View,         // a return aliases an argument, nothing is written: record a ViewMeta
  InplaceView,  // tag inplace_view (t_, transpose_, squeeze_, ...): change self's view chain
  Mutable,      // some argument is written: call the functional variant, then commit
  Unsupported,  // no plan (reason says why)
};

/// "functional", "view", "inplace_view", "mutable", "unsupported": the only spelling of the names.
const char* to_string(OpKind kind);

/// True if the argument's alias annotation says the op writes it (`Tensor(a!)`).
bool is_written(const c10::Argument& a);

/// True if the op writes at least one of its arguments.
bool writes_an_argument(const c10::OperatorHandle& op);

/// True for an out= argument: a written, keyword-only argument.
bool is_out_argument(const c10::Argument& a);

/// True if any argument is or contains a Tensor (Tensor, Tensor?, Tensor[], Tensor?[]).
bool has_tensor_arguments(const c10::FunctionSchema& schema);

/// Where a functional-variant argument comes from.
struct ArgSource {
  enum Kind {
    FromMutableArg,
    FromMutableArgOrOutDtype,  // the mutable op's dtype argument, out's dtype where it is None
    Default,
    OutDtype,
    OutLayout,
    OutDevice,
    None
  } kind;
  int index = -1;  // FromMutableArg*: index into the mutable op's arguments
};

/// A written argument of a mutable op, and where its new value comes from.
struct WrittenArg {
  int index = -1;              // argument index in the mutable op
  int functional_return = -1;  // index of its new value among the functional variant's returns
  bool is_out = false;         // an out= argument: resized to the value, not held to its shape
  bool is_returned = false;    // the mutable op returns it (its return aliases the argument)
};

/// What the kernel does for an operator: its kind and the plan of that kind.
struct OpInfo {
  OpKind kind = OpKind::Functional;
  std::string name;  // "aten::add_.Tensor", for messages (c10::toString of the operator name)
  std::string unsupported_reason;
  // Wrap the outputs of a call whose arguments are all plain, inside a layer: true for factories
  // (no tensor arguments); special rows set it for ops like lift_fresh.
  bool wraps_plain_outputs = false;
  // The op draws from a generator (tagged nondeterministic_seeded): read once here, since the
  // kernels ask on every call.
  bool seeded = false;

  // View and InplaceView: the out-of-place view op, its *_copy twin, the inverse.
  std::optional<c10::OperatorHandle> view_op;
  std::optional<c10::OperatorHandle> copy_op;
  InverseFn inverse = nullptr;
  // Views replayed as another view op keep this many leading arguments after self (-1: all).
  int replay_arg_count = -1;

  // Mutable: the functional variant and the argument plan (Note [Schema: argument plan]).
  std::optional<c10::OperatorHandle> functional_op;
  std::vector<ArgSource> functional_args;  // one per functional-variant argument
  std::vector<WrittenArg> written;         // returned ones in return order, then the others
  std::vector<int> return_aliases;         // per mutable-op return: the written argument it
                                           // aliases, or -1 for a fresh return
  // Mutable: each written element depends only on the argument elements at its own index, so an
  // argument may share memory with the written tensor.
  // See Note [Kernel: writes that read their own memory].
  bool elementwise = false;
  // Mutable: a tensor passed as two arguments stays one tensor in the functional variant (custom
  // ops' companions clone per distinct tensor), so eager's order is kept for that pair.
  bool keeps_identical_arguments = false;
  // Mutable: eager's kernel resizes its written arguments as out= ops resize out.
  // See Note [Schema: in-place arguments an op resizes].
  bool resizes_written = false;
  // Mutable: an out= tensor with the result's number of elements keeps its shape.
  // See Note [Schema: out= of the same number of elements].
  bool out_keeps_shape_of_same_numel = false;
  // Functional: a *_like op (empty_like, rand_like, ...), whose `self` gives only its metadata.
  // See Note [Strides: what eager gives], case "*_like templates".
  bool self_is_template = false;
  // Functional: the result is a copy of self's whole storage at self's geometry (the *_scatter
  // ops and copy). See Note [Alias: writes to a value that is not its whole storage].
  bool copies_self_storage = false;
  // Mutable: eager's kernel bumps the written tensors' version counters (an ADInplaceOrView
  // kernel, or _foreach_ ops, whose kernels bump them); fused optimizer kernels and ops that
  // write arguments their schema hides (native_batch_norm) do not. See
  // Note [Inputs: version counters].
  bool bumps_versions = true;
  // Mutable: the functional variant's results are the written arguments' clones, on which the
  // original op ran (custom ops' companions): each write bumps the version as many times as the
  // op bumped its clone. See Note [Kernel: custom mutable ops].
  bool versions_counted_on_results = false;
};

/// Computes the OpInfo of `op` from its schema (slow: schema analysis and a table lookup; cache
/// the result). Special operators get their final plan in kernels/SpecialOps.cpp.
OpInfo classify(const c10::OperatorHandle& op);

/// classify() for a mutable op, with its functional variant given instead of looked up.
OpInfo classify_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional);

/// Makes `info` a View plan replaying `view_op` (its *_copy twin and inverse looked up by name).
void set_view_plan(const c10::OperatorHandle& view_op, OpInfo& info);

/// Adds a non-mutable op to the table of functional-variant candidates. Call for every op
/// before classifying mutable ones; later ops (custom ops) may be added at any time.
void index_functional_candidate(const c10::OperatorHandle& op);

/// Removes a deregistered op from the candidate table (its name may be defined again with another
/// schema, and the handle would then carry the new one under the old signature).
void forget_functional_candidate(const c10::OperatorName& name);

/// Written arguments that the op does not return, in torchgen's order (self, out=, positional):
/// the new values a functional variant appends to its returns.
std::vector<int> appended_written_args(const c10::FunctionSchema& schema);

/// The torchgen-style normalized signature of a schema (exposed for tests).
std::string normalized_signature(const c10::FunctionSchema& schema);

}  // namespace tfz::detail
