// The functorch side of a layer: stashing functorch's dynamic layer stack, and delegating ops a
// torch.func transform is processing to autograd.
// See Note [Functorch: torch.func transforms].
#include "core/FunctorchInterop.h"

#include "core/DispatchKey.h"

#include <ATen/FuncTorchTLS.h>
#include <c10/util/Exception.h>

#include <utility>
#include <vector>

namespace tfz::detail {

// Note [Functorch: torch.func transforms]
// torch.func transforms (grad, vjp, jvp, jacrev, jacfwd, hessian, vmap) are functorch's
// interpreters, kept on a thread-local "dynamic layer stack". While it is not empty, the front key
// FuncTorchDynamicLayerFrontMode (the highest-priority key) and the back key
// FuncTorchDynamicLayerBackMode sit in the included set. An op reaches the front key first, which
// hands it to the top interpreter ("process": only that transform's keys enabled, front key
// excluded); the transform's kernels redispatch down to the back key, which pops the top
// interpreter and sends the op, on unwrapped arguments, to the next one, until the stack is empty
// and the op runs on plain tensors. The order of transforms is the order of that stack; an
// out-of-tree key is not on it, so we place our layer in it by hand, in both directions.
//
// 1. A transform outside our layer (grad(functionalize(f)), vmap(functionalize(f))): our layer
//    is the innermost transform, so it must see the user's ops first, and its inner calls (on the
//    wrappers' values, which are functorch's TensorWrappers / BatchedTensors) must then go
//    through the transforms. On entry the layer moves functorch's stack out (the thread's stack
//    becomes empty) and takes the front/back keys out of the included set; every inner call
//    swaps the stack back in and re-includes the keys (Note [Layer: TLS scheme]), and the layer's
//    exit restores both. The swap is O(1) (no copy of the interpreters) and only happens for a
//    layer entered under a transform; a layer with an empty stack pays one pointer test per
//    inner call. While user code runs, functorch therefore sees exactly the transforms pushed
//    inside the layer, numbered from 1 again: grad(functionalize(grad(f))) has two level-1
//    interpreters, never on the stack at the same time, each with its own life handle.
//    Evidence: without the stash, the front key (above every other key) catches the user's op on
//    our wrapper and grad's interpreter wraps the *wrapper* in a TensorWrapper, i.e. grad would
//    run inside functionalize; hiding the keys alone is not enough, because a transform pushed in
//    user code then finds a non-empty stack and does not re-include them.
// 2. A transform inside our layer (functionalize(grad(f)), functionalize(vmap(f))): it must see
//    the ops first, and its redispatches reach us once its interpreter is popped (by then our
//    layer's view of the stack is empty again, so our kernel runs as usual). The catch is our own
//    key in the included set (there so that factories reach us; Note [Layer: TLS scheme]): it is
//    an autograd key, and grad/jvp enable autograd keys while processing, so functorch's
//    TensorWrapper around our wrapper (keys AutogradOther, ADInplaceOrView, FuncTorchGradWrapper:
//    PrivateUse3 is not among the keys functorch propagates) reaches our kernel instead of
//    autograd's. Our kernel recognises this state (functorch excludes its front key while
//    processing and keeps its back key live; torch._C._DisableFuncTorch, used by tensor
//    printing, excludes both, so it does not count) and redispatches with our key's bits
//    removed, so the op reaches exactly the autograd kernel it would reach without our layer
//    (AutogradOther here, AutogradCPU for plain CPU tensors), which records the op and
//    redispatches down to the back key. vmap never reaches us this way: it excludes autograd
//    keys while processing.
// Rejected: (a) refusing layers under a transform (only functionalize(vmap(f)) would compose);
// (b) registering our layer as a functorch interpreter: the
// TransformType enum is closed, and the Functionalize interpreter drives PyTorch's own
// Functionalize key; (c) copying the stack with setDynamicLayerStack on each inner call: a heap
// copy of every interpreter per op; (d) giving wrappers a per-backend key functorch propagates:
// every such key belongs to a real backend.
// Limits: torch.func's Python code that inspects the interpreter stack from user code (e.g.
// torch.autograd.Function under a transform outside the layer) sees only the transforms pushed
// inside the layer.

struct FunctorchStash {
  std::unique_ptr<at::functorch::FuncTorchTLSBase> state;
};

void FunctorchStashDeleter::operator()(FunctorchStash* stash) const {
  delete stash;
}

c10::DispatchKeySet functorch_mode_keys() {
  return c10::DispatchKeySet({c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                              c10::DispatchKey::FuncTorchDynamicLayerBackMode});
}

// functorch keeps its stack (and two flags) in one heap object per thread, reached through
// functorchTLSAccessor(); with no object, functorch creates an empty one on first use. Moving the
// object out therefore empties the stack in O(1) without naming functorch's DynamicLayer type
// (whose header needs nlohmann/json, which the torch wheel does not ship), and swapping it back is
// O(1) too. Front/back keys in the dispatch TLS tell whether the stack is empty: functorch
// includes them while it is not (and excludes the front key while processing an op).
FunctorchStashPtr take_functorch_stack(const c10::impl::LocalDispatchKeySet& tls) {
  constexpr auto front = c10::DispatchKey::FuncTorchDynamicLayerFrontMode;
  if (!tls.included_.has(front) && !tls.excluded_.has(front)) return nullptr;
  FunctorchStashPtr stash(new FunctorchStash());
  stash->state = std::move(at::functorch::functorchTLSAccessor());
  return stash;
}

void swap_functorch_stack(FunctorchStash& stash) {
  stash.state.swap(at::functorch::functorchTLSAccessor());
}

c10::DispatchKeySet autograd_delegate_keys(c10::DispatchKeySet ks) {
  // Our autograd key is AutogradFunctionality + the PrivateUse3 backend bit. Without the bit, the
  // highest key is the autograd key of the other arguments' backend (AutogradCPU for a
  // TensorWrapper of a CPU tensor); with no backend bit left the per-backend functionality cannot
  // resolve and goes too, leaving AutogradOther (functorch's wrappers of our wrappers) or, for a
  // tensor-free op, the keys below autograd (functorch's back key).
  c10::DispatchKeySet out = ks.remove_backend(c10::BackendComponent::PrivateUse3Bit);
  if (out.getBackendIndex() == 0) {
    out = out - c10::DispatchKeySet(c10::DispatchKey::AutogradFunctionality);
  }
  return out;
}

void call_autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  op.redispatchBoxed(autograd_delegate_keys(ks), stack);
}

}  // namespace tfz::detail
