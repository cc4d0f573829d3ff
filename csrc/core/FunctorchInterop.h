// How a functionalize layer shares the thread with torch.func transforms (functorch's dynamic
// layer stack): stashing the transforms that were active when the layer was entered, and handing
// ops that a transform pushed inside the layer is processing to autograd.
// See Note [Functorch: torch.func transforms].
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <memory>

namespace tfz::detail {

/// The torch.func transforms (functorch dynamic layers) that were active when a layer was entered.
/// Opaque here so that Layer.h does not pull in functorch's headers.
struct FunctorchStash;
struct FunctorchStashDeleter {
  void operator()(FunctorchStash* stash) const;
};
using FunctorchStashPtr = std::unique_ptr<FunctorchStash, FunctorchStashDeleter>;

/// FuncTorchDynamicLayerFrontMode + BackMode: present in the included set while a transform is
/// on functorch's stack (and not processing an op).
c10::DispatchKeySet functorch_mode_keys();

/// If functorch's stack is not empty (told by the front key in `tls`, the thread's dispatch TLS),
/// moves it out into a new stash, leaving the thread's stack empty; else returns nullptr.
FunctorchStashPtr take_functorch_stack(const c10::impl::LocalDispatchKeySet& tls);

/// Exchanges the thread's functorch stack with the stash's contents (O(1), no copy).
void swap_functorch_stack(FunctorchStash& stash);

/// True while a torch.func transform is processing an op on this thread (functorch excludes its
/// front key for the duration, and keeps the back key, included while its stack is not empty):
/// an op that reaches our kernel then was sent to us by the transform, through our key in the
/// thread's included set, not by a wrapper of ours. torch._C._DisableFuncTorch (tensor printing
/// uses it) excludes both keys, which is not processing.
inline bool functorch_processing(const c10::impl::LocalDispatchKeySet& tls) {
  constexpr auto back = c10::DispatchKey::FuncTorchDynamicLayerBackMode;
  return tls.excluded_.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) &&
         tls.included_.has(back) && !tls.excluded_.has(back);
}
inline bool functorch_processing() {
  return functorch_processing(c10::impl::tls_local_dispatch_key_set());
}

/// `ks` (the keys an op reached our kernel with) without our autograd key: redispatching with it
/// reaches the autograd kernel the op would reach if our key were not in the included set.
c10::DispatchKeySet autograd_delegate_keys(c10::DispatchKeySet ks);

/// Boxed form: redispatches `op`, which reached our kernel with `ks` while a torch.func transform
/// processes it, to that autograd kernel.
void call_autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack);

}  // namespace tfz::detail
