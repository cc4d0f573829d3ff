"""FX helpers shared by graph.py, dynamo.py, capture.py and api.py: the example values recorded
on nodes, symbolic numbers made concrete, and grad mode switched off around an epilogue. No
graph transformation of its own lives here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

if TYPE_CHECKING:
    import torch.fx

# The meta keys that hold a node's example value: make_fx and torch.export write "val", dynamo
# writes "example_value".
VALUE_KEYS = ("val", "example_value")

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def placeholders(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The graph's placeholder nodes, in order."""
    return [n for n in graph.nodes if n.op == "placeholder"]


def has_example_value(node: torch.fx.Node, keys: Sequence[str] = VALUE_KEYS) -> bool:
    """Whether ``node``'s meta holds a value under one of ``keys``."""
    return any(k in node.meta for k in keys)


def example_value(node: torch.fx.Node, keys: Sequence[str] = VALUE_KEYS) -> Any:
    """The value recorded on ``node`` under the first of ``keys`` its meta has; None if none."""
    for key in keys:
        if key in node.meta:
            return node.meta[key]
    return None


def concrete(value: Any, bindings: Mapping[Any, Any] | None = None) -> Any:
    """A symbolic number (SymInt, SymFloat, SymBool) as a Python number: its expression evaluated
    with ``bindings`` (symbol -> value, from ShapeEnv.bind_symbols) when given, else its hint (the
    value it was traced with); any other value as it is."""
    if not isinstance(value, _SYMBOLIC):
        return value
    python_type = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
    if bindings is not None:
        return python_type(value.node.expr.xreplace(bindings))
    hint = value.node.hint
    if hint is None:  # only functionalize_graph reads hints, of the values its inputs recorded
        raise ValueError(
            f"functionalize_graph: the recorded input value {value} has no concrete hint "
            "(data-dependent size); pass example inputs, e.g. functionalize_graph(gm, *inputs)."
        )
    return python_type(hint)


def sizes_and_strides(t: torch.Tensor,
                      bindings: Mapping[Any, Any] | None = None) -> tuple[list[int], list[int]]:
    """``t``'s sizes and strides, symbolic ones made concrete (see ``concrete``)."""
    return ([concrete(s, bindings) for s in t.size()],
            [concrete(s, bindings) for s in t.stride()])


def run_without_grad(graph: torch.fx.Graph, first: torch.fx.Node, last: torch.fx.Node) -> None:
    """Makes ``graph`` run the nodes from ``first`` to ``last`` with grad mode off, then set the
    mode it ran in before them (read just before ``first``), as the functionalized call runs its
    epilogue (Note [API: epilogue writes of leaves in graphs])."""
    with graph.inserting_before(first):
        mode = graph.call_function(torch.is_grad_enabled, ())
        graph.call_function(torch._C._set_grad_enabled, (False,))
    with graph.inserting_after(last):
        graph.call_function(torch._C._set_grad_enabled, (mode,))
