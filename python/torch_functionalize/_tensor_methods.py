"""Tensor methods that torch implements outside the dispatcher and that cannot work on our
wrappers as they are: replaced, for wrappers only, by their dispatcher-level equivalents.
See Note [API: Tensor.new_tensor on wrappers], Note [API: Tensor.tolist on wrappers],
Note [API: Tensor.numpy on wrappers] and Note [Autograd: hooks on leaf wrappers]."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.utils.dlpack

from . import _C

if TYPE_CHECKING:
    import numpy
    from torch.utils.hooks import RemovableHandle

# Note [API: Tensor.new_tensor on wrappers]
# `t.new_tensor(data)` is not an ATen op: torch's Python binding derives the new tensor's backend
# from t's dispatch keys (legacyExtractDispatchKey). A wrapper carries our PrivateUse3 keys and
# not its value's CPU/CUDA keys (Note [Which dispatch key]), so torch's method fails with "DispatchKey
# PrivateUse3 doesn't correspond to a device". For wrappers the
# method is what its documentation says it is, torch.tensor(data) with t's dtype and device
# (torch.tensor then reaches our kernel through lift_fresh, like any constant in the function);
# every other tensor takes torch's own method. Rejected: giving wrappers their value's backend
# keys (CPU kernels would then see wrappers whenever our keys are excluded); a TorchFunctionMode
# (about 3 us on every torch call inside the function).
_torch_new_tensor = torch.Tensor.new_tensor


def _new_tensor(self: torch.Tensor, data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    if args or not _C._is_functional(self):  # positional extras: torch's own error
        return _torch_new_tensor(self, data, *args, **kwargs)
    kwargs.setdefault("dtype", self.dtype)
    kwargs.setdefault("device", self.device)
    if kwargs["dtype"] is None:
        kwargs["dtype"] = self.dtype
    if kwargs["device"] is None:
        kwargs["device"] = self.device
    return torch.tensor(data, **kwargs)


_new_tensor.__doc__ = _torch_new_tensor.__doc__


# Note [API: Tensor.tolist on wrappers]
# `t.tolist()` reads t's memory directly in torch's binding, and a wrapper has none of its own, so
# it raised "tolist() shouldn't be called on a tensor with unallocated storage". For wrappers it
# is item() of each element (unbind along the first dimension, recursively), so every value read
# goes through the dispatcher: a capture guards each one (Note [Capture: guards on values read]).
# Rejected: reading the inner value directly (no tracer or capture would see the read).
_torch_tolist = torch.Tensor.tolist


def _tolist(self: torch.Tensor) -> Any:
    if not _C._is_functional(self):
        return _torch_tolist(self)
    if self.dim() == 0:
        return self.item()
    return [_tolist(t) for t in self.unbind(0)]


_tolist.__doc__ = _torch_tolist.__doc__


# Note [API: Tensor.numpy on wrappers]
# `t.numpy()` (and np.asarray(t)) hands out t's memory by its data pointer, which a wrapper does
# not have: the array read whatever lay at that address, silently wrong numbers. For a wrapper it
# is a read-only copy of its value, with eager's checks (CPU, no grad): values are eager's, and
# eager's aliasing (a write through the array changing the tensor) fails loudly instead of being
# lost. Under a tracer or a capture the read would bypass the graph (nothing could guard it), so
# it is refused by name there. Rejected: a writable copy (writes through it would be lost
# silently).
_torch_numpy = torch.Tensor.numpy


def _numpy(self: torch.Tensor, *, force: bool = False) -> numpy.ndarray:
    if not _C._is_functional(self):
        return _torch_numpy(self, force=force)
    if _C._ops_are_recorded() or torch._C._len_torch_dispatch_stack() > 0:
        raise NotImplementedError(
            "functionalize: Tensor.numpy() inside a traced or captured function reads memory no "
            "graph records. Read values with .tolist() or .item() (guarded in captures), or "
            "convert after the call.")
    value = _C._from_functional(self)
    if force:
        value = value.detach().cpu().resolve_conj().resolve_neg()
    array = _torch_numpy(value, force=force).copy()
    array.setflags(write=False)
    return array


_numpy.__doc__ = _torch_numpy.__doc__


# DLPack hands out the data pointer too, and a consumer of a wrapper's crashed the process when it
# read it: refused by name for wrappers (a copy would break DLPack's promise of shared memory).
_torch_dlpack = torch.Tensor.__dlpack__
_torch_to_dlpack = torch.utils.dlpack.to_dlpack


def _refuse_dlpack(t: torch.Tensor) -> None:
    if isinstance(t, torch.Tensor) and _C._is_functional(t):
        raise NotImplementedError(
            "functionalize: DLPack export of a tensor inside the functionalized function: it has "
            "no memory of its own to share. Return the tensor and export it after the call.")


def _dlpack(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    _refuse_dlpack(self)
    return _torch_dlpack(self, *args, **kwargs)


def _to_dlpack(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    _refuse_dlpack(tensor)
    return _torch_to_dlpack(tensor, *args, **kwargs)


_dlpack.__doc__ = _torch_dlpack.__doc__
_to_dlpack.__doc__ = _torch_to_dlpack.__doc__


# See Note [Autograd: hooks on leaf wrappers].
_torch_register_hook = torch.Tensor.register_hook
_torch_register_post_accumulate_grad_hook = torch.Tensor.register_post_accumulate_grad_hook


def _register_hook(self: torch.Tensor, hook: Callable[..., Any]) -> RemovableHandle:
    leaf = _C._mirrored_leaf(self) if _C._is_functional(self) else None
    return _torch_register_hook(self if leaf is None else leaf, hook)


def _register_post_accumulate_grad_hook(self: torch.Tensor,
                                        hook: Callable[..., Any]) -> RemovableHandle:
    leaf = _C._mirrored_leaf(self) if _C._is_functional(self) else None
    if leaf is None:
        return _torch_register_post_accumulate_grad_hook(self, hook)
    wrapper = self
    return _torch_register_post_accumulate_grad_hook(leaf, lambda _leaf: hook(wrapper))


_register_hook.__doc__ = _torch_register_hook.__doc__
_register_post_accumulate_grad_hook.__doc__ = _torch_register_post_accumulate_grad_hook.__doc__


def install() -> None:
    """Replaces torch's methods by ours (which defer to torch's for tensors that are not ours)."""
    torch.Tensor.new_tensor = _new_tensor  # type: ignore[method-assign, assignment]
    torch.Tensor.tolist = _tolist  # type: ignore[method-assign, assignment]
    torch.Tensor.numpy = _numpy  # type: ignore[method-assign, assignment]
    torch.Tensor.__dlpack__ = _dlpack  # type: ignore[method-assign]
    torch.Tensor.register_hook = _register_hook  # type: ignore[method-assign]
    torch.Tensor.register_post_accumulate_grad_hook = (  # type: ignore[method-assign]
        _register_post_accumulate_grad_hook)
    torch.utils.dlpack.to_dlpack = _to_dlpack  # type: ignore[assignment]
