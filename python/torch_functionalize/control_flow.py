"""Higher-order operators (torch.cond, while_loop, scan, map, associative_scan, ...) called inside
a functionalized function: see Note [Control flow: higher-order operators]. Installed once, when
the package is imported (install()); costs nothing outside a functionalize call.
"""
import functools
from typing import Any, Callable

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree

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
# Under make_fx the operator stays in the graph with functional branch subgraphs: its tensor
# arguments are synced and unwrapped, each branch becomes `functionalize(branch)` (a layer of its
# own, entered while ours is suspended), and the operator runs on the inner tensors in an inner
# call, where make_fx's mode traces each branch into a subgraph; the results are wrapped again.
# What torch's tracing of the operator refuses (a branch writing its operands, outputs aliasing
# inputs) it refuses here too, and a branch that uses tensors of the enclosing function
# (closures over its wrappers) is refused by name: lifting them needs the discovery pass dynamo
# does. capture records dispatcher ops only, so it refuses the operator by name (a graph that
# inlined the taken branch would be wrong for inputs that take the other). Rejected: routing
# operands through dynamo (it would need a fake form of our TensorImpl), and patching torch.cond
# & co. one by one (user code that imported them earlier keeps the originals; the eager entry is
# shared by all of them).

# The keys an operator can dispatch on inside a layer: our wrappers' autograd-level key, its
# backend twin (code that excludes autograd: inference_mode) and the factory key the layer
# includes (Note [Which dispatch key]), which Python's DispatchKey enum does not name.
_OUR_KEYS = [DispatchKey(k) for k in _C._dispatch_keys()]
_original_compile_and_call: "Callable[..., Any] | None" = None


def _hop_compile_and_call(fn: Callable[..., Any], args: tuple, kwargs: "dict | None" = None) -> Any:
    if _C._layer_active():
        return fn(*args, **(kwargs or {}))
    return _original_compile_and_call(fn, args, kwargs)  # type: ignore[misc]


def _kernel(op: Any, dense: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(dense)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch._C._len_torch_dispatch_stack() > 0:
            return _traced(op, args, kwargs)
        if _C._ops_are_recorded():
            raise NotImplementedError(
                f"functionalize: {op.name()} (a higher-order operator) under capture is not "
                "supported: capture records dispatcher ops, and a graph of the taken branch "
                "would be wrong for inputs that take the other. Use "
                "make_fx(functionalize(f)), which keeps the operator with functional subgraphs.")
        return dense(*args, **kwargs)

    return run


# The operators whose tracing with functional subgraphs is tested (test_control_flow.py); scan's
# tracing reads its operands' storage, and autograd through any of them builds its backward
# subgraphs with AOTAutograd's joint tracing, neither of which meets our wrappers yet.
_TRACED = {"cond", "while_loop", "map_impl", "associative_scan"}


def _traced(op: Any, args: tuple, kwargs: dict) -> Any:
    """The operator on inner tensors in an inner call, each callable functionalized: the tracer
    below records it with functional subgraphs (Note [Control flow: higher-order operators])."""
    from .api import functionalize

    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if op.name() not in _TRACED or (torch.is_grad_enabled() and
                                    any(t.requires_grad for t in tensors)):
        raise NotImplementedError(
            f"functionalize: {op.name()} (a higher-order operator) under make_fx is supported "
            f"for {', '.join(sorted(_TRACED))} on operands that do not require grad. Call the "
            "function without tracing (it then runs eagerly, autograd included), or trace it "
            "without functionalize.")
    remove = "mutations_and_views" if _C._layer_removes_views() else "mutations"

    def functional(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def branch(*xs: Any) -> Any:
            try:
                return functionalize(fn, remove=remove)(*xs)
            except RuntimeError as error:
                if "escaped" not in str(error) and "another functionalize call" not in str(error):
                    raise
                raise NotImplementedError(
                    f"functionalize: {op.name()} under make_fx: a branch uses tensors of the "
                    "enclosing functionalized function (a closure); pass them to the operator "
                    "as operands.") from error

        return branch

    def inner(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return _C._from_functional(a) if _C._is_functional(a) else a
        return functional(a) if callable(a) else a

    inner_args = pytree.tree_map(inner, args)
    inner_kwargs = pytree.tree_map(inner, kwargs)
    scope = _C._InnerCall()
    try:
        out = op(*inner_args, **inner_kwargs)
    finally:
        scope.close()
    return pytree.tree_map_only(torch.Tensor, _C._to_functional, out)


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
