"""Random generators whose state f sets outside the dispatcher while a graph records it
(torch.manual_seed, Generator.manual_seed and set_state, a generator f makes): see
Note [Graphs: generator state set outside the dispatcher]. The kernel shows each draw's generator
to _observe (kernels/WatchedDraws.cpp); watching() scopes one traced or captured call of f."""
import contextlib
import itertools
import threading
from typing import Any, Iterator

import torch

from . import _C, rng_state

# Note [Graphs: generator state set outside the dispatcher]
# A graph records draws (aten ops with a generator) but not what sets a generator's state:
# torch.manual_seed, Generator.manual_seed / set_state, torch.random.fork_rng's seeding, a
# torch.Generator f makes and seeds. So a graph of f that seeds before drawing drew, on every
# replay, from wherever the generator happened to be, and a generator made inside f was baked as
# the traced object, which each replay advanced further: other numbers than eager's, silently.
# Rule: while make_fx traces f over our layer, or capture records it, the kernel shows each
# seeded op's generator to this module before and after the op (WatchedDraw), which keeps the
# generator's state after its last draw. A draw that finds another state, or follows a
# torch.manual_seed of f, or is the first from a generator f made, gets a node setting the state
# before it (tfz::_set_generator_state): read (tfz::_generator_state) where the graph last had
# that state (a state saved and restored inside f, fork_rng's), else a constant (a seed is a
# constant of f). When f returns, a generator left in another state than its draws explain gets
# the same node at the end. capture's recorder records a seed's node as any op; a read at an
# earlier place is a node it cannot add, so capture records such a program through make_fx
# (Note [Capture: control flow]). Generators watched: the default ones (their state on entry is
# known), those f makes (while f is traced, torch.Generator is a class whose construction makes
# torch's own generator and notes it; the argument parser takes no subclass instance), and any
# other from its first draw on. A draw on fake tensors (symbolic tracing, capture(dynamic=True))
# moves no generator, which would hide a state set back to the one before that draw: after such
# a draw the generator gets a stand-in state (seeded from a private counter) for the rest of the
# trace, and its real state back when the call ends. Not seen: a generator made outside f and
# reseeded by its own method inside f before its first draw there, and Generator.manual_seed on
# a default generator giving the state it had when f was called (equal by coincidence);
# torch.manual_seed is always seen. Rejected: intercepting every Generator method (a C type's
# methods cannot be replaced), and refusing these programs (seeding inside f is how tests and
# initializers get reproducible numbers).
SEEDS = "seeds or sets a random generator's state outside the dispatcher"

_local = threading.local()
_START = object()  # a history entry's place: the graph's start, before any node of f


class _Seen:
    """One generator in one watched call."""

    def __init__(self, generator: torch.Generator, key: int) -> None:
        self.generator = generator
        self.key = key
        self.expected: torch.Tensor | None = None  # its state after its last draw or set here
        self.first: torch.Tensor | None = None  # its state before its first draw here
        # (state, where the graph has it: the node after which, or _START; None under capture)
        self.history: list[tuple[torch.Tensor, Any]] = []
        self.seeded = False  # torch.manual_seed called since its last draw or set
        # Drawn from or set by what this watch does not see (a control-flow branch's own
        # tracer): its state at the next draw is the graph's, whatever it is.
        self.unknown = False
        self.pending: torch.Tensor | None = None  # its state before the draw running now
        # Its real state while a stand-in stands for it (a draw that did not move it), else None.
        self.real: torch.Tensor | None = None


_stand_ins = itertools.count(1)
_STAND_IN_BASE = 0x7A11_F5EE_D000_0000  # seeds no caller picks by chance


class _Watch:
    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.tracer = None if capture else rng_state.tracer()
        self.seen: dict[int, _Seen] = {}  # by _C._generator_key
        self.made_inside: set[int] = set()  # keys of the generators f made
        self.setting = False  # a set op of ours is running: its dispatch is no draw of f
        for generator in _default_generators():
            seen = self._entry(generator)
            seen.expected = seen.first = generator.get_state()
            seen.history.append((seen.expected, None if capture else _START))

    def _place(self) -> Any:
        return None if self.tracer is None else self.tracer.graph._root.prev

    def _entry(self, generator: torch.Generator, key: int | None = None) -> _Seen:
        key = _C._generator_key(generator) if key is None else key
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = _Seen(generator, key)
        return seen

    def before(self, generator: torch.Generator, key: int) -> str:
        """A draw is about to run: sets the generator's state first where f changed it."""
        seen = self._entry(generator, key)
        state = seen.pending = generator.get_state()
        if seen.first is None:
            seen.first = state
        if (seen.expected is None and key not in self.made_inside) or (
                seen.unknown and not seen.seeded):
            seen.expected = state  # made outside f, first drawn here: watched from now on
            seen.unknown = False
            seen.history.append((state, self._place()))
            return ""
        if seen.expected is not None and not seen.seeded and _C._same_state(state, seen.expected):
            return ""
        return self._set(seen, state)

    def after(self, generator: torch.Generator, key: int) -> None:
        seen = self._entry(generator, key)
        state = generator.get_state()
        fake = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
        if fake and seen.pending is not None and _C._same_state(state, seen.pending):
            # The draw did not move it (a fake tensor's): a state of its own stands for "after
            # this draw", so that f setting it back to an earlier state is still seen.
            if seen.real is None:
                seen.real = state
            stand_in = _original_generator(device=generator.device)
            stand_in.manual_seed(_STAND_IN_BASE + next(_stand_ins))
            state = stand_in.get_state()
            generator.set_state(state)
        else:
            seen.real = None
        seen.expected = state
        seen.pending = None
        seen.unknown = False
        seen.history.append((state, self._place()))

    def restore_stand_ins(self) -> None:
        """Generators a stand-in still stands for get their real state back."""
        for seen in self.seen.values():
            if seen.real is not None and seen.expected is not None and _C._same_state(
                    seen.generator.get_state(), seen.expected):
                seen.generator.set_state(seen.real)
            seen.real = None

    def lose_track(self, key: int) -> None:
        seen = self.seen.get(key)
        if seen is not None:
            seen.unknown = True

    def finish(self) -> None:
        """f returned: a generator left in another state than its draws explain is set to it."""
        for seen in list(self.seen.values()):
            if seen.expected is None:
                continue
            state = seen.generator.get_state()
            if seen.seeded or (not seen.unknown and not _C._same_state(state, seen.expected)):
                refusal = self._set(seen, state)
                if refusal:
                    raise NotImplementedError(refusal)

    def restore_outside_generators(self) -> None:
        """A refused capture drew from generators f did not make: back to where they were."""
        for seen in self.seen.values():
            if seen.first is not None and seen.key not in self.made_inside:
                seen.generator.set_state(seen.first)

    def _set(self, seen: _Seen, state: torch.Tensor) -> str:
        """Records setting the generator to `state` (its state now) at the graph's current
        place; returns a refusal where capture would have to read it at an earlier place."""
        # A state the graph had earlier (saved there, restored now) is read there; a seed's, or
        # one never seen, is a constant.
        earlier = None if seen.seeded else next(
            ((place,) for past, place in seen.history if _C._same_state(past, state)), None)
        generator, device = _generator_args(seen.generator)
        if self.capture:
            if earlier is not None:
                return _refusal()  # the recorder cannot add a read at an earlier place
            self.setting = True
            try:  # recorded as a node; sets the state it already has
                torch.ops.tfz._set_generator_state(state, generator, device)
            finally:
                self.setting = False
        else:
            active = rng_state.tracer()
            if active is None or active is not self.tracer:
                return ""  # tracing set aside by f: its draws are not recorded either
            source: Any = state
            if earlier is not None:
                place = earlier[0]
                graph = active.graph
                # Before the node that follows: nodes made there keep their order (a
                # generator's get_attr, then the read), where inserting_after reverses them.
                with graph.inserting_before(_first_of_f(graph) if place is _START
                                            else place.next):
                    source = active.create_proxy(
                        "call_function", torch.ops.tfz._generator_state.default,
                        (generator, device), {})
            active.create_proxy("call_function", torch.ops.tfz._set_generator_state.default,
                                (source, generator, device), {})
        seen.seeded = False
        seen.expected = state
        seen.history.append((state, self._place()))
        return ""


def _first_of_f(graph: Any) -> Any:
    for node in graph.nodes:
        if node.op != "placeholder":
            return node
    return graph._root


def _refusal() -> str:
    return (f"capture: f {SEEDS} (torch.manual_seed, Generator.manual_seed or set_state, a "
            "generator f makes) (Note [Graphs: generator state set outside the dispatcher]).")


def _default_generators() -> list[torch.Generator]:
    generators = [torch.default_generator]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        generators.extend(torch.cuda.default_generators)
    return generators


def _generator_args(generator: torch.Generator) -> tuple[torch.Generator | None, torch.device]:
    """The (generator, device) arguments of the state ops: None for a default generator (named by
    its device, so graphs of such programs stay picklable)."""
    key = _C._generator_key(generator)
    for default in _default_generators():
        if key == _C._generator_key(default):
            return None, default.device
    return generator, generator.device


def _observe(generator: torch.Generator, key: int, before: bool) -> str:
    watches = getattr(_local, "watches", None)
    if not watches or watches[-1].setting:
        return ""
    active = rng_state.tracer()
    watch = watches[-1]
    if not watch.capture and active is not watch.tracer:
        watch = None  # a subgraph's own tracer (a control-flow branch) records this draw
    if before:
        return "" if watch is None else watch.before(generator, key)
    for other in watches:
        if other is not watch:
            other.lose_track(key)
    if watch is not None:
        watch.after(generator, key)
    return ""


def note_state_set(generator: torch.Generator) -> None:
    """`generator` was set by a node rng_state records (torch.set_rng_state under a tracer, a
    control-flow gradient's replay of a branch's draws): the watch of that graph takes the new
    state as the graph's; the others lose track of it."""
    watches = getattr(_local, "watches", None)
    if not watches:
        return
    key = _C._generator_key(generator)
    active = rng_state.tracer()
    for watch in watches:
        if watch.tracer is active and not watch.capture:
            watch.after(generator, key)
        else:
            watch.lose_track(key)


_patched = {"depth": 0}
_lock = threading.Lock()
_original_generator = torch.Generator
_original_manual_seed = torch.random.manual_seed


class _GeneratorMeta(type(torch._C.Generator)):  # type: ignore[misc]
    """torch.Generator while a watched f runs: the generators f makes are torch's own (the
    argument parser takes no subclass), noted as made inside f."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Generator:
        generator = _original_generator(*args, **kwargs)
        watches = getattr(_local, "watches", None)
        if watches:
            watches[-1].made_inside.add(_C._generator_key(generator))
        return generator


class _MadeInside(torch._C.Generator, metaclass=_GeneratorMeta):
    pass


_MadeInside.__name__ = _MadeInside.__qualname__ = "Generator"


def _manual_seed(seed: Any) -> Any:
    watches = getattr(_local, "watches", None)
    if watches:
        for generator in _default_generators():
            watches[-1]._entry(generator).seeded = True
    return _original_manual_seed(seed)


_manual_seed.__doc__ = _original_manual_seed.__doc__
_manual_seed.__name__ = "manual_seed"


@contextlib.contextmanager
def watching(capture: bool) -> Iterator[_Watch]:
    """One traced (make_fx) or captured call of f, watched."""
    watch = _Watch(capture)
    watches = getattr(_local, "watches", None)
    if watches is None:
        watches = _local.watches = []
    watches.append(watch)
    with _lock:
        if _patched["depth"] == 0:
            torch.Generator = _MadeInside  # type: ignore[misc]
            torch.manual_seed = torch.random.manual_seed = _manual_seed
        _patched["depth"] += 1
    try:
        yield watch
    except BaseException:
        if capture:
            watch.restore_outside_generators()
        raise
    finally:
        watch.restore_stand_ins()
        watches.pop()
        with _lock:
            _patched["depth"] -= 1
            if _patched["depth"] == 0:
                torch.Generator = _original_generator  # type: ignore[misc]
                torch.manual_seed = torch.random.manual_seed = _original_manual_seed


def install() -> None:
    """Shows the kernel's draws to this module; graphs keep the set nodes (no users)."""
    torch.fx.node.has_side_effect(torch.ops.tfz._set_generator_state.default)
    _C._set_draw_observer(_observe)
