"""TorchScript functions and methods called inside a functionalized function drop the plan they
optimized before it, once per call of the function, so no fusion group made before it sees a
wrapper. See Note [Layer: TorchScript fusion groups read data pointers]."""
from __future__ import annotations

import threading
from typing import Any

import torch

from . import _C

_torch_function_call = torch._C.ScriptFunction.__call__
_torch_method_call = torch._C.ScriptMethod.__call__


class _Flushed(threading.local):
    """The layer (by id) whose TorchScript callables were flushed, and which."""

    def __init__(self) -> None:
        self.layer = 0
        self.ids: set[int] = set()


_flushed = _Flushed()


def _drop_plan_made_before(script: Any) -> None:
    layer = _C._layer_id()
    if layer == 0:
        return
    if _flushed.layer != layer:
        _flushed.layer, _flushed.ids = layer, set()
    if id(script) not in _flushed.ids:
        # Inside the layer TorchScript does not optimize, so the plan it makes next is the
        # unoptimized one, whose every op dispatches; it stays until the layer ends.
        script._debug_flush_compilation_cache()
        _flushed.ids.add(id(script))


def _function_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    _drop_plan_made_before(self)
    return _torch_function_call(self, *args, **kwargs)


def _method_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    _drop_plan_made_before(self)
    return _torch_method_call(self, *args, **kwargs)


_installed = False


def install() -> None:
    """Replaces the __call__ of TorchScript functions and methods by ours (torch's, after the
    flush inside a layer). Called on the first functionalized call, not at import: the check
    costs about 0.6 us on every TorchScript call of the process (4.6 us instead of 3.9 us for a
    one-op function, torch 2.13 CPU), which a process that never functionalizes should not pay."""
    global _installed
    if not _installed:
        torch._C.ScriptFunction.__call__ = _function_call  # type: ignore[method-assign]
        torch._C.ScriptMethod.__call__ = _method_call  # type: ignore[method-assign]
        _installed = True
