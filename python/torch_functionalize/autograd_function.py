"""torch.autograd.Function subclasses (custom forward/backward) called inside a functionalized
function: see Note [Autograd: custom Functions]. Installed once, when the package is imported
(install()); costs one check per Function call outside functionalize."""
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import _C

# Note [Autograd: custom Functions]
# Our autograd runs on the wrappers' inner values, below our key
# (Note [Wrapper: autograd mirrored]). A custom Function's apply builds its backward node at the level it is called on:
# called on wrappers, it attached the node to the wrapper outputs only, the ops after it ran on
# inner values that had no history, and the gradients of everything before it were silently
# None (or missing from .grad). So inside a layer, a Function called with the layer's wrappers
# runs one level down, as the engine runs built-in ops: its arguments are unwrapped to their
# (synced) values, which carry their history, apply runs in an inner call, and its outputs,
# whose history is now the Function's node, are wrapped again. Its backward then runs as any
# backward formula does: on wrapper gradients inside f (functionalized), on plain ones after f
# returns, with the values it saved. Its forward's own ops run on those values, as the kernels
# of built-in ops do: not functionalized (an in-place op or a view inside a Function's forward
# is the graph's as written), and tensors of f it closes over instead of taking them as
# arguments are refused by name (torch.utils.checkpoint(use_reentrant=True) of a closure over
# parameters; use_reentrant=False works). Rejected: attaching the Function's node to the inner values
# after a run on wrappers (its saved tensors would be wrappers, which a backward after f returns
# cannot read), and functionalizing the forward in a layer of its own (the same problem for the
# tensors it saves).
_original_apply: Any = None


def _apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    if _C._layer_active():
        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(t, torch.Tensor) and _C._is_layer_wrapper(t) for t in leaves):
            return _apply_on_values(cls, args, kwargs)
    return _original_apply(cls, *args, **kwargs)


def _apply_on_values(cls: Any, args: tuple, kwargs: dict) -> Any:
    def value(a: Any) -> Any:
        return _C._from_functional(a) if isinstance(a, torch.Tensor) and _C._is_layer_wrapper(
            a) else a

    inner_args, inner_kwargs = pytree.tree_map(value, (args, kwargs))
    scope = _C._InnerCall()
    try:
        out = _original_apply(cls, *inner_args, **inner_kwargs)
    except RuntimeError as error:
        if "reached an op the engine runs on plain tensors" not in str(error):
            raise
        raise NotImplementedError(
            f"functionalize: the autograd.Function {cls.__name__} uses tensors of the "
            "functionalized function that are not its arguments (a closure, e.g. a module's "
            "parameters passed to functional_call): a custom Function runs on the values "
            "(Note [Autograd: custom Functions]). Pass them as arguments; for "
            "torch.utils.checkpoint, use use_reentrant=False.") from error
    finally:
        scope.close()
    return pytree.tree_map_only(torch.Tensor, _C._to_functional, out)


def install() -> None:
    """Routes torch.autograd.Function.apply through ours. Idempotent."""
    global _original_apply
    if _original_apply is not None:
        return
    _original_apply = torch.autograd.Function.__dict__["apply"].__func__
    torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[assignment]
