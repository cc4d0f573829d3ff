"""Higher-order operators (torch.cond, while_loop, scan, map, associative_scan, ...) called inside
a functionalized function: see Note [Control flow: higher-order operators]. Installed once, when
the package is imported (install()); costs nothing outside a functionalize call.
"""
import functools
from typing import Any, Callable

import torch
from torch._C import DispatchKey

from . import _C

# Note [Control flow: higher-order operators]
# torch.cond(pred, true_fn, false_fn, operands) with a tensor predicate (and while_loop, scan,
# map, associative_scan) does not run its branches itself: it hands the call to torch.compile,
# whose dynamo speculates the branches on fake copies of the operands. Dynamo cannot make fake
# copies of our wrappers, so inside functionalize every such call failed with dynamo's internal
# assertion. Two pieces make them run:
#  1. While a layer runs user code on this thread, torch's eager entry
#     (torch._higher_order_ops.utils._hop_compile_and_call, the one place every operator's
#     Python function goes through) calls the operator directly instead of compiling it.
#  2. The operator then dispatches on our wrappers' key, where each operator that has a dense
#     (CompositeExplicitAutograd) kernel gets ours: with nothing recording, torch's own dense
#     kernel runs on the wrappers, in the layer, so the branch or loop body is ordinary user code
#     and every mutation in it (of intermediates, of closure tensors, of the operands themselves,
#     which torch refuses, pytorch/pytorch#147210) is functionalized like any other, and autograd
#     records the ops the branch ran, as eager's does.
# Under a tracer (make_fx, capture) the operator must stay in the graph with functional branch
# subgraphs; that is refused by name here (a graph that inlined the taken branch would be wrong
# for inputs that take the other). Rejected: routing operands through dynamo (it would need a fake
# form of our TensorImpl), and patching torch.cond & co. one by one (user code that imported them
# earlier keeps the originals; the eager entry is shared by all of them).

# The keys an operator can dispatch on inside a layer: our wrappers' autograd-level key, its
# backend twin (code that excludes autograd: inference_mode) and the factory key the layer
# includes (Note [Which dispatch key]), which Python's DispatchKey enum does not name.
_OUR_KEYS = [DispatchKey(k) for k in _C._dispatch_keys()]
_original_compile_and_call: "Callable[..., Any] | None" = None


def _records() -> bool:
    """Whether what runs inside the layer now ends up in a graph: a tracer's dispatch mode on the
    stack, or a capture recording."""
    return torch._C._len_torch_dispatch_stack() > 0 or _C._ops_are_recorded()


def _hop_compile_and_call(fn: Callable[..., Any], args: tuple, kwargs: "dict | None" = None) -> Any:
    if _C._layer_active():
        return fn(*args, **(kwargs or {}))
    return _original_compile_and_call(fn, args, kwargs)  # type: ignore[misc]


def _kernel(op: Any, dense: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(dense)
    def run(*args: Any, **kwargs: Any) -> Any:
        if _records():
            raise NotImplementedError(
                f"functionalize: {op.name()} (a higher-order operator) under a tracer "
                "(make_fx or capture of the functionalized function) is not supported yet: its "
                "branches would have to become functional subgraphs. Call the function without "
                "tracing, or trace it without functionalize.")
        return dense(*args, **kwargs)

    return run


def install() -> None:
    """Points torch's eager entry for higher-order operators at ours and registers our kernel on
    every operator that has a dense kernel. Idempotent."""
    global _original_compile_and_call
    import torch._higher_order_ops  # noqa: F401  (registers the operators)
    from torch._higher_order_ops import utils
    from torch._ops import _higher_order_ops

    if _original_compile_and_call is not None:
        return
    # A torch without the shared eager entry compiles each operator in its own function: there
    # the operators still fail in dynamo inside functionalize (docs/compat.md).
    original = getattr(utils, "_hop_compile_and_call", None)
    if original is not None:
        _original_compile_and_call = original
        utils._hop_compile_and_call = _hop_compile_and_call
    for op in list(_higher_order_ops.values()):
        dense = op.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        if dense is None:
            continue
        for key in _OUR_KEYS:
            if key not in op.py_kernels:
                op.py_impl(key)(_kernel(op, dense))
