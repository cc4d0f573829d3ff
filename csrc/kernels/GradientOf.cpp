// tfz::_with_gradient_of(value, old): value's data, as a new tensor, with old's gradient edge
// when autograd records the call. The node a graph holds where the traced program wrote a tensor
// in a way autograd does not see. See Note [Graphs: writes autograd does not see].
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

namespace {

// A new tensor, as the schema promises (graph passes and compilers may write an op's result in
// place): the value's data is copied once.
at::Tensor with_gradient_of(const at::Tensor& value, const at::Tensor& /*old*/) {
  return value.clone();
}

at::Tensor with_gradient_of_autograd(const at::Tensor& value, const at::Tensor& old) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tfz::_with_gradient_of", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    out = op.call(value, old);
  }
  if (c10::GradMode::is_enabled() && old.requires_grad()) {
    torch::autograd::impl::set_gradient_edge(out, torch::autograd::impl::gradient_edge(old));
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tfz, m) {
  m.def("_with_gradient_of(Tensor value, Tensor old) -> Tensor");
}

TORCH_LIBRARY_IMPL(tfz, CompositeExplicitAutograd, m) {
  m.impl("_with_gradient_of", &with_gradient_of);
}

TORCH_LIBRARY_IMPL(tfz, Autograd, m) {
  m.impl("_with_gradient_of", &with_gradient_of_autograd);
}

// A conjugate or negative value keeps its bit (clone keeps it): the fallbacks of those keys would
// resolve it first.
TORCH_LIBRARY_IMPL(tfz, Conjugate, m) {
  m.impl("_with_gradient_of", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(tfz, Negative, m) {
  m.impl("_with_gradient_of", torch::CppFunction::makeFallthrough());
}
