"""Tensor methods that torch implements outside the dispatcher and that cannot work on our
wrappers as they are: replaced, for wrappers only, by their dispatcher-level equivalents.
See Note [API: Tensor.new_tensor on wrappers] (Tensor.new too),
Note [API: Tensor.tolist on wrappers], Note [API: Tensor.numpy on wrappers],
Note [API: pickling wrappers] and Note [Autograd: hooks on leaf wrappers]."""
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


# The legacy constructor `t.new(...)` fails on wrappers for the same reason (its backend comes
# from t's dispatch keys); SparseAdam and sparse Adagrad build their updates with grad.new(indices,
# values, size). For wrappers it is spelled with the factories its forms stand for, with t's dtype
# and device (and t's layout: a sparse t makes sparse tensors): nothing, sizes or a torch.Size
# give an uninitialized tensor (torch.empty), other data torch.tensor(data), a tensor of t's
# dtype and device an alias of it, and for a sparse t, indices and values (and a size)
# torch.sparse_coo_tensor. Any other arguments (a storage) get a TypeError naming the forms.
_torch_new = torch.Tensor.new


def _is_size(args: tuple[Any, ...]) -> bool:
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return True
    return all(isinstance(a, int) and not isinstance(a, bool) for a in args)


def _new(self: torch.Tensor, *args: Any, device: Any = None) -> torch.Tensor:
    if not _C._is_functional(self):
        return _torch_new(self, *args, **({} if device is None else {"device": device}))
    options = {"dtype": self.dtype, "device": self.device if device is None else device}
    sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args or (0,)
    if self.is_sparse:
        if _is_size(args):
            return torch.empty(sizes, layout=torch.sparse_coo, **options)
        if len(args) in (2, 3) and all(isinstance(a, torch.Tensor) for a in args[:2]):
            return torch.sparse_coo_tensor(*args, **options)
    elif _is_size(args):
        return torch.empty(sizes, **options)
    elif len(args) == 1 and isinstance(args[0], torch.Tensor):
        other = args[0]
        if other.dtype != self.dtype or other.device != torch.device(options["device"]):
            raise TypeError(f"new(): expected a tensor of dtype {self.dtype} on "
                            f"{options['device']}, got {other.dtype} on {other.device}")
        return torch.ops.aten.alias.default(other)
    elif len(args) == 1 and not isinstance(args[0], (torch.Tensor, torch.TypedStorage,
                                                     torch.UntypedStorage)):
        return torch.tensor(args[0], **options)
    raise TypeError(
        f"functionalize: Tensor.new{tuple(type(a).__name__ for a in args)} on a "
        f"{'sparse' if self.is_sparse else 'strided'} tensor inside the function: torch's forms "
        "are new(), new(*sizes), new(data), new(tensor) and, for sparse tensors, new(indices, "
        "values[, size]); storages are not supported. Use torch.empty, torch.tensor or "
        "torch.sparse_coo_tensor.")


_new.__doc__ = _torch_new.__doc__


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


# Note [API: pickling wrappers]
# torch.save (and pickle) of a tensor reduces it to its storage, read by data pointer, which a
# wrapper does not have: a checkpoint saved inside the training function failed with "Attempted
# to access the data pointer on an invalid python storage". For a wrapper the reduction is its
# value's, synced: the same values, geometry and requires_grad, and with views kept a view's
# value lies in its base's storage, so tensors saved together that alias each other load as
# aliases, as eager's (without views each loads with memory of its own). Inside a traced or
# captured function the bytes written are a value no graph records: refused by name, as
# Tensor.numpy() is (Note [API: Tensor.numpy on wrappers]).
_torch_reduce_ex = torch.Tensor.__reduce_ex__


def _reduce_ex(self: torch.Tensor, proto: Any) -> Any:
    if not _C._is_functional(self):
        return _torch_reduce_ex(self, proto)
    if _C._ops_are_recorded() or torch._C._len_torch_dispatch_stack() > 0:
        raise NotImplementedError(
            "functionalize: pickling a tensor (torch.save) inside a traced or captured function "
            "writes values no graph records. Save after the call, or return the tensors.")
    return _torch_reduce_ex(_C._from_functional(self), proto)


# copy.deepcopy of a tensor copies its storage (Tensor.__deepcopy__ reads the typed storage),
# which a wrapper does not have: it failed with "Attempted to call copy_() on an invalid python
# storage" (a training loop's `best = copy.deepcopy(params)`). For a wrapper the copy is a clone
# under no_grad, which is the path torch's method takes for tensors without storage (sparse,
# meta, XLA): the same values, dtype, strides where the value is dense, requires_grad, .grad and
# Python attributes, deep-copied through the memo. Non-leaves get torch's own error first.
_torch_deepcopy = torch.Tensor.__deepcopy__

# Note [API: deep copies of plain tensors inside the function]
# copy.deepcopy of a tensor from outside the function (AveragedModel(model) inside a training
# step deep-copies the model's buffers, which swa_utils.update_bn then updates through a
# training-mode batch norm of the function's inputs) is a tensor the function made: it is the
# clone of the plain tensor (a constant in a graph), wrapped like a factory's result, so later
# writes of functional values into it are functionalized as eager runs them. Copies of tensors
# that shared memory would each get memory of their own: refused by name, as are writes into
# plain copies. Sparse, quantized and subclass tensors keep torch's copy (plain).
# Rejected: torch's own copy (its storage copy and set_), which left a plain tensor that later
# writes of functional values refused, and which capture recorded as a set_ onto a storage
# constant that no FX graph can print; wrapping every all-plain op's result inside the function
# (Note [Kernel: factories]).


def _deepcopy(self: torch.Tensor, memo: dict[int, Any]) -> torch.Tensor:
    plain = not _C._is_functional(self)
    if plain and not _C._layer_active():
        return _torch_deepcopy(self, memo)
    if plain and (type(self) is not torch.Tensor or self.layout != torch.strided
                  or self.is_quantized):
        scope = _C._InnerCall()  # torch's copy below our key (its new_empty + set_ stay plain)
        try:
            return _torch_deepcopy(self, memo)
        finally:
            scope.close()
    if not self.is_leaf or type(self) is not torch.Tensor:
        return _torch_deepcopy(self, memo)  # torch's error, or a subclass's own copy
    if id(self) in memo:
        return memo[id(self)]
    if plain:  # See Note [API: deep copies of plain tensors inside the function].
        copied_storages = memo.setdefault("tfz", {})
        storage = self.untyped_storage()._cdata
        if storage in copied_storages:
            raise NotImplementedError(
                "functionalize: copy.deepcopy inside the function of two tensors from outside it "
                "that share memory (a module whose buffers are views of one tensor): the copies "
                "would not share it. Deep-copy the module before the call and pass its tensors "
                "in.")
        copied_storages[storage] = True
    import copy

    with torch.no_grad():
        new = self.clone(memory_format=torch.preserve_format)
        if plain:
            new = _C._to_functional(new)
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
    new.__dict__ = copy.deepcopy(self.__dict__, memo)
    memo[id(self)] = new
    return new


_deepcopy.__doc__ = _torch_deepcopy.__doc__

# A Parameter's copy is a Parameter of its data's clone (torch's Parameter.__deepcopy__); of a
# plain Parameter inside the function, that clone is wrapped as above.
_torch_parameter_deepcopy = torch.nn.Parameter.__deepcopy__


def _parameter_deepcopy(self: torch.nn.Parameter, memo: dict[int, Any]) -> torch.nn.Parameter:
    if (type(self) is not torch.nn.Parameter or _C._is_functional(self)
            or not _C._layer_active() or self.layout != torch.strided):
        return _torch_parameter_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        data = _C._to_functional(self.data.clone(memory_format=torch.preserve_format))
    result = torch.nn.Parameter(data, self.requires_grad)
    memo[id(self)] = result
    return result


_parameter_deepcopy.__doc__ = _torch_parameter_deepcopy.__doc__


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
    torch.Tensor.new = _new  # type: ignore[method-assign, assignment]
    torch.Tensor.__deepcopy__ = _deepcopy  # type: ignore[method-assign]
    torch.nn.Parameter.__deepcopy__ = _parameter_deepcopy  # type: ignore[method-assign]
    torch.Tensor.__reduce_ex__ = _reduce_ex  # type: ignore[method-assign, assignment]
    torch.Tensor.tolist = _tolist  # type: ignore[method-assign, assignment]
    torch.Tensor.numpy = _numpy  # type: ignore[method-assign, assignment]
    torch.Tensor.__dlpack__ = _dlpack  # type: ignore[method-assign]
    torch.Tensor.register_hook = _register_hook  # type: ignore[method-assign]
    torch.Tensor.register_post_accumulate_grad_hook = (  # type: ignore[method-assign]
        _register_post_accumulate_grad_hook)
    torch.utils.dlpack.to_dlpack = _to_dlpack  # type: ignore[assignment]
