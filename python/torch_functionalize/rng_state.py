"""torch.get_rng_state / torch.set_rng_state called inside the functionalized function while a
graph is traced: see Note [Graphs: random state saved and restored]. Installed once, when the
package is imported (install()); costs one check per call outside functionalize."""
from typing import Any, Callable

import torch
import torch.fx

from . import _C

# Note [Graphs: random state saved and restored]
# torch.utils.checkpoint (both forms, preserve_rng_state=True by default) saves the generator's
# state before the forward and restores it before recomputing the forward in the backward, so
# dropout inside the checkpointed block draws the same mask twice. The state is read and set
# outside the dispatcher (Generator.get_state/set_state), so a tracer saw neither: the graph drew
# a second, different mask in its recomputation, and its gradients were wrong on every replay,
# silently (the eager call was right). So while a make_fx tracer runs f, torch.get_rng_state and
# torch.set_rng_state (and torch.cuda's) are called for real and also recorded, as FX nodes
# calling those functions, the saved state a traced value: a replay saves and restores the state
# where f did and draws f's masks. The C++ capture recorder holds ATen ops only, so a program that
# sets the state is recorded through make_fx (Note [Capture: control flow]). Rejected: recording
# the state as a constant (every replay would draw the masks of the traced call), and forcing
# preserve_rng_state=False (the recomputation would draw other masks in eager too).
THROUGH_MAKE_FX = "sets the random generator's state under capture"

_originals: dict[tuple[Any, str], Callable[..., Any]] = {}


def tracer() -> Any:
    """make_fx's tracer while it traces on this thread, else None."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    return None if mode is None else mode.tracer


def _recording_get(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        active = tracer() if _C._layer_active() else None
        if active is None:
            return original(*args, **kwargs)
        from torch.fx.experimental.proxy_tensor import (
            disable_proxy_modes_tracing, track_tensor_tree,
        )

        proxy = active.create_proxy("call_function", original, args, kwargs)
        # The state's own allocation, and the copy its node's metadata takes, are no nodes of f.
        with disable_proxy_modes_tracing():
            state = original(*args, **kwargs)
            track_tensor_tree(state, proxy, constant=None, tracer=active)
        return state

    return get_rng_state


def _recording_set(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_rng_state(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if _C._layer_active():
            active = tracer()
            if active is not None:
                from torch.fx.experimental.proxy_tensor import get_proxy_slot

                traced = get_proxy_slot(new_state, active, new_state, lambda slot: slot.proxy)
                active.create_proxy("call_function", original, (traced, *args), kwargs)
                original(new_state, *args, **kwargs)
                _noted_set(original, *args, **kwargs)
                return None
            if _C._ops_are_recorded():
                raise NotImplementedError(
                    f"capture: f {THROUGH_MAKE_FX} (torch.set_rng_state: "
                    "torch.utils.checkpoint's recomputation, torch.random.fork_rng) "
                    "(Note [Graphs: random state saved and restored]).")
        return original(new_state, *args, **kwargs)

    return set_rng_state


def _noted_set(original: Callable[..., Any], device: Any = "cuda") -> None:
    """A recorded set of a generator's state, told to the generator watch: what its graph
    holds is no change of f's (Note [Graphs: generator state set outside the dispatcher])."""
    from . import generator_watch

    if original is _originals[(torch, "set_rng_state")]:
        generator_watch.note_state_set(torch.default_generator)
    else:
        generator_watch.note_state_set(_generator(str(torch.device(device))))


def get_state(device: str) -> torch.Tensor:
    """The state of the generator of `device` ("cpu", "cuda", "cuda:1"), read without recording
    anything (its allocation included)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with disable_proxy_modes_tracing():
        return _generator(device).get_state()


def _generator(device: str) -> torch.Generator:
    if device == "cpu":
        return torch.default_generator
    index = torch.device(device).index
    return torch.cuda.default_generators[
        index if index is not None else torch.cuda.current_device()]


def record_get_before(active: Any, node: torch.fx.Node, state: torch.Tensor, device: str) -> None:
    """A node reading the generator state of `device`, placed before `node` in `active`'s graph:
    `state`, read there, is its traced value."""
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    if device == "cpu":
        target, args = _originals[(torch, "get_rng_state")], ()
    else:
        target, args = _originals[(torch.cuda, "get_rng_state")], (device,)
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with active.graph.inserting_before(node):
        proxy = active.create_proxy("call_function", target, args, {})
    with disable_proxy_modes_tracing():  # the copy the node's metadata takes is no node
        track_tensor_tree(state, proxy, constant=None, tracer=active)


def set_state(state: torch.Tensor, device: str) -> None:
    """Sets the generator of `device` ("cpu", "cuda", "cuda:1") to `state`. A graph node of
    Note [Control flow: gradients]: a no-op on a fake state, as when torch's autograd kernel for
    cond runs a subgraph on fake inputs to find its schema."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(state):
        return
    if device == "cpu":
        _originals[(torch, "set_rng_state")](state)
    else:
        _originals[(torch.cuda, "set_rng_state")](state, device)


def set_state_recorded(state: torch.Tensor, device: str) -> None:
    """set_state, and under a make_fx tracer a node calling it on the traced `state`."""
    set_state(state, device)
    active = tracer()
    if active is not None:
        from . import generator_watch

        generator_watch.note_state_set(_generator(device))
        from torch.fx.experimental.proxy_tensor import get_proxy_slot

        traced = get_proxy_slot(state, active, state, lambda slot: slot.proxy)
        active.create_proxy("call_function", set_state, (traced, device), {})


def install() -> None:
    """Routes torch.{get,set}_rng_state and torch.cuda.{get,set}_rng_state through ours."""
    if _originals:
        return
    targets = [(torch, "get_rng_state", _recording_get), (torch, "set_rng_state", _recording_set),
               (torch.cuda, "get_rng_state", _recording_get),
               (torch.cuda, "set_rng_state", _recording_set)]
    for module, name, wrap in targets:
        original = getattr(module, name)
        _originals[(module, name)] = original
        torch.fx.node.has_side_effect(original)  # a set node has no users; dead code stays
        replacement = wrap(original)
        replacement.__doc__ = original.__doc__
        replacement.__name__ = original.__name__
        setattr(module, name, replacement)
    torch.fx.node.has_side_effect(set_state)
