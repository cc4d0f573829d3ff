"""The pytree side of every call that runs a function on other tensors (functionalize, capture):
flatten the arguments once, find their tensors, call the function on the arguments rebuilt
around other tensors, flatten what it returns. Nothing here knows about wrappers.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch
from torch.utils import _pytree as pytree


class Arguments(Protocol):
    """A call's ``(args, kwargs)``, flattened: its tensors, and the arguments rebuilt around
    other tensors in their places."""

    def tensors(self) -> list[torch.Tensor]: ...

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> Any: ...


class Flat:
    """A pytree flattened once: its leaves, its structure (``spec``) and the positions of the
    leaves that are tensors. Flattening ``(args, kwargs)`` gives the ``Arguments`` of a call."""

    __slots__ = ("leaves", "spec", "positions")

    def __init__(self, tree: Any) -> None:
        self.leaves, self.spec = pytree.tree_flatten(tree)
        self.positions = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def tensors(self) -> list[torch.Tensor]:
        """The tensor leaves, in order."""
        return [self.leaves[i] for i in self.positions]

    def constants(self) -> dict[int, Any]:
        """The leaves that are not tensors, by position."""
        tensor_positions = set(self.positions)
        return {i: leaf for i, leaf in enumerate(self.leaves) if i not in tensor_positions}

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> Any:
        """The tree with ``tensors`` in place of its tensor leaves, in order."""
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self.spec)


def call_with(func: Callable[..., Any], arguments: Arguments,
              tensors: Sequence[torch.Tensor]) -> Any:
    """``func`` called on ``arguments`` with ``tensors`` in place of their tensors."""
    f_args, f_kwargs = arguments.rebuild(tensors)
    return func(*f_args, **f_kwargs)


def tensor_leaves(out: object) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], Any]]:
    """The tensors in ``out`` and a function that rebuilds ``out`` with other tensors in their
    places. A tensor and a plain tuple / list of tensors skip pytree (what it would return,
    without its cost)."""
    if isinstance(out, torch.Tensor):
        return [out], lambda ts: ts[0]
    if (type(out) is tuple or type(out) is list) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out), type(out)
    flat = Flat(out)
    return flat.tensors(), flat.rebuild
