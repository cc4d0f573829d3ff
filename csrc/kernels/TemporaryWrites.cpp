// In-place writes of a backward formula's own temporaries: with functional values they run on
// the values; under a tracer the graph gets the functional op, the temporary's memory gets its
// values unrecorded, and later ops read the functional result in its place.
// See Note [Autograd: formula temporaries written in place].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/LayerAutograd.h"
#include "core/Recording.h"
#include "core/ViewInverses.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/graph_task.h>

namespace tfz::detail {

// Note [Autograd: formula temporaries written in place]
// Our autograd runs on the values (Note [Wrapper: autograd mirrored]), so a backward formula's
// ops on tensors it saved reach our kernel with plain arguments, and the gradients flowing in are
// wrappers (Note [Autograd: .backward() inside the function]). Some formulas write a temporary of
// their own in place: the norm's backward masks `self / norm` with masked_fill_ (all plain; a
// gradient penalty's double backward runs it), binary_cross_entropy_with_logits' computes
// `sigmoid(input) - target` from what it saved and multiplies the incoming gradient into it with
// mul_ (a wrapper written into a plain tensor, which check_writable refuses for a tensor f closes
// over). Rule: while a backward runs, an in-place op whose one written argument is a plain
// temporary (no view, no other tensor on its storage, so nothing else can see the write; for a
// tensor f closes over, see Note [Kernel: writes into captured tensors])
// runs on the values (also a view of such a temporary, the two alone on their storage: eigh's and
// svd's backward fill the diagonal of one; under a tracer its base then stands for the functional
// as_strided_scatter of the new values):
//   - no tracer: as written, on the temporary and the other arguments' values; the formula's
//     result is then a plain gradient with eager's numbers (AccumulateGrad lifts it, see
//     LayerAutograd::before_accumulate);
//   - under a tracer: as its functional variant, which the tracer records; the temporary's memory
//     takes the result's values with tracers hidden (the formula goes on reading that tensor: its
//     values stay eager's), and the layer notes that the tensor now stands for the result, so each
//     later op that reaches our kernel with it, f's outputs and AccumulateGrad read the traced
//     result (as Note [Autograd: saved outputs under a tracer] does for saved outputs). Without
//     this `aten.masked_fill_` stayed in remove="mutations" graphs.
// Rejected: rewriting the traced graph afterwards (make_fx's graph and the capture recorder's
// would each need the pass, and the C++ graph another), and lifting the temporary into a wrapper
// (the formula keeps the plain tensor and would read its old values).
namespace {
// The written argument if `op` writes one plain temporary of a running backward, else null.
const c10::IValue* formula_temporary(const OpInfo& info, const c10::OperatorHandle& op,
                                     const torch::jit::Stack& stack) {
  if (info.kind != OpKind::Mutable || !info.functional_op || info.written.size() != 1 ||
      info.written[0].is_out || info.seeded || info.resizes_written) {
    return nullptr;
  }
  const size_t num_args = op.schema().arguments().size();
  const c10::IValue& written =
      *(stack.end() - static_cast<std::ptrdiff_t>(num_args) + info.written[0].index);
  if (!written.isTensor()) return nullptr;
  const at::Tensor& self = written.toTensor();
  if (!self.defined() || maybe_get_impl(self) != nullptr || self.layout() != c10::kStrided ||
      !self.has_storage() || torch::autograd::get_current_graph_task_id() == -1) {
    return nullptr;  // only a backward's own tensors
  }
  if (!self.is_view()) return self.storage().use_count() == 1 ? &written : nullptr;
  // A view of such a temporary, the two alone on their storage (eigh's and svd's backward fill
  // the diagonal of a temporary they computed).
  const at::Tensor base(self._base());
  const bool lone_view = base.defined() && !base.is_view() && maybe_get_impl(base) == nullptr &&
                         base.layout() == c10::kStrided && base.has_storage() &&
                         base.storage().is_alias_of(self.storage()) &&
                         self.storage().use_count() == 2;
  return lone_view ? &written : nullptr;
}

// No tracer: the op as written, on the values.
void write_on_values(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_args); it != stack->end(); ++it) {
    transform_tensors(*it, sync_and_unwrap);
  }
  InnerCallGuard guard;
  op.callBoxed(stack);
}
}  // namespace

bool write_formula_temporary(const OpInfo& info, const c10::OperatorHandle& op,
                             torch::jit::Stack* stack) {
  const c10::IValue* written = formula_temporary(info, op, *stack);
  if (written == nullptr) return false;
  if (!ops_are_recorded()) {
    write_on_values(op, stack);
    return true;
  }
  const at::Tensor self = written->toTensor();
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  std::vector<c10::IValue> args(first, stack->end());
  for (auto& v : args) transform_tensors(v, sync_and_unwrap);  // earlier rewrites, saved outputs
  const auto& fschema = info.functional_op->schema();
  torch::jit::Stack fstack;
  fstack.reserve(info.functional_args.size());
  for (size_t i = 0; i < info.functional_args.size(); ++i) {
    fstack.push_back(functional_arg(info.functional_args[i], fschema.arguments()[i], args, {}));
  }
  {
    InnerCallGuard guard;
    info.functional_op->callBoxed(fstack);
  }
  const int ret = info.written[0].functional_return;
  if (ret < 0 || static_cast<size_t>(ret) >= fstack.size() || !fstack[ret].isTensor()) {
    TORCH_CHECK(false, "functionalize: ", info.name,
                ": the functional variant returned no value for the written temporary");
  }
  at::Tensor value = fstack[ret].toTensor();
  if (value.scalar_type() != self.scalar_type() || value.sym_sizes() != self.sym_sizes()) {
    write_on_values(op, stack);  // eager's in-place kernel raises its own error
    return true;
  }
  if (self.is_view()) {  // the base stands for the functional scatter of the new values
    const at::Tensor base(self._base());
    at::Tensor scattered;
    {
      InnerCallGuard guard;
      scattered = strided_scatter(sync_and_unwrap(base), value, self.sym_sizes(),
                                  self.sym_strides(), self.sym_storage_offset());
    }
    note_rewritten_temporary(base, scattered);
  }
  {
    MetaComputeGuard hidden;  // the formula's tensor takes the values; no tracer sees it
    at::AutoGradMode no_grad(false);
    self.copy_(value);
  }
  note_rewritten_temporary(self, value);
  torch::jit::drop(*stack, num_args);
  // The one written argument is the only one a return can alias: those returns are `self`.
  for (size_t i = 0; i < schema.returns().size(); ++i) {
    const bool aliases = !info.return_aliases.empty() && info.return_aliases[i] >= 0;
    torch::jit::push(*stack, aliases ? c10::IValue(self) : fstack[i]);
  }
  return true;
}

}  // namespace tfz::detail
