"""Lazy modules (nn.LazyLinear, the LazyConv and LazyBatchNorm families, a user's
LazyModuleMixin) whose first call, which initializes their parameters, happens inside f: see
Note [API: lazy modules initialized inside the function]. Installed when the package is imported
(install())."""
import contextlib
import threading
from typing import Any, Iterator

import torch
import torch.nn.modules.lazy as lazy
from torch.nn.parameter import UninitializedTensorMixin

from . import _C, rng_state

# Note [API: lazy modules initialized inside the function]
# A lazy module's first call runs a forward pre-hook (LazyModuleMixin._infer_parameters) that
# materializes its UninitializedParameters and buffers (`p.data = torch.empty(shape)`, then the
# module's reset_parameters fills them in place) and turns it into its eager class. Inside f that
# empty made a wrapper, which set_data refuses on a plain parameter ("incompatible tensor type"),
# so the first call failed, eagerly too; traced, the fills would also have been graph ops
# rewriting the module's parameters on every replay, where eager initializes them once. Rule: the
# hook runs in torch's own untraced region (Note [Layer: torch's untraced regions]): ops on plain
# tensors run as if no layer were active, so the parameters are initialized once, for real, with
# eager's draws from the caller's generator, and f then reads them as the tensors it captures
# (graph constants, as a module built before the trace). A lazy module f makes is f's own: its
# initialization stays f's ops, each call's, as eager's. A module created before this package
# was imported holds torch's hook: its materialize runs untraced too, which serves an eager call;
# under a tracer its fills would be graph ops, and it is refused by name. Rejected: taking the
# parameters as graph inputs (the module keeps them after the call, as eager's does, and a
# replay is eager's second call, which initializes nothing).
_local = threading.local()
_original_infer = lazy.LazyModuleMixin._infer_parameters
_original_materialize = UninitializedTensorMixin.materialize


@contextlib.contextmanager
def _untraced() -> Iterator[None]:
    """torch's untraced region: what functorch's front key, excluded, tells the layer."""
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode)
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        with torch._C._ExcludeDispatchKeyGuard(keys):
            yield
    finally:
        _local.depth = depth


def _made_outside(module: Any) -> bool:
    """Whether the module's uninitialized tensors are plain (made before f ran), not f's own."""
    return not any(_C._is_functional(t) for t in (*module.parameters(), *module.buffers())
                   if isinstance(t, UninitializedTensorMixin))


def _infer_parameters(self: Any, module: Any, args: Any, kwargs: Any = None) -> Any:
    if not _C._layer_active() or not _made_outside(module):
        return _original_infer(self, module, args, kwargs)
    with _untraced():
        return _original_infer(self, module, args, kwargs)


def _materialize(self: Any, shape: Any, device: Any = None, dtype: Any = None) -> None:
    if (not _C._layer_active() or getattr(_local, "depth", 0) > 0 or
            _C._is_functional(self)):  # made inside f: f's own ops initialize it, as eager's
        return _original_materialize(self, shape, device, dtype)
    if rng_state.tracer() is not None or _C._ops_are_recorded():
        raise NotImplementedError(
            f"functionalize: a lazy module's {type(self).__name__} is initialized by its first "
            "call inside a traced or captured function, and the module was created before "
            "torch_functionalize was imported, so its initialization would be recorded as graph "
            "ops that rewrite its parameters on every replay. Call the module once before "
            "tracing, or import torch_functionalize before creating it "
            "(Note [API: lazy modules initialized inside the function]).")
    with _untraced():
        return _original_materialize(self, shape, device, dtype)


def install() -> None:
    """Lazy modules created from now on initialize untraced; materialize guards older ones."""
    lazy.LazyModuleMixin._infer_parameters = _infer_parameters  # type: ignore[method-assign]
    UninitializedTensorMixin.materialize = _materialize  # type: ignore[method-assign]
