"""Parameters and buffers of a module that its code also reaches through plain Python attributes
(a cache object holding the tensors a wrapper module registered as buffers): finding those
attribute slots, and pointing them at the traced state for the length of a trace. Used by
export; see Note [Export: state reached through plain attributes].
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Iterator

import torch

# Note [Export: state reached through plain attributes]
# export traces functional_call(module, state, ...): functional_call points the module's
# registered parameter and buffer slots at the traced state, but a plain attribute holding the
# same tensor (transformers' StaticCache keeps its layers' key and value tensors in lists, and
# TorchExportableModuleWithStaticCache registers those very tensors as buffers) still holds
# the real tensor. The trace then read it as a constant: a write through the buffer was not
# seen by a later read through the attribute (the value from before the call, silently), and a
# write through the attribute was a write into a constant. So before the trace, every object
# reachable from the modules' plain attributes (lists, dicts, tuples, plain objects' __dict__,
# to a bounded depth) is searched for the state's tensors; a slot holding one is pointed at
# that state's traced value for the length of the trace, and one holding a view of one at the
# same view of it (as_strided with the view's geometry, the state owning its storage). Other
# tensors sharing a state's memory cannot be re-made and are refused by name.
# Rejected: refusing every such module (it is how transformers exports a model with a static
# cache), and matching constants to state after the trace (the trace has by then read and
# written the real tensor, and which read came after which write is lost).

_DEPTH = 6
_MODULE_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})


def _plain_children(value: Any) -> list[tuple[Any, Any]]:
    """(key, child) of a container or plain object; [] for anything else."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if isinstance(value, torch.nn.Module):
        return [(k, v) for k, v in vars(value).items() if k not in _MODULE_SLOTS]
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.MethodType,
                          types.BuiltinFunctionType, str, bytes, int, float, complex, bool,
                          torch.dtype, torch.device, torch.Size)) or value is None:
        return []
    attrs = getattr(value, "__dict__", None)
    return list(attrs.items()) if isinstance(attrs, dict) else []


Slot = tuple[list[Any], int, "torch.Tensor | None"]


def state_attribute_slots(module: torch.nn.Module, state: list[torch.Tensor]) -> list[Slot]:
    """Each plain attribute slot holding a state tensor or a view of one: (path of (container,
    key) from the module down to the slot, index into state, the view the slot holds or None
    where it holds the state tensor itself)."""
    by_id = {id(t): i for i, t in enumerate(state)}
    by_storage = {(t.device, t.untyped_storage().data_ptr()): i
                  for i, t in enumerate(state) if t.numel() > 0}
    slots: list[Slot] = []
    seen: set[int] = set()

    def name(path: list[Any]) -> str:
        return "".join(f"[{k!r}]" if isinstance(c, (dict, list, tuple)) else f".{k}"
                       for c, k in path)

    def visit(value: Any, path: list[Any], depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if not path or isinstance(value, torch._subclasses.FakeTensor):
                return
            i = by_id.get(id(value))
            view = None
            if i is None and value.numel() > 0 and value.layout is torch.strided:
                i = by_storage.get((value.device, value.untyped_storage().data_ptr()))
                if i is not None and not _owns_storage(state[i]):
                    raise NotImplementedError(
                        f"torch_functionalize.export: the module's attribute {name(path)} "
                        "shares memory with one of its parameters or buffers, which is itself a "
                        "view into a larger tensor; the exported program cannot keep that "
                        "aliasing. Register the base tensor as the buffer, or take the view "
                        "inside forward.")
                view = value
            if i is not None:
                slots.append((list(path), i, view))
            return
        if depth == 0 or id(value) in seen:
            return
        seen.add(id(value))
        for key, child in _plain_children(value):
            visit(child, [*path, (value, key)], depth - 1)

    for m in module.modules():
        visit(m, [], _DEPTH)
    return slots


def _owns_storage(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous() and \
        t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _set(container: Any, key: Any, value: Any) -> Any:
    """Writes value into container[key] (or its attribute key); returns the container, which is
    a new one for a tuple."""
    if isinstance(container, tuple):
        items = list(container)
        items[key] = value
        return type(container)(*items) if hasattr(container, "_fields") else tuple(items)
    if isinstance(container, (dict, list)):
        container[key] = value
    else:
        vars(container)[key] = value
    return container


@contextlib.contextmanager
def pointed_at(slots: list[Slot], traced: list[torch.Tensor]) -> Iterator[None]:
    """Points each slot at its state's traced value (or the same view of it), and every slot
    written on the way (a tuple is rebuilt into its parent) back to what it held."""
    undo: list[tuple[Any, Any, Any]] = []

    def write(path: list[Any], value: Any) -> None:
        for container, key in reversed(path):
            old = container[key] if isinstance(container, (dict, list, tuple)) \
                else vars(container)[key]
            new = _set(container, key, value)
            if new is container:
                undo.append((container, key, old))
                return
            value = new

    try:
        for path, i, view in slots:
            value = traced[i]
            if view is not None:
                value = value.as_strided(view.size(), view.stride(), view.storage_offset())
            write(path, value)
        yield
    finally:
        for container, key, old in reversed(undo):
            _set(container, key, old)
