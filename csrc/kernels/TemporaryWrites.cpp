// In-place writes of a backward formula's own temporaries under a tracer: the graph gets the
// functional op, the temporary's memory gets its values unrecorded, and later ops read the
// functional result in its place. See Note [Autograd: formula temporaries written in place].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/LayerAutograd.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/graph_task.h>

namespace tfz::detail {

// Note [Autograd: formula temporaries written in place]
// Our autograd runs on the values (Note [Wrapper: autograd mirrored]), so a backward formula's
// ops on tensors it saved reach our kernel with plain arguments only, and pass through. Most are
// functional; some formulas then write a temporary of their own in place: the norm's backward
// computes `self / norm` from its saved tensors and masks it with masked_fill_ (a gradient
// penalty's double backward runs it). Under a tracer that left `aten.masked_fill_` in graphs of
// remove="mutations" (views removed, the temporary was a wrapper already and this does not
// arise). So, under a tracer and while a backward runs, an in-place op whose one written argument
// is a plain temporary (no view, no other tensor on its storage, so nothing else can see the
// write; a tensor f closes over is written as written, as torch.func does) runs its functional
// variant, which the tracer records; the temporary's memory then takes the result's values with
// tracers hidden (the formula goes on reading that tensor: its values stay eager's), and the
// layer notes that the tensor now stands for the result, so each later op that reaches our kernel
// with it reads the traced result (as Note [Autograd: saved outputs under a tracer] does for saved
// outputs). Not under a tracer the write runs as written: it is invisible to everyone but the
// formula. Rejected: rewriting the traced graph afterwards (make_fx's graph and the capture
// recorder's would each need the pass, and the C++ graph another), and lifting the temporary into
// a wrapper (the formula keeps the plain tensor and would read its old values).
bool write_temporary_functionally(const OpInfo& info, const c10::OperatorHandle& op,
                                  torch::jit::Stack* stack) {
  if (info.kind != OpKind::Mutable || !info.functional_op || info.written.size() != 1 ||
      info.written[0].is_out || info.seeded || info.resizes_written ||
      torch::autograd::get_current_graph_task_id() == -1) {  // only a backward's own tensors
    return false;
  }
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  const c10::IValue& written = *(first + info.written[0].index);
  if (!written.isTensor()) return false;
  const at::Tensor self = written.toTensor();
  if (!self.defined() || self.is_view() || self.layout() != c10::kStrided || !self.has_storage() ||
      self.storage().use_count() != 1 || maybe_get_impl(self) != nullptr) {
    return false;
  }
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
    return false;  // eager's in-place kernel raises its own error; the functional node stays dead
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
