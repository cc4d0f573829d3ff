"""torch.compile'd functions and modules called inside a functionalized function run as the code
they compile: see Note [API: torch.compile'd code called inside the function]. Installed by the
first functionalize or capture call after dynamo was imported (install_if_dynamo_loaded), so
importing torch_functionalize does not import dynamo.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from . import _C

# Note [API: torch.compile'd code called inside the function]
# `model = torch.compile(model)` (or an @torch.compile function) called inside f: dynamo cannot
# make fake copies of our wrappers (it stops with its internal assertion, "you set no_dispatch()
# before calling into this function"). Compilation is an optimization of the code it wraps, so
# inside a layer the compiled callable runs that code as written, on the wrappers, on this thread
# (what torch.compiler.set_stance("force_eager") does, for the layer's thread only): its
# mutations are functionalized like any others and capture records its ops. Every compiled region
# enters through dynamo's eval_frame._callback_from_stance, which picks the frame callback it
# installs; inside a layer it installs none. Code compiled around the functionalized call (a
# torch.compile of f itself, the "tfz" backend) entered its region before the layer and is not
# affected. make_fx still refuses to trace into a compiled callable, as it does without
# functionalize (dynamo checks for an FX trace first).
# Rejected: torch.compiler.set_stance around the call (process-wide: another thread's compiled
# code would run eagerly meanwhile), and a named refusal (the program has a meaning, eager's).
_original_callback_from_stance: Callable[[Any], Any] | None = None


def _callback_from_stance(callback: Any) -> Any:
    if _C._layer_active():
        return None
    return _original_callback_from_stance(callback)  # type: ignore[misc]


def install_if_dynamo_loaded() -> None:
    """Points dynamo's choice of frame callback at ours, once dynamo is imported (a compiled
    callable exists only after torch.compile imported it). A dictionary lookup per call after
    that; a torch without the hook keeps dynamo's behaviour."""
    global _original_callback_from_stance
    if _original_callback_from_stance is not None:
        return
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return
    original = getattr(eval_frame, "_callback_from_stance", None)
    if original is None or original is _callback_from_stance:
        return
    _original_callback_from_stance = original
    eval_frame._callback_from_stance = _callback_from_stance
