// Rows for custom (non-ATen) ops: ones that mutate get a functional companion, ones that return
// an alias are refused by name.
// See Note [Kernel: custom mutable ops].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/Recorder.h"
#include "core/ViewInverses.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tfz::detail {

// Note [Kernel: custom mutable ops]
// An ATen in-place op has a functional twin in the schema table; a custom op that mutates its
// arguments (torch.library, schema with Tensor(a!), Tensor(a!)? or Tensor(a!)[]) has none, and
// torch.func.functionalize rejects it. On its first call on wrappers we register a companion:
//   mylib::scale_(Tensor(a!) x, float k) -> ()
//   tfz_functional::mylib__scale_(Tensor x, float k) -> Tensor       (new value of x)
// Its schema has the original's arguments without alias annotations and returns the original's
// returns followed by the new value of every written argument it does not return (the order of
// appended_mutated_args). Its CompositeExplicitAutograd kernel clones the written arguments (one
// clone per distinct tensor, so x passed twice is mutated twice, as in eager), calls the original
// op on the clones and returns them. The mutation kernel then treats the pair like add_/add: the
// traced graph shows one functional node, and the original's fake kernel serves fake tracing.
// Eager bumps a written argument's version counter once in the op's ADInplaceOrView kernel and
// again for every in-place op its body runs (acc.add_(...)): a count only the call knows. The
// companion's clone went through the same call, so the write bumps the wrapper's counter as many
// times as the clone's (OpInfo::versions_counted_on_results), once per distinct tensor.
// Rejected: clone-and-mutate inline in the graph (clone + mylib::scale_ on the clone) — correct,
// but the graph would keep a mutable op, which is what functionalization must remove.

bool is_custom_mutable(const c10::OperatorHandle& op) {
  return !is_aten(op) && writes_an_argument(op);
}

void plan_custom_mutable(const c10::OperatorHandle& op, OpInfo& info) {
  if (info.kind == OpKind::Unsupported) info = classify_mutable_with(op, functional_companion(op));
  info.keeps_identical_arguments = true;  // one clone per distinct tensor, see above
  info.versions_counted_on_results = true;
}

// Note [Kernel: custom view ops]
// A custom op whose return aliases an argument is a view op the engine cannot replay or invert:
// ViewMeta replays by calling the op again (fine), but writing through its output needs an
// inverse, which only ATen's view ops have (core/ViewInverses.cpp). Refused with a clear error
// instead of a View plan that would fail at the first write.
// Rejected: ignoring the annotation and planning it as functional (a write through the output
// would silently miss the argument, as for the ops of Note [Kernel: unsafe_split]), and a generic
// as_strided_scatter inverse from the output's geometry (right only for a same-dtype strided view,
// which an alias annotation does not promise; and without views no *_copy op replaces it).
bool is_custom_view(const c10::OperatorHandle& op) {
  return !is_aten(op) && !writes_an_argument(op) && returns_an_alias(op);
}

void refuse_custom_view(const c10::OperatorHandle& /*op*/, OpInfo& info) {
  unsupported(info,
              "the op returns an alias of an input, and functionalize only knows how to replay "
              "and invert ATen's own view ops. Make the custom op return a new tensor (clone)");
}

}  // namespace tfz::detail
