// The one place that names the dispatch keys torch-functionalize borrows, and key-set helpers.
// Everything else refers to kAutogradKey / kBackendKey, so moving to another key is a change here.
#pragma once

#include <c10/core/DispatchKeySet.h>

namespace tfz::detail {

// Note [Which dispatch key]
// Out-of-tree code cannot add a DispatchKey enum entry, so we borrow one. We use the pair
// AutogradPrivateUse3 (where the transform runs) + PrivateUse3 (its backend twin):
//  - AutogradPrivateUse3 sits above ADInplaceOrView, Python (TorchDispatchMode, hence make_fx)
//    and BackendSelect. Our kernel takes the wrapper's autograd slot, so autograd never runs on
//    wrappers; it runs on the inner tensors during our redispatch, exactly as with
//    torch.func.functionalize. A tracing mode below us only ever sees inner tensors.
//  - CompositeImplicitAutograd ops decompose before reaching an autograd key, so only the
//    "real" ops reach us. We register one boxed kernel per non-CIA operator (a plain fallback
//    would lose to every op's Autograd kernel and to CompositeExplicitAutograd kernels).
//  - PrivateUse3 (Dense) gets the same kernel: when autograd keys are excluded (inference_mode,
//    variable factories), dispatch on a wrapper falls through to its backend key.
// Rejected: PrivateUse1, the slot real accelerator plugins (torch_npu, openreg, ...) occupy;
// sharing it makes registrations collide. The built-in Functionalize key belongs to PyTorch and
// overriding it would break torch.func and torch.compile process-wide. A Python
// TorchDispatchMode cannot serve the C++ API.
//
// Factories need a third key. Python's torch.zeros & co. (and C++ torch::zeros) go through
// autograd's variable factories, which exclude every autograd key, and BackendSelect then
// redispatches with only the key computed from the TensorOptions: no PrivateUse3 key ever sees
// them. A layer therefore also includes DeferredInit, a non-per-backend key above autograd that
// variable factories do not exclude and that nothing in torch registers (it is reserved for the
// out-of-core torchdistx). It carries a process-wide fallthrough, so only the ops we register
// there, tensor-free ones, cost anything; our kernel wraps their outputs.
// Rejected for factories: a Python TorchFunctionMode wrapping tensor-free results. The mode
// protocol alone costs ~3 us on *every* torch call inside the function (measured on torch 2.13, a
// trivial mode), more than our whole kernel, and it cannot help C++ callers.
constexpr c10::DispatchKey kAutogradKey = c10::DispatchKey::AutogradPrivateUse3;
constexpr c10::DispatchKey kBackendKey = c10::DispatchKey::PrivateUse3;
constexpr c10::DispatchKey kFactoryKey = c10::DispatchKey::DeferredInit;

// Note [Capture: the record key]
// capture() needs a key that sees every op called on plain tensors while it records (
// Note [Capture: how ops are recorded]), above autograd and the backends, that no kernel of torch's
// claims. We borrow TESTING_ONLY_GenericMode: a functionality key (no backend bit, so the delta
// TLS guards are safe with it) at the top of the dispatch order, below only PreDispatch and
// PythonDispatcher, for which torch registers no kernel and no fallback in its libraries (it
// exists for the dispatcher's own C++ tests). Its fallback is registered on the first capture,
// after checking that no one else holds it, so processes that never capture never touch it.
// Being above FuncTorchDynamicLayerFrontMode and the Autocast keys, it would see ops before
// torch.func transforms and autocast rewrite them: capture refuses both (make_fx handles them).
// Rejected: Python (a TorchDispatchMode is what costs ~500 us a node), Tracer (TorchScript's
// tracer kernels occupy it for every op), the Autocast keys (torch holds their fallbacks), and
// our DeferredInit key (its fallthrough is what keeps factories free for every other op).
constexpr c10::DispatchKey kRecordKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

/// Keys every wrapper carries (and nothing else: not Python, not ADInplaceOrView), apart from the
/// bits it mirrors from its value (mirrored_key_set).
inline c10::DispatchKeySet wrapper_key_set() {
  return c10::DispatchKeySet({kAutogradKey, kBackendKey});
}

// Note [Wrapper: mirrored conjugate and negative bits]
// `is_conj()` and `is_neg()` read the Conjugate and Negative dispatch keys of a tensor, so a
// wrapper reports eager's answer only if it carries the bits its value has (x.conj().is_conj() is
// True in eager). Carrying them changes no kernel: our kernel sits at the autograd key, above
// Conjugate and Negative, unwraps, and runs on values that carry the bits themselves. Where
// autograd keys are excluded (inference mode), the bits' fallbacks run on the wrapper before our
// backend-key kernel, materializing through ops that reach us as usual, which is what eager does to
// a plain tensor. Rejected: copying the value's whole key set, as torch's own wrapper does; it
// would put the value's backend keys (CPU, CUDA) on the wrapper and let their kernels see wrappers.
// The ZeroTensor bit is mirrored the same way, for `_is_zerotensor()` and for the reroute of
// Note [Kernel: efficient zero tensors]; and so is the Sparse functionality bit, which is what
// `is_sparse()` and `layout()` read: a sparse COO tensor made inside a layer (a sparse gradient
// from embedding's backward, torch.sparse_coo_tensor of wrappers) reports torch.sparse_coo, so
// AccumulateGrad takes its sparse branch and SparseAdam accepts the gradient, as in eager. The
// SparseCsr bit likewise, with layout_impl() naming the value's compressed layout. With the
// bits, a wrapper's runtime key below autograd is SparsePrivateUse3 or SparseCsrPrivateUse3,
// where our fallback is registered too (kFallbackKeys).
inline c10::DispatchKeySet mirrored_key_set(c10::DispatchKeySet value_keys) {
  return value_keys & c10::DispatchKeySet({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative,
                                           c10::DispatchKey::ZeroTensor, c10::DispatchKey::Sparse,
                                           c10::DispatchKey::SparseCsr});
}

/// Where an op with an efficient-zero wrapper among its arguments goes first: torch's ZeroTensor
/// kernel, then our backend key (Note [Kernel: efficient zero tensors]).
inline c10::DispatchKeySet zero_tensor_keys() {
  return c10::DispatchKeySet({c10::DispatchKey::ZeroTensor, kBackendKey});
}

/// Keys a functionalize layer adds to the thread's included set (see Note [Layer: TLS scheme]).
inline c10::DispatchKeySet layer_included_keys() {
  return c10::DispatchKeySet({kAutogradKey, kFactoryKey});
}

/// The Python-level keys (TorchDispatchModes, hence make_fx, and their TLS snapshot).
inline c10::DispatchKeySet python_keys() {
  return c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
}

/// Keys a functionalize layer hides while user code runs, and unhides for inner calls: the
/// Python keys and the capture's record key (Note [Capture: the record key]).
inline c10::DispatchKeySet layer_hidden_keys() {
  return python_keys() | c10::DispatchKeySet(kRecordKey);
}

/// Every runtime key our boxed kernel is registered at, per op and as fallback.
inline constexpr c10::DispatchKey kFallbackKeys[] = {
    c10::DispatchKey::AutogradPrivateUse3,  c10::DispatchKey::PrivateUse3,
    c10::DispatchKey::SparsePrivateUse3,    c10::DispatchKey::QuantizedPrivateUse3,
    c10::DispatchKey::SparseCsrPrivateUse3, c10::DispatchKey::NestedTensorPrivateUse3,
};

/// Raw-bit difference: unlike DispatchKeySet::operator-, also clears backend bits.
/// Needed because our included key carries the PrivateUse3 backend bit, which must not leak.
inline c10::DispatchKeySet raw_minus(c10::DispatchKeySet a, c10::DispatchKeySet b) {
  return c10::DispatchKeySet(c10::DispatchKeySet::RAW, a.raw_repr() & ~b.raw_repr());
}

inline c10::DispatchKeySet raw_union(c10::DispatchKeySet a, c10::DispatchKeySet b) {
  return c10::DispatchKeySet(c10::DispatchKeySet::RAW, a.raw_repr() | b.raw_repr());
}

}  // namespace tfz::detail
