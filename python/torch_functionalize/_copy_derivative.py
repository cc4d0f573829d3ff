"""aten.copy with eager's derivative, for graphs that run under autograd: the graph the tfz
torch.compile backend runs itself, and a captured graph called with inputs that require grad.
See Note [Graphs: copy's derivative when a graph runs under autograd].
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, cast

import torch
import torch.fx


# Note [Graphs: copy's derivative when a graph runs under autograd]
# A write that replaces values (h[:, 0] = h[:, 1] * 2, h.copy_(y)) is aten.copy in the
# functional graph, and torch gives aten.copy no derivative, so a .backward() through such a
# graph raised "derivative for aten::copy is not implemented" (eager's copy_ records
# CopyBackwards, and eager functionalize gives its result that node, as
# Note [Kernel: copy's derivative] says). Where we run the graph ourselves under autograd (the
# tfz torch.compile backend without a compiler of the user's; a graph of capture called in grad
# mode with an input that requires grad), a twin of the graph runs whose aten.copy nodes call a
# function with eager's derivative: src's gradient summed to src's shape in src's dtype and
# device (its real part for a real src), none for dst, whose values the copy replaces. The graph
# itself keeps aten.copy: a
# compiler of the user's and the reinplace passes read it, and AOTAutograd (what torch's
# compilers run) traces its own joint graph and needs no derivative of it. Rejected: a composite
# of differentiable ops in the graph (expand, _to_copy and a restride: the values are the same,
# but graphs and the reinplace passes read aten.copy), and registering an autograd kernel for
# aten::copy (a process-wide change to torch).
class _CopyWithDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dst: torch.Tensor, src: torch.Tensor,  # type: ignore[override]
                non_blocking: bool = False) -> torch.Tensor:
        ctx.src = (src.shape, src.dtype, src.device, src.is_complex())
        return torch.ops.aten.copy.default(dst, src, non_blocking)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None]:  # type: ignore[override]
        shape, dtype, device, is_complex = ctx.src
        if grad.is_complex() and not is_complex:
            grad = grad.real
        if grad.shape != shape:
            grad = grad.sum_to_size(shape)
        return None, grad.to(dtype=dtype, device=device), None


def copy_with_derivative(dst: torch.Tensor, src: torch.Tensor,
                         non_blocking: bool = False) -> torch.Tensor:
    if not torch.is_grad_enabled() or not src.requires_grad:
        return torch.ops.aten.copy.default(dst, src, non_blocking)
    return cast(torch.Tensor, _CopyWithDerivative.apply(dst, src, non_blocking))


def has_copy(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and n.target is torch.ops.aten.copy.default
               for n in gm.graph.nodes)


def with_copy_derivative(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm`, or where it holds aten.copy a twin whose aten.copy nodes call copy_with_derivative
    (same attributes, same code generator)."""
    if not has_copy(gm):
        return gm
    with warnings.catch_warnings():  # torch's own deprecation notice for copying a pytree spec
        warnings.simplefilter("ignore", FutureWarning)
        graph = copy.deepcopy(gm.graph)
    runnable = torch.fx.GraphModule(gm, graph)
    for node in runnable.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy.default:
            node.target = copy_with_derivative
    runnable.recompile()
    return runnable
