"""functionalize(f, remove=...): enter a layer, wrap inputs, run f, unwrap outputs, exit the layer,
then write input mutations back. Also the manual-use helpers (enable, to/from_functional, sync).
All state changes happen in C++ (torch_functionalize._C); this file only composes them.
"""
import contextlib
import functools
from typing import Any, Callable, Iterator, Literal, TypeVar

import torch
from torch.utils import _pytree as pytree

from . import _C

Remove = Literal["mutations", "mutations_and_views"]
F = TypeVar("F", bound=Callable[..., Any])

_REMOVE_VALUES = ("mutations", "mutations_and_views")


def _check_remove(remove: str) -> None:
    if remove not in _REMOVE_VALUES:
        raise ValueError(
            f'functionalize: remove must be "mutations" or "mutations_and_views"; got {remove!r}.'
        )


@contextlib.contextmanager
def enable(remove: Remove = "mutations") -> Iterator[None]:
    """Functionalize ops on wrappers made by ``to_functional`` inside this block (manual use)."""
    _check_remove(remove)
    guard = _C._Guard(remove)
    try:
        yield
    finally:
        guard.close()


def is_functional(t: object) -> bool:
    """True if ``t`` is a functional wrapper made by torch_functionalize."""
    return isinstance(t, torch.Tensor) and _C._is_functional(t)


def to_functional(t: torch.Tensor) -> torch.Tensor:
    """Wraps a plain tensor for the functionalize call (or ``enable`` block) active on this thread."""
    return _C._to_functional(t)


def from_functional(t: torch.Tensor) -> torch.Tensor:
    """Applies pending updates and returns the plain tensor inside a wrapper (plain: unchanged)."""
    return _C._from_functional(t)


def sync(t: torch.Tensor) -> None:
    """Brings a wrapper up to date with mutations made through its aliases."""
    _C._sync(t)


def _tracing() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None


def functionalize(func: F, *, remove: Remove = "mutations") -> F:
    """Returns ``func`` transformed to run without mutations (``remove="mutations"``) or without
    mutations and views (``remove="mutations_and_views"``), with the contract of
    ``torch.func.functionalize``: same outputs as plain tensors, input mutations written back."""
    if not callable(func):
        raise TypeError(f"functionalize: expected a callable, got {type(func).__name__}.")
    _check_remove(remove)

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        # Positional tensors only, the common call, skip the pytree round trip (about 13 us of
        # a 20 us call); anything else (kwargs, containers, non-tensors) goes through pytree.
        plain_args = not kwargs and all(isinstance(a, torch.Tensor) for a in args)
        if plain_args:
            originals = list(args)
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
            originals = [flat[i] for i in positions]
        guard = _C._Guard(remove)
        try:
            wrappers = _C._to_functional_list(originals)
            if plain_args:
                out = func(*wrappers)
            else:
                for i, w in zip(positions, wrappers):
                    flat[i] = w
                f_args, f_kwargs = pytree.tree_unflatten(flat, spec)
                out = func(*f_args, **f_kwargs)
            out_tensors = _tensor_sequence(out)
            leaves = out_tensors if out_tensors is not None else pytree.tree_leaves(out)
            for t in [*leaves, *wrappers]:
                if isinstance(t, torch.Tensor):
                    _C._sync(t)
        finally:
            guard.close()
        # The epilogue runs in the caller's dispatch state, so tracers record it last. Outputs
        # are unwrapped after it, so that with views kept they can alias the updated inputs
        # (Note [Inputs: outputs that alias inputs]); never under a tracer (graph outputs do not
        # alias graph inputs).
        _C._propagate_input_mutations(originals, wrappers)
        alias = remove == "mutations" and not _tracing()

        def unwrap(t: torch.Tensor) -> torch.Tensor:
            return _C._unwrap_output(t, originals, wrappers, alias)

        if isinstance(out, torch.Tensor):
            return unwrap(out)
        if out_tensors is not None:
            return type(out)(unwrap(t) for t in out)
        return pytree.tree_map_only(torch.Tensor, unwrap, out)

    return wrapped  # type: ignore[return-value]


def _tensor_sequence(out: object) -> Any:
    """`out` as its own list of tensor leaves when it is a tensor or a plain tuple / list of
    tensors (what pytree would return, without its cost); None for any other structure."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in out):
        return out
    return None
