// The gradient of copy_ inside the function: the functional variant `copy` has no derivative in
// torch, so the mutation kernel gives its result the derivative of eager's copy_.
// See Note [Kernel: copy's derivative].
#include "kernels/Handlers.h"

#include "core/LayerAutograd.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/functions/tensor.h>
#include <torch/csrc/autograd/functions/utils.h>

namespace tfz::detail {
namespace {
// NodePtr (core/LayerAutograd.h) is std::shared_ptr or c10::intrusive_ptr, as the installed torch
// holds autograd nodes; a node is made the matching way.
template <class Ptr>
struct NodeMaker;
template <class N>
struct NodeMaker<std::shared_ptr<N>> {
  template <class T>
  static std::shared_ptr<N> make() {
    return std::make_shared<T>();
  }
};
template <class N>
struct NodeMaker<c10::intrusive_ptr<N>> {
  template <class T>
  static c10::intrusive_ptr<N> make() {
    return c10::make_intrusive<T>();
  }
};
}  // namespace

// Note [Kernel: copy's derivative]
// Eager's `dst.copy_(src)` records CopyBackwards: the gradient of dst's old value is zero, src's
// is the incoming gradient in src's dtype and device (the engine sums it over the dimensions src
// was broadcast along). Our autograd runs on the values (Note [Wrapper: autograd mirrored]), where
// copy_ becomes the functional `aten::copy`, to which torch gives no derivative: its grad_fn is a
// node that raises "derivative for aten::copy is not implemented" at backward, so `buf[0] = w * 3`
// or `h.copy_(y)` (and a custom Function's mark_dirty, Note [Autograd: custom Functions]) could not
// be differentiated inside f. When autograd records the call (grad mode on, dst or src requires
// grad), the kernel replaces that node by eager's CopyBackwards, with the same edges. Graphs keep
// `aten.copy`; the backward ops it adds (zeros_like, _to_copy) are ATen ops.
// Rejected: a composite (src expanded, converted and restrided) in place of `copy` (its values
// are the same, but graphs and the reinplace passes read `aten.copy`), and an autograd kernel for
// aten::copy (a global registration that changes torch for every caller).
void differentiate_copy(const OpInfo& info, const std::vector<c10::IValue>& inner,
                        torch::jit::Stack& results) {
  // A handle comparison (one pointer), after the grad-mode read: this runs after every write.
  static const c10::OperatorHandle copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy", "");
  if (!c10::GradMode::is_enabled() || !info.functional_op || !(*info.functional_op == copy) ||
      results.size() != 1 || inner.size() < 2 || !inner[0].isTensor() || !inner[1].isTensor()) {
    return;
  }
  const at::Tensor& self = inner[0].toTensor();
  const at::Tensor& src = inner[1].toTensor();
  if (!self.requires_grad() && !src.requires_grad()) return;
  const at::Tensor& out = results[0].toTensor();
  NodePtr node = NodeMaker<NodePtr>::make<torch::autograd::CopyBackwards>();
  node->set_next_edges(torch::autograd::collect_next_edges(self, src));
  static_cast<torch::autograd::CopyBackwards*>(node.get())->src_options = src.options();
  torch::autograd::set_history(out, node);
}

// Note [Kernel: copy's forward derivative]
// In forward mode (torch.autograd.forward_ad), eager's dst.copy_(src) gives dst src's tangent,
// converted to dst's dtype and broadcast to its shape (zeros if src has none: dst's old tangent is
// overwritten), where torch's functional aten::copy has no forward derivative ("Trying to use
// forward AD with aten::copy that does not support it"). So when self or src carries a tangent at
// the first dual level (the one forward_ad.dual_level() opens), copy runs with forward grads off
// and its result is given that tangent. Deeper levels keep torch's error. Rejected: a composite in
// place of `copy` (Note [Kernel: copy's derivative] rejects it for graphs and the reinplace
// passes).
bool copy_with_tangent(const OpInfo& info, const std::vector<c10::IValue>& inner,
                       torch::jit::Stack& fstack) {
  static const c10::OperatorHandle copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy", "");
  if (!info.functional_op || !(*info.functional_op == copy) || inner.size() < 2 ||
      !inner[0].isTensor() || !inner[1].isTensor() ||
      !c10::AutogradState::get_tls_state().get_fw_grad_mode()) {
    return false;
  }
  const at::Tensor& self = inner[0].toTensor();
  const at::Tensor& src = inner[1].toTensor();
  auto tangent_of = [](const at::Tensor& t) {
    return t.unsafeGetTensorImpl()->autograd_meta() != nullptr ? t._fw_grad(0) : at::Tensor();
  };
  const at::Tensor src_tangent = tangent_of(src);
  if (!src_tangent.defined() && !tangent_of(self).defined()) return false;
  {
    c10::AutoFwGradMode no_forward_grad(false);
    info.functional_op->callBoxed(fstack);
  }
  const at::Tensor& out = fstack[0].toTensor();
  at::Tensor tangent = src_tangent.defined()
                           ? src_tangent.to(out.scalar_type()).expand(out.sizes()).clone()
                           : at::zeros_like(out);
  out._set_fw_grad(tangent, 0, /*is_inplace_op=*/false);
  return true;
}

}  // namespace tfz::detail
