"""saved_tensors_hooks pushed inside f while a graph records it: what the pack and unpack hooks
return is noted for the backward's lookup of the tensors autograd hands its formulas
(Note [Autograd: saved outputs under a tracer]). Installed when the package is imported
(install())."""
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from . import _C

_original_push = torch._C._autograd._push_saved_tensors_default_hooks


def _noting(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def noted(value: Any) -> Any:
        result = hook(value)
        if _C._ops_are_recorded():
            for x in pytree.tree_leaves(result):
                if isinstance(x, torch.Tensor):
                    _C._note_traced_plain_output(x)
        return result

    return noted


def _push(pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> None:
    # Only pairs pushed inside f, where a graph may record them: hooks pushed elsewhere keep
    # their identity (AOTAutograd inlines hooks that are GraphModules, which it checks by type).
    if _C._layer_active():
        pack, unpack = _noting(pack), _noting(unpack)
    _original_push(pack, unpack)


def install() -> None:
    """Routes the push of every saved_tensors_hooks pair (save_on_cpu, checkpoint's, a user's)
    through _push; outside a functionalized call it only forwards."""
    torch._C._autograd._push_saved_tensors_default_hooks = _push
