// The gradient of rrelu in training through the noise it drew: the functional variant's
// derivative reads the noise argument's old value, so the mutation kernel gives autograd the
// result as self * noise_out instead. See Note [Kernel: rrelu's noise under autograd].
#include "kernels/Handlers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace tfz::detail {

// Note [Kernel: rrelu's noise under autograd]
// rrelu_with_noise(self, noise, lower, upper, training=True) writes the random slope of each
// element into noise (1 where self > 0) and returns self * slope; eager's autograd saves noise,
// which the op has written, and backward is grad * noise. Its functional variant
// rrelu_with_noise_functional returns (result, noise_out), but PyTorch's derivative for it
// (derivatives.yaml) reads the `noise` argument, which the functional variant leaves as it was:
// run through it, backward multiplied by the noise before the draw (zeros, or an
// uninitialised torch.empty_like for F.rrelu): wrong gradients, silently. So when autograd will
// record the call (grad mode on, self requires grad, training), the mutation kernel replaces the
// result given to autograd by self * noise_out: the same values (the kernels compute self * r
// in self's dtype, and noise_out holds r; for float16/bfloat16, whose kernels multiply in float,
// the result keeps the kernel's values and only its gradient comes from the product), and the
// derivative eager's has. Graphs record the functional variant and a mul, both ATen ops.
// Rejected: running the mutable op on a clone of the noise (correct eagerly, but a traced graph
// would hold a mutation); editing the saved variable of the recorded backward node (generated
// class names differ between torch versions).
void differentiate_rrelu_through_its_noise(const OpInfo& info, const c10::OperatorHandle& op,
                                           const std::vector<c10::IValue>& inner,
                                           torch::jit::Stack& results) {
  // info.seeded first: one flag read for every other op (rrelu_with_noise draws from a generator).
  static const c10::OperatorName functional("aten::rrelu_with_noise_functional", "");
  if (!info.seeded || !info.functional_op || info.functional_op->operator_name() != functional ||
      !c10::GradMode::is_enabled() || results.size() != 2) {
    return;
  }
  const auto& schema = op.schema();
  const auto self_index = schema.argumentIndexWithName("self");
  const auto training_index = schema.argumentIndexWithName("training");
  if (!self_index || !training_index || !inner[*self_index].isTensor() ||
      !inner[*training_index].toBool()) {
    return;
  }
  const at::Tensor& self = inner[*self_index].toTensor();
  if (!self.requires_grad()) return;
  const at::Tensor result = results[0].toTensor();
  const at::Tensor product = at::mul(self, results[1].toTensor());
  const auto dtype = self.scalar_type();
  results[0] = dtype == at::kFloat || dtype == at::kDouble
                   ? product
                   : at::add(result.detach(), at::sub(product, product.detach()));
}

}  // namespace tfz::detail
