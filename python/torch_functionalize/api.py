"""functionalize(f, remove=...), and the manual-use helpers (enable, to/from_functional, sync).
The functionalized call itself is C++'s (csrc/api/Call.h, shared with the C++ API); this file
handles what is Python's: pytrees in and out, argument checks, tracer detection.
"""
from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Sequence, TypeVar

import torch
import torch.utils.checkpoint
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import _C, compiled_callables, generator_watch, torchscript_plans
from ._fx import run_without_grad
from ._tree import Arguments, Flat, call_with, tensor_leaves

if TYPE_CHECKING:
    import torch.fx

Remove = Literal["mutations", "mutations_and_views"]
F = TypeVar("F", bound=Callable[..., Any])


def check_remove(remove: str) -> None:
    """Raises ValueError unless ``remove`` is "mutations" or "mutations_and_views"."""
    _C._parse_remove(remove if isinstance(remove, str) else repr(remove))


@contextlib.contextmanager
def enable(remove: Remove = "mutations") -> Iterator[None]:
    """Functionalize ops on wrappers made by ``to_functional`` inside this block (manual use)."""
    torchscript_plans.install()
    guard = _C._Guard(remove)
    try:
        yield
    finally:
        guard.close()


def is_functional(t: object) -> bool:
    """True if ``t`` is a functional wrapper made by torch_functionalize."""
    return isinstance(t, torch.Tensor) and _C._is_functional(t)


def to_functional(t: torch.Tensor) -> torch.Tensor:
    """Wraps a plain tensor for the functionalize call (or ``enable`` block) active on this thread."""
    return _C._to_functional(t)


def from_functional(t: torch.Tensor) -> torch.Tensor:
    """Applies pending updates and returns the plain tensor inside a wrapper (plain: unchanged)."""
    return _C._from_functional(t)


def sync(t: torch.Tensor) -> None:
    """Brings a wrapper up to date with mutations made through its aliases."""
    _C._sync(t)


def functionalize(func: F, *, remove: Remove = "mutations") -> F:
    """Returns ``func`` transformed to run without mutations (``remove="mutations"``) or without
    mutations and views (``remove="mutations_and_views"``), with the contract of
    ``torch.func.functionalize``: same outputs as plain tensors, input mutations written back."""
    if not callable(func):
        raise TypeError(f"functionalize: expected a callable, got {type(func).__name__}.")
    check_remove(remove)

    @functools.wraps(func)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_dynamo_compiling():  # See Note [API: under torch.compile]
            if remove == "mutations":
                return func(*args, **kwargs)
            return _outside_dynamo(call, args, kwargs)
        return call(*args, **kwargs)

    def call(*args: Any, **kwargs: Any) -> Any:
        if _C._layer_active():  # See Note [API: nested calls]
            return _nested_call(func, remove, args, kwargs)
        # The call itself is C++'s (api/Call.h); here: pytrees in and out, see
        # Note [API: arguments without a pytree].
        arguments: Arguments = _Shallow.of(args, kwargs) or Flat((args, kwargs))
        inputs = arguments.tensors()
        # Wrapper subclasses enter as their inner tensors (Note [API: wrapper subclasses]).
        plans = None
        traced_subclass_inputs = False
        if any(type(t) is not torch.Tensor and _is_wrapper_subclass(t) for t in inputs):
            traced_subclass_inputs = _trace_subclass_inputs(inputs)
            leaves: list[torch.Tensor] = []
            plans = [_flatten_subclass(t, leaves) for t in inputs]
            inputs = leaves
        result = []  # [output, its tensor leaves' rebuild function]

        def run(wrappers: list[torch.Tensor]) -> list[torch.Tensor]:
            if plans is not None:
                it = iter(wrappers)
                wrappers = [_unflatten_subclass(p, it) for p in plans]
            if tracer is None:
                tensors, rebuild = tensor_leaves(call_with(func, arguments, wrappers))
            else:  # See Note [Graphs: generator state set outside the dispatcher].
                with generator_watch.watching(capture=False) as watch:
                    tensors, rebuild = tensor_leaves(call_with(func, arguments, wrappers))
                    watch.finish()
            if any(_is_wrapper_subclass(t) for t in tensors):
                leaves: list[torch.Tensor] = []
                out_plans = [_flatten_subclass(t, leaves) for t in tensors]

                def rebuild_subclasses(plain: list[torch.Tensor],
                                       rebuild: Callable[[list[torch.Tensor]], Any] = rebuild
                                       ) -> Any:
                    it = iter(plain)
                    return rebuild([_unflatten_subclass(p, it) for p in out_plans])

                tensors, rebuild = leaves, rebuild_subclasses
            result.append(rebuild)
            return tensors

        # Outputs alias inputs only outside tracers: graph outputs never alias graph inputs
        # (Note [Inputs: outputs that alias inputs]).
        tracer = _proxy_tracer()
        alias = remove == "mutations" and tracer is None
        last_node: Any = tracer.graph._root.prev if tracer is not None else None
        grad_leaves = _leaves_requiring_grad(tracer, inputs) if tracer is not None else set()
        compiled_callables.install_if_dynamo_loaded()
        torchscript_plans.install()
        if tracer is None:
            outputs = _C._call(inputs, remove, alias, run)
        else:  # See Note [Autograd: saved outputs under a tracer], the checkpoint case.
            with torch.utils.checkpoint.set_checkpoint_early_stop(False), _fake_cache_off():
                outputs = _C._call(inputs, remove, alias, run)
        if tracer is not None:
            _tidy_autograd_detaches(tracer, last_node, outputs, remove != "mutations")
            _epilogue_without_grad(tracer, last_node, grad_leaves)
        out = result[0](outputs)
        if traced_subclass_inputs:
            _trace_subclass_outputs(out)
        return out

    return wrapped  # type: ignore[return-value]


# Note [API: autograd's detach of saved outputs]
# Autograd saves an op's output for its backward (tanh, relu, exp) as a shallow copy of it, and
# with a dispatch mode on the thread torch makes that copy through the mode as aten.detach. Our
# autograd runs on inner values, below our key, so make_fx recorded one dead aten.detach per
# saved output (a view op in remove="mutations_and_views" graphs of every training step; the
# backward reads the traced output itself, Note [Autograd: saved outputs under a tracer]). So
# under make_fx the call erases the aten.detach nodes it added that nothing reads and that no
# backward can read later: all of them when no output requires grad, else those whose saved copy
# is gone (the tracer tracks tensors weakly; a backward that ran inside f released them). One
# whose copy is alive (the forward of an output that requires grad) may be unpacked by a backward
# traced later, so it stays, as aten.detach_copy without views (the same value, no view).
# torch 2.14 makes some of these copies as aten.alias (sigmoid's output, saved by a double
# backward): the same rule, aten.alias_copy without views.
# Rejected: hiding the mode from autograd's saved copies (the same TLS shows it the op).
def _tidy_autograd_detaches(tracer: Any, last_node: torch.fx.Node,
                            outputs: list[torch.Tensor], removes_views: bool) -> None:
    from torch.fx.experimental.proxy_tensor import get_proxy_slot, has_proxy_slot

    # The call's outputs are read by what comes after it: their nodes stay.
    kept = {get_proxy_slot(t, tracer).proxy.node for t in outputs
            if isinstance(t, torch.Tensor) and has_proxy_slot(t, tracer)}
    alive = set()
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in outputs):
        alive = {slot.proxy.node for slot in list(tracer.tensor_tracker.values())}
    copies = {torch.ops.aten.detach.default: torch.ops.aten.detach_copy.default,
              torch.ops.aten.alias.default: torch.ops.aten.alias_copy.default}
    graph = tracer.graph
    node = graph._root.prev
    while node is not last_node and node is not graph._root:
        prev = node.prev
        if node.op == "call_function" and node.target in copies and node not in kept:
            if not node.users and node not in alive:
                graph.erase_node(node)
            elif removes_views:
                node.target = copies[node.target]
        node = prev


# Note [API: epilogue writes of leaves in graphs]
# f may write an input that requires grad where autograd does not see it (an optimizer's update
# of its parameters under no_grad); the epilogue then writes the leaf with grad mode off, as f
# did. make_fx records no grad mode, so its graph held a bare copy_ into a leaf that requires
# grad: a replay in grad mode raised "a leaf Variable that requires grad is being used in an
# in-place operation", and a replay under no_grad changed what kernels that look at the grad mode
# compute (the CPU LSTM kernel leaves out the workspace its traced backward reads). So where the
# epilogue writes such a leaf, the call puts the epilogue between torch._C._set_grad_enabled
# nodes (off, then back to the mode the graph runs in, read just before), as the capture recorder
# does (Note [Capture: grad mode]) and pre-dispatch graphs do; a graph that writes no such leaf
# is unchanged. Rejected: replaying such graphs under no_grad only (what AOTAutograd does for its
# own graphs, but not what a caller of make_fx's module does).
def _leaves_requiring_grad(tracer: Any, inputs: list[torch.Tensor]) -> set[torch.fx.Node]:
    """The graph nodes of the call's inputs that are leaves requiring grad (read before the call:
    make_fx points a written tensor at the node that wrote it)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot, has_proxy_slot

    return {get_proxy_slot(t, tracer).proxy.node for t in inputs
            if isinstance(t, torch.Tensor) and t.is_leaf and t.requires_grad
            and has_proxy_slot(t, tracer)}


def _epilogue_without_grad(tracer: Any, last_node: torch.fx.Node,
                           leaves: set[torch.fx.Node]) -> None:
    if not leaves:
        return
    copy_ = torch.ops.aten.copy_.default
    graph = tracer.graph
    writes = []
    node = last_node.next
    while node is not graph._root:
        if node.op == "call_function" and node.target is copy_ and node.args[0] in leaves:
            writes.append(node)
        node = node.next
    if writes:
        run_without_grad(graph, writes[0], writes[-1])


# Note [API: arguments without a pytree]
# The common calls pass tensors and flat lists or tuples of tensors (an optimizer step over lists
# of parameters and states): for those, the inputs are read and the arguments rebuilt around the
# wrappers by two loops here. pytree's flatten and unflatten cost about 0.6 us per tensor
# (measured: 300 us of a 530 us call with five lists of 100 tensors, torch 2.13 CPU), as much as
# the C++ call itself. Only exact list and tuple types qualify (a namedtuple or a subclass keeps
# pytree's rebuild); f receives new lists and tuples, as pytree's unflatten gives it. Anything
# else (dicts, nesting, non-tensor items) takes pytree.
# Rejected: a C++ flatten (the rebuild must call back into Python for every container anyway).
_SHALLOW = (list, tuple)


class _Shallow:
    """The ``Arguments`` of a call whose arguments are all tensors or exact lists / tuples of
    tensors, read without pytree."""

    __slots__ = ("args", "kwargs", "inputs", "tensors_only")

    def __init__(self, args: tuple, kwargs: dict[str, Any], inputs: list[torch.Tensor],
                 tensors_only: bool) -> None:
        self.args, self.kwargs, self.inputs = args, kwargs, inputs
        self.tensors_only = tensors_only  # positional tensors only: f(x, y), the common call

    @staticmethod
    def of(args: tuple, kwargs: dict[str, Any]) -> _Shallow | None:
        """The arguments when every one is a tensor or an exact list / tuple of tensors (their
        tensors in pytree's order), else None."""
        inputs: list[torch.Tensor] = []
        tensors_only = not kwargs
        for a in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(a, torch.Tensor):
                inputs.append(a)
            elif type(a) in _SHALLOW and all(isinstance(t, torch.Tensor) for t in a):
                inputs.extend(a)
                tensors_only = False
            else:
                return None
        return _Shallow(args, kwargs, inputs, tensors_only)

    def tensors(self) -> list[torch.Tensor]:
        return self.inputs

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> tuple[tuple, dict[str, Any]]:
        """``args`` and ``kwargs`` with ``tensors`` in place of their tensors."""
        if self.tensors_only:
            return tuple(tensors), {}
        pos = 0

        def take(a: Any) -> Any:
            nonlocal pos
            if isinstance(a, torch.Tensor):
                pos += 1
                return tensors[pos - 1]
            n = len(a)
            pos += n
            return type(a)(tensors[pos - n:pos])

        new_args = tuple(take(a) for a in self.args)
        return new_args, {k: take(v) for k, v in self.kwargs.items()}


# Note [API: nested calls]
# functionalize(functionalize(f)), or a functionalized function called inside another's call
# (also through torch.func transforms between the two: functionalize(grad(functionalize(f)))):
# the active layer already removes every mutation (and view, with remove="mutations_and_views")
# in what it runs and writes back to its own inputs at its end, so the inner call runs `func`
# directly in it. Its mutations of its inputs are then mutations of the outer layer's tensors,
# seen by the outer function afterwards as eager's would be. The one thing left to the inner
# call is its own contract on outputs: with remove="mutations_and_views" they never alias its
# inputs, so its tensor outputs are cloned (an extra functional clone in the trace). One check
# per call (_C._layer_active). Rejected: a second layer on the thread (one layer per thread keeps
# the TLS scheme simple, Note [Layer: TLS scheme], and would only redo the outer layer's work);
# refusing nesting, as before (torch.func fails there with an internal assertion). Entering a
# second layer by hand (enable() inside a functionalized function) is still refused.
def _nested_call(func: Callable[..., Any], remove: str, args: tuple,
                 kwargs: dict[str, Any]) -> Any:
    out = func(*args, **kwargs)
    if remove == "mutations_and_views":
        out = pytree.tree_map_only(torch.Tensor, torch.clone, out)
    return out


# Note [API: under torch.compile]
# Dynamo cannot trace our call (C++ running user code on wrappers it has no fake form of): left to
# itself it breaks the graph at _C._call, then compiles the user's function as a new frame when
# C++ calls it, fakeifies our wrappers and fails an internal assertion. So functionalize checks
# torch.compiler.is_dynamo_compiling() first (true only while dynamo traces the call, not while a
# backend, ours included, traces the captured graph with make_fx):
# - remove="mutations": dynamo traces `func` itself. The functionalized function and `func` give
#   the same outputs (ours alias the inputs as eager's do) and the same input mutations, and every
#   compile backend that needs a functional graph (AOTAutograd, ours) functionalizes what dynamo
#   captured, so the call is traced through at no cost.
# - remove="mutations_and_views": outputs must not alias inputs, which dynamo cannot tell at trace
#   time, so the call runs eagerly behind a graph break (torch._disable_dynamo, which imports
#   dynamo only when called, and disables it for the frames our call runs too).
# Rejected: a graph break in both modes (mutations mode would lose the whole function to eager);
# registering our call as an opaque custom op (its outputs' aliasing and the input mutations
# would need a schema per function).
@torch._disable_dynamo
def _outside_dynamo(call: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    return call(*args, **kwargs)


# Note [API: wrapper subclasses]
# A traceable wrapper subclass (DTensor, or any subclass with __tensor_flatten__ and
# __tensor_unflatten__) passed to the function stays that subclass inside it: the call flattens it
# (recursively, for subclasses of subclasses) into its inner tensors, which become the call's
# inputs like any tensor (wrapped, mutations written back to them at the end), and `run` rebuilds
# the subclass around their wrappers with __tensor_unflatten__ (same outer size and stride, same
# context: a DTensor keeps its mesh and placements). Ops on it then run its __torch_dispatch__
# above our layer, whose calls on the inner wrappers are functionalized
# (see Note [Kernel: wrapper subclasses]). Outputs that are such subclasses leave the same way in
# reverse: flattened inside `run`, their inner tensors unwrapped by the call, rebuilt outside
# around the plain results. This is how torch's own stack treats them (AOTAutograd flattens
# subclasses at the graph boundary and traces the inner program). A subclass that a tracer holds
# as one graph input (make_fx(functionalize(f))(dtensor)):
# see Note [API: subclasses as graph inputs].
# Not covered: changes a function makes to the subclass's own metadata of an input (its context,
# e.g. a DTensor's placements) are not written back; only its inner tensors' values are.
# Rejected: keeping the subclass as the inner value of one wrapper (the old behaviour: f saw a
# plain tensor and the subclass's dispatch ran below us, so a tracer saw subclass-level ops, not
# the local program).
def _is_wrapper_subclass(t: object) -> bool:
    return type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t)


# Note [API: the fake-tensor cache under a tracer]
# FakeTensorMode caches the metadata of op results by the metadata of their arguments, in one
# table for every mode of the process. Under a fake tracer the engine reads the storage offset of
# fake results: a *_scatter of a view at an offset keeps the offset (torch copies the view's whole
# storage), and the input's own base is addressed from it. Served from the cache, such a result
# came back at offset 0 from the second trace on, in any mode: make_fx(functionalize(f),
# tracing_mode="fake") of f(b[1:, ::2]) wrote the input's elements shifted by its offset, silently,
# on every trace but the first in a process, and so did functionalize_graph and the torch.compile
# backend. So the functionalized call runs with the tracer's fake mode not caching, and restores
# the mode's setting after. Rejected: dropping the cache's entries (the table is torch's, shared,
# and its keys are private), and recomputing offsets from sizes (a scatter's result has the
# offset, its sizes do not say it).
@contextlib.contextmanager
def _fake_cache_off() -> Iterator[None]:
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None or not getattr(mode, "cache_enabled", False):
        yield
        return
    mode.cache_enabled = False
    try:
        yield
    finally:
        mode.cache_enabled = True


def _proxy_tracer() -> Any:
    """The tracer of the make_fx running this call, if any."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    return None if mode is None else mode.tracer


def _trace_subclass_inputs(inputs: list[torch.Tensor]) -> bool:
    """A subclass that make_fx holds as a graph input: its inner tensors enter the graph as
    ``getattr`` of that input (Note [API: subclasses as graph inputs]). Returns whether there was
    one."""
    tracer = _proxy_tracer()
    if tracer is None:
        return False
    from torch.fx.experimental.proxy_tensor import get_proxy_slot, has_proxy_slot

    def track_inner(t: torch.Tensor, proxy: Any) -> None:
        attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        for attr in attrs:
            inner = getattr(t, attr)
            if not isinstance(inner, torch.Tensor) or has_proxy_slot(inner, tracer):
                continue
            inner_proxy = tracer.create_proxy("call_function", getattr, (proxy, attr), {})
            if _is_wrapper_subclass(inner):
                track_inner(inner, inner_proxy)
            _track(inner, inner_proxy, tracer)

    found = False
    for t in inputs:
        if _is_wrapper_subclass(t) and has_proxy_slot(t, tracer):
            track_inner(t, get_proxy_slot(t, tracer).proxy)
            found = True
    return found


def _trace_subclass_outputs(out: object) -> None:
    """After a call whose subclass inputs are graph inputs: subclass outputs that make_fx does not
    know are rebuilt in the graph from their traced inner tensors by one node.
    See Note [API: subclasses as graph inputs]."""
    tracer = _proxy_tracer()
    if tracer is None:
        return
    from torch.fx.experimental.proxy_tensor import get_proxy_slot, has_proxy_slot

    for t in pytree.tree_leaves(out):
        if not _is_wrapper_subclass(t) or has_proxy_slot(t, tracer):
            continue
        leaves: list[torch.Tensor] = []
        plan = _flatten_subclass(t, leaves)
        if not all(has_proxy_slot(leaf, tracer) for leaf in leaves):
            continue  # built from tensors the tracer does not know: its own business
        key = len(_TRACED_PLANS)
        _TRACED_PLANS.append(plan)
        proxies = tuple(get_proxy_slot(leaf, tracer).proxy for leaf in leaves)
        _track(t, tracer.create_proxy("call_function", rebuild_traced_subclass,
                                      (key, *proxies), {}), tracer)


def _track(t: torch.Tensor, proxy: Any, tracer: Any) -> None:
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    track_tensor_tree(t, proxy, constant=None, tracer=tracer)


# Note [API: subclasses as graph inputs]
# make_fx(functionalize(f))(dtensor): make_fx holds the DTensor as one graph input and knows
# nothing of its local tensor, which our call reads, so the local program would enter the graph
# with the local tensor as a constant (plain make_fx of a DTensor program gives exactly that
# graph: every result a constant). So before the call, each inner tensor of a subclass input
# the tracer holds becomes a `getattr(x, "_local_tensor")` node of that input (recursively for
# subclasses of subclasses), and after it, each subclass output is rebuilt in the graph by one
# node, rebuild_traced_subclass(key, *inner), whose plan (type, flatten context, outer size and
# stride: a DTensor's mesh and placements) stays in this process under `key`. The graph is then
# the functional local program between the subclass input and the subclass output, and replays
# on another subclass of the same layout; the epilogue writes input mutations into the input's
# inner tensors through those getattr nodes. Such a graph runs in the process that traced it
# (the plans are Python objects, not graph constants); flatten at the graph boundary (trace a
# function of the local tensors that builds the subclass) for a graph that stands alone.
# Rejected: refusing the call (what we did first) and returning the local tensors (a graph whose
# outputs are not what the function returns).
_TRACED_PLANS: list[Any] = []


def rebuild_traced_subclass(key: int, *inner: torch.Tensor) -> torch.Tensor:
    """The graph node that rebuilds a subclass output from its inner tensors (see
    Note [API: subclasses as graph inputs])."""
    return _unflatten_subclass(_TRACED_PLANS[key], iter(inner))


class _Kept:
    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


def _flatten_subclass(t: object, leaves: list[torch.Tensor]) -> Any:
    """Appends the plain tensors inside ``t`` to ``leaves`` and returns the plan that rebuilds
    ``t`` from them (None for a plain tensor)."""
    if not isinstance(t, torch.Tensor):  # a non-tensor inner attribute (DTensor's mesh): kept
        return _Kept(t)
    if not _is_wrapper_subclass(t):
        leaves.append(t)
        return None
    attrs, ctx = t.__tensor_flatten__()  # type: ignore[attr-defined]
    children = [(a, _flatten_subclass(getattr(t, a), leaves)) for a in attrs]
    return type(t), ctx, children, t.size(), t.stride()


def _unflatten_subclass(plan: Any, it: Iterator[torch.Tensor]) -> Any:
    if plan is None:
        return next(it)
    if isinstance(plan, _Kept):  # not a tensor: the attribute as it was
        return plan.value
    cls, ctx, children, size, stride = plan
    inner = {a: _unflatten_subclass(child, it) for a, child in children}
    return cls.__tensor_unflatten__(inner, ctx, size, stride)
