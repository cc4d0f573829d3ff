"""capture(f, *args, remove=..., **kwargs): f's functional program as an FX GraphModule, recorded
by the C++ engine while it functionalizes f (no make_fx, no proxy tensors). C++ records the ops
(see Note [Capture: how ops are recorded]); this file turns its node list into FX: pytrees in and
out, closure tensors as ``get_attr`` constants, multi-output ops through ``operator.getitem``.
"""
from __future__ import annotations

import inspect
import os
import keyword
import traceback
import warnings
import operator
import re
from typing import Any, Callable, Literal, Sequence

import torch
import torch.utils.checkpoint
import torch.fx as fx
import torch.fx._pytree as fx_pytree
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

from . import _C, compiled_callables, generator_watch, rng_state, torchscript_plans
from ._alias_analysis import InputLayout
from ._copy_derivative import has_copy, with_copy_derivative
from ._fx import placeholders, run_without_grad
from ._tree import Flat, call_with
from .api import Remove, _is_wrapper_subclass, check_remove

_ops_cache: dict[tuple[str, str], tuple[Any, str]] = {}


def _resolve(qualified: str, overload: str) -> tuple[Any, str]:
    """The OpOverload and the node name make_fx gives it (its packet's name)."""
    key = (qualified, overload)
    found = _ops_cache.get(key)
    if found is None:
        namespace, name = qualified.split("::", 1)
        packet = getattr(getattr(torch.ops, namespace), name)
        found = _ops_cache[key] = (getattr(packet, overload or "default"), name)
    return found


def capture(func: Callable[..., Any], *args: Any, remove: Remove = "mutations",
            dynamic: bool = False, reinplace: bool = False, **kwargs: Any) -> fx.GraphModule:
    """Runs ``functionalize(func, remove=remove)(*args, **kwargs)`` once and returns the functional
    program it ran as an ``fx.GraphModule`` of ATen ops (called with the same pytrees as ``func``),
    recorded in C++ as it runs: the program ``make_fx(functionalize(func))`` records, without the
    cost of Python tracing, minus the nodes nothing uses, and with remove="mutations" an epilogue
    that writes back only the regions of an input the program wrote. Inputs may be ``meta`` tensors (nothing is computed). As with make_fx on
    real tensors, the inputs are written as the functionalized call writes them.

    The graph checks, before it runs, that its arguments are what it was captured for (sizes,
    strides, dtype, device, requires_grad, aliasing, non-tensor arguments) and raises naming the
    argument otherwise (Note [Capture: guards on inputs]). With ``dynamic=True`` the sizes are
    symbolic: see Note [Capture: dynamic sizes].

    Raises NotImplementedError, naming ``make_fx(functionalize(func))`` as the alternative, for
    wrapper subclasses (DTensor), symbolic shapes, active torch.func transforms, autocast and
    active TorchDispatchModes (FakeTensorMode).

    With ``reinplace=True`` the graph is then rewritten to write buffers in place where nothing
    can observe it (``torch_functionalize.reinplace``, Note [Reinplace: the rules])."""
    gm = _capture(func, args, kwargs, remove, dynamic)
    if reinplace:
        from .reinplace import reinplace as _reinplace
        return _reinplace(gm)
    return gm


def _capture(func: Callable[..., Any], args: tuple, kwargs: dict[str, Any], remove: Remove,
             dynamic: bool, graph_pass: Callable[[Any], Any] | None = None) -> fx.GraphModule:
    """capture's work; `graph_pass` (tests: the C++ reinplacing pass) rewrites the C++ graph
    before it becomes a GraphModule."""
    if not callable(func):
        raise TypeError(f"capture: expected a callable, got {type(func).__name__}.")
    check_remove(remove)
    arguments = Flat((args, kwargs))
    if dynamic:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
        try:
            return _capture_traced(func, args, kwargs, arguments, remove, "symbolic")
        except (GuardOnDataDependentSymNode, _ValueRead, IndexError) as error:
            # See Note [Capture: dynamic sizes]: a value read cannot be guarded by shapes. torch
            # 2.11's indexing refuses the unbacked symbol of a read itself ("got SymInt").
            if isinstance(error, IndexError) and "SymInt" not in str(error):
                raise
            raise NotImplementedError(
                "capture(dynamic=True): the function reads a value out of a tensor (.item(), "
                "bool(), int(), a data-dependent size) and branches or computes on it, which "
                "symbolic sizes cannot guard. Use capture(f) without dynamic=True, whose graphs "
                "guard each value read, or keep the value in a tensor (torch.where, torch.cond). "
                f"torch: {str(error).splitlines()[0]}") from error
    inputs = arguments.tensors()
    for t in inputs:
        if _is_wrapper_subclass(t):
            raise NotImplementedError(
                f"capture: a {type(t).__name__} input (a wrapper subclass) runs its own "
                "__torch_dispatch__ above the engine; use make_fx(functionalize(f)) for it.")
    result: list[Flat] = []  # the output, flattened

    def run(wrappers: list[torch.Tensor]) -> list[torch.Tensor]:
        # See Note [Graphs: generator state set outside the dispatcher].
        with generator_watch.watching(capture=True) as watch:
            out = Flat(call_with(func, arguments, wrappers))
            watch.finish()
        result.append(out)
        return out.tensors()

    rng = _RandomState()
    try:
        # See Note [Autograd: saved outputs under a tracer], the checkpoint case.
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            compiled_callables.install_if_dynamo_loaded()
            torchscript_plans.install()
            captured = _C._capture(inputs, remove, run)
    except NotImplementedError as error:
        if not any(m in str(error) for m in _THROUGH_MAKE_FX):
            raise
        # See Note [Capture: control flow]. The failed recording wrote no input.
        rng.restore()
        # Code the error stopped half-way may hold thread state in its frames: torch 2.11's
        # checkpoint keeps its saved-tensor hooks pushed inside a suspended generator, so the second
        # run packed into the first run's frame and recomputed with the first run's wrappers
        # ("escaped"). Clearing the frames closes such generators, which pops what they pushed.
        traceback.clear_frames(error.__traceback__)
        reason = str(error).splitlines()[0].removeprefix("capture: ")
        warnings.warn(
            f"capture: {reason} Recorded with make_fx(functionalize(f)) "
            "instead, which ran f a second time: Python side effects of f outside its tensors "
            "(an optimizer or scheduler made outside f) happened twice.", stacklevel=2)
        try:
            return _capture_traced(func, args, kwargs, arguments, remove, "real")
        except Exception as traced_error:
            raise NotImplementedError(
                f"capture: {reason} make_fx(functionalize(f)), which capture "
                f"used instead, failed too: {type(traced_error).__name__}: "
                f"{str(traced_error).splitlines()[0] if str(traced_error) else ''}"
            ) from traced_error
    out = result[0]
    if graph_pass is not None:
        captured = graph_pass(captured)
    return _graph_module(captured, func, args, kwargs, arguments.leaves, arguments.positions,
                         out.leaves, out.spec)


# Note [Capture: dynamic sizes]
# capture(f, ..., dynamic=True) returns a graph of symbolic sizes that replays on inputs of other
# sizes. The C++ recorder names concrete values only (its graphs hold sizes as constants, guarded
# by Note [Capture: guards on inputs]), so this mode traces make_fx(functionalize(f),
# tracing_mode="symbolic") on fake copies of the inputs (which are therefore not written) and
# gives the result capture's calling convention (f's pytrees in and out, its argument names) and
# guards: every shape condition the trace relied on, a size of 0 or 1 it specialized on, a branch
# on a size (`if x.shape[0] > 2`), static strides, becomes part of one guard expression from the
# trace's ShapeEnv, evaluated on each call with the ranks, dtypes, devices, requires_grad,
# aliasing and non-tensor arguments; a call that fails it raises naming the expression. A read of
# a value (.item()) is refused by name, whether make_fx fails the trace at it or lets it through
# as an unbacked symbol (an index x[i.item()], a torch._check on it: the graph kept the captured
# index, or dropped the check); a size that depends on values cannot be guarded by shapes.
# Rejected: symbolic sizes in the C++ recorder (each recorded size would
# need the ShapeEnv's symbols, i.e. a second tracer), and re-capturing on each new size (the
# cache and its invalidation are torch.compile's job).
# What the engine refuses under capture that make_fx records (Note [Capture: control flow]).
_THROUGH_MAKE_FX = ("(a higher-order operator) under capture", "autocast is enabled inside",
                   rng_state.THROUGH_MAKE_FX, generator_watch.SEEDS,
                   # See Note [Capture: composites taken whole under autograd].
                   "an op taken whole under capture with an argument that requires grad",
                   # See Note [Capture: saved-tensor hooks inside the function].
                   "saved-tensor hooks are active inside the function")


class _RandomState:
    """The random generators' state at the start of a capture, restored before it records
    again: the second run draws what the first drew, as one eager run does."""

    def __init__(self) -> None:
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


# Note [Capture: control flow]
# The recorder sees dispatcher ops only, so a higher-order operator (torch.cond, while_loop, map)
# would reach it as the ops of the branch taken: a graph right only for inputs that take that
# branch. capture therefore records such a program with make_fx(functionalize(f)) instead, which
# keeps the operator with functional subgraphs (Note [Control flow: higher-order operators]), on
# the real inputs (written as by the functionalized call, as capture writes them), and gives the
# graph capture's calling convention and input guards (exact sizes, as capture's own). The
# engine refuses the operator before running any of it, and the failed recording has written no
# input (writes to inputs happen in the epilogue), so the fallback starts from the same inputs
# and, with the random generators' state restored, draws the same numbers; Python side effects
# of f outside its tensors happen twice, which a warning says. The same holds for autocast
# inside f (Note [Capture: autocast inside the function]) and for a program that sets the random
# generator's state, refused mid-run, before its epilogue
# (Note [Graphs: random state saved and restored]), and for ops taken whole whose backward reads
# what their decomposition made (Note [Capture: composites taken whole under autograd]).
# Rejected: recording operators as nodes in C++ (their subgraphs need a tracer anyway).
def _capture_traced(func: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                    arguments: Flat, remove: Remove,
                    tracing_mode: Literal["real", "symbolic"]) -> fx.GraphModule:
    """capture through make_fx(functionalize(func)): symbolic sizes (Note [Capture: dynamic
    sizes]) or control flow (Note [Capture: control flow])."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .api import functionalize

    out_specs: list[Any] = []

    def flat_fn(*tensors: torch.Tensor) -> list[Any]:
        out = Flat(call_with(func, arguments, tensors))
        out_specs.append(out.spec)
        return out.leaves

    inputs = arguments.tensors()
    # The inputs as given: f may change their metadata or requires_grad (a write of a value that
    # requires grad), and the graph is called on inputs like these.
    metas = [_tensor_meta(t) for t in inputs]
    guards: Any = None if tracing_mode == "symbolic" else _C._input_guards(inputs)
    traced = make_fx(functionalize(flat_fn, remove=remove), tracing_mode=tracing_mode)(*inputs)
    if tracing_mode == "symbolic":
        # A value read that make_fx let through (an unbacked symbol used as an index, or only
        # checked with torch._check) specializes or drops what no shape guard checks: x[i.item()]
        # kept the captured index and a torch._check vanished, silently.
        reads = [n for n in traced.graph.nodes
                 if n.op == "call_function" and n.target is torch.ops.aten._local_scalar_dense.default]
        if reads:
            raise _ValueRead(f"the graph reads a value ({reads[0].name}) that symbolic sizes "
                             "cannot guard")
        # torch._check on a size that depends on values (nonzero's count) is a deferred runtime
        # assert of the trace's ShapeEnv, which make_fx leaves out of its graph: inserted, the
        # graph raises where eager's check does.
        fakes = [n.meta.get("val") for n in placeholders(traced.graph)]
        shape_env = next((v.fake_mode.shape_env for v in fakes
                          if getattr(getattr(v, "fake_mode", None), "shape_env", None)), None)
        if shape_env is not None:
            from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts
            insert_deferred_runtime_asserts(traced, shape_env, "capture")
            traced.recompile()
    traced_inputs = placeholders(traced.graph)
    orig_args, leaf_names, in_spec = _signature(func, args, kwargs)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    it = iter(traced_inputs)
    for i, name in enumerate(leaf_names):
        node = graph.placeholder(name)
        if i in arguments.positions:
            source = next(it)
            node.meta = dict(source.meta)
            env[source] = node
    graph.output(graph.graph_copy(traced.graph, env))
    graph._codegen = _CaptureCodeGen(_PyTreeInfo(orig_args, in_spec, out_specs[0]))
    restores_grad = _epilogue_without_grad(graph)
    gm = _CapturedModule(traced, graph)
    gm._tfz_restores_grad = restores_grad
    if tracing_mode == "symbolic":
        guards = _ShapeGuards([p.meta["val"] for p in traced_inputs], inputs, metas)
    gm._tfz_inputs = _InputCheck(guards, orig_args, len(args), kwargs, in_spec,
                                 arguments.positions, leaf_names, arguments.constants())
    return gm


class _ValueRead(Exception):
    """A symbolic trace read a value out of a tensor (see Note [Capture: dynamic sizes])."""


def _epilogue_without_grad(graph: fx.Graph) -> bool:
    """Runs the writes into graph inputs (the epilogue) with grad mode off, as the functionalized
    call does, so that a replay in grad mode may write leaves that require grad (parameters an
    optimizer stepped); make_fx's graphs record no grad mode (Note [Capture: grad mode] is the
    recorder's). Returns whether it changed the graph."""
    copy_ = torch.ops.aten.copy_.default
    writes = [n for n in graph.nodes if n.op == "call_function" and n.target is copy_
              and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"]
    if not writes:
        return False
    output = next(n for n in graph.nodes if n.op == "output")
    run_without_grad(graph, writes[0], output.prev)  # the mode given back at the graph's end
    return True


class _ShapeGuards:
    """The guards of a graph traced with symbolic sizes (Note [Capture: dynamic sizes]): ranks,
    dtypes, devices, requires_grad and aliasing as captured, and the ShapeEnv's expression."""

    def __init__(self, fakes: list[Any], inputs: list[torch.Tensor],
                 metas: list[tuple]) -> None:
        self.shape_env: Any = fakes[0].fake_mode.shape_env if fakes else None
        self.expression = (self.shape_env.produce_guards_expression(fakes, ignore_static=False)
                           if self.shape_env is not None else None)
        self.meta = metas  # read before the trace
        self.aliasing = _alias_groups(inputs)

    def check(self, tensors: list[torch.Tensor], names: list[str]) -> None:
        for t, meta, name in zip(tensors, self.meta, names):
            for what, then, now in zip(("rank", "dtype", "device", "requires_grad"), meta,
                                       _tensor_meta(t)):
                if then != now and not (what == "device" and "meta" in (then.type, now.type)):
                    raise RuntimeError(
                        f"capture: the graph was captured for {name} with {what} {then} and is "
                        f"called with {now}; capture again for these inputs.")
        if _alias_groups(tensors) != self.aliasing:
            raise RuntimeError(
                "capture: the graph was captured for inputs that share memory as "
                f"{self.aliasing} (input i: the first input sharing its memory) and is called "
                f"with {_alias_groups(tensors)}; capture again for these inputs.")
        if self.expression and not self.shape_env.evaluate_guards_expression(self.expression,
                                                                              tensors):
            readable = self.expression
            for i, name in reversed(list(enumerate(names))):
                readable = readable.replace(f"L['t{i}']", name)
            sizes = ", ".join(f"{n}: {tuple(t.shape)}" for n, t in zip(names, tensors))
            raise RuntimeError(
                f"capture: the graph was captured with dynamic=True under the shape guards "
                f"`{readable}`, which inputs of sizes {sizes} (and their strides) do not meet; "
                "capture again for these inputs (Note [Capture: dynamic sizes]).")


def _tensor_meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dim(), t.dtype, t.device, t.requires_grad)


def _alias_groups(tensors: list[torch.Tensor]) -> list[int]:
    first: dict[int, int] = {}
    groups = []
    for i, t in enumerate(tensors):
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            groups.append(-1)
            continue
        groups.append(first.setdefault(key, i))
    return groups


def _leaf_names(orig_args: list[str], args: tuple, kwargs: dict[str, Any]) -> list[str]:
    names = []
    for name, count in zip(orig_args, [len(pytree.tree_leaves(a)) for a in args] +
                           [len(pytree.tree_leaves(v)) for v in kwargs.values()]):
        names += [f"{name}_{k + 1}" for k in range(count)]
    return names


def graph_module_of(captured: Any) -> fx.GraphModule:
    """The FX GraphModule of a graph C++ recorded (``tfz::capture``, exposed to Python as
    ``_C._CapturedGraph``): flat tensors in, a list of tensors out, built exactly as ``capture``
    builds its own."""
    input_ids, _, _, outputs, _ = captured.export()
    args = tuple(range(len(input_ids)))  # stand-ins: one leaf per graph input
    out_leaves = [torch.empty(0)] * len(outputs)
    _, out_spec = pytree.tree_flatten(list(out_leaves))
    return _graph_module(captured, None, args, {}, list(args), list(range(len(args))),
                         out_leaves, out_spec)


def load_graph(path: str | os.PathLike[str]) -> fx.GraphModule:
    """The GraphModule of a graph a C++ program saved with ``tfz::save`` (its constants, the
    weights of a C++ model included, as attributes), called with the flat tensors it was captured
    with and guarded like it (Note [Serialize: a captured graph on disk]). ``example_inputs(gm)``
    makes inputs of the recorded geometry, for torch_functionalize.export."""
    captured = _C._load_graph(os.fspath(path))
    gm = graph_module_of(captured)
    gm._tfz_input_specs = captured.input_specs()  # type: ignore[assignment]
    return gm


def example_inputs(gm: fx.GraphModule) -> tuple[torch.Tensor | None, ...]:
    """Zero-filled inputs of the geometry a loaded graph (load_graph) was captured with."""
    specs = getattr(gm, "_tfz_input_specs", None)
    if specs is None:
        raise ValueError("example_inputs: not a graph read by torch_functionalize.load_graph")
    out: list[torch.Tensor | None] = []
    for spec in specs:
        if spec is None:
            out.append(None)
            continue
        sizes, strides, offset, dtype, device, requires_grad = spec
        extent = offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1 if all(sizes) \
            else 0
        storage = torch.zeros(extent, dtype=dtype, device=device)
        view = storage.as_strided(sizes, strides, offset).detach()  # a leaf: requires_grad_ works
        out.append(view.requires_grad_(requires_grad))
    return tuple(out)


def _call_tree(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The pytree a captured graph is called with: its positional arguments, and its keyword
    arguments where it has any."""
    return (tuple(args), kwargs) if kwargs else tuple(args)


def _signature(func: Callable[..., Any] | None, args: tuple,
               kwargs: dict[str, Any]) -> tuple[list[str], list[str], Any]:
    """A captured graph's argument names, the names of its placeholders (one per leaf of the
    arguments) and the structure of the arguments it is called with."""
    orig_args = _argument_names(func, len(args)) + list(kwargs)
    return (orig_args, _leaf_names(orig_args, args, kwargs),
            pytree.tree_structure(_call_tree(args, kwargs)))


def _argument_names(func: Callable[..., Any] | None, n: int) -> list[str]:
    """Names for the graph's positional arguments: func's own, as make_fx names them, where its
    signature has them; arg0, arg1, ... otherwise."""
    try:
        params = list(inspect.signature(func).parameters.values()) if func is not None else []
    except (TypeError, ValueError):
        params = []
    named = []
    for p in params[:n]:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        named.append(p.name)
    return named + [f"arg{i}" for i in range(len(named), n)]


def _graph_module(captured: Any, func: Callable[..., Any] | None, args: tuple,
                  kwargs: dict[str, Any], flat: list[Any], positions: list[int],
                  out_leaves: list[Any], out_spec: Any) -> fx.GraphModule:
    input_ids, constants, nodes, outputs, start_grad = captured.export()
    graph = fx.Graph()
    root = torch.nn.Module()
    env: dict[int, Any] = {}  # value id -> fx.Node, or (node, path) for a result not yet read
    input_of = dict(zip(positions, input_ids))
    orig_args, leaf_names, in_spec = _signature(func, args, kwargs)
    # Names passed explicitly throughout: FX derives a missing one with a regex (~4 us a node).
    for i in range(len(flat)):
        ph = graph.create_node("placeholder", leaf_names[i], name=leaf_names[i])
        if i in input_of:
            env[input_of[i]] = ph
    constant_of = {cid: (t, wrapped) for cid, t, wrapped in constants}
    ValueRef = _C._ValueRef
    getitem = operator.getitem

    def value(ref: Any) -> Any:
        node = env.get(ref.id)
        if node is None:
            t, wrapped = constant_of[ref.id]
            if wrapped:  # a Python number the arg parser wrapped: back to the number
                return t.item()
            name = f"_tensor_constant{len(root._buffers)}"
            root.register_buffer(name, t)
            node = env[ref.id] = graph.create_node("get_attr", name, name=name)
        elif isinstance(node, tuple):  # materialize getitem only for results someone reads
            node = env[ref.id] = graph.create_node("call_function", getitem, node, name="getitem")
        return node

    def convert(a: Any) -> Any:
        if isinstance(a, ValueRef):
            return value(a)
        if isinstance(a, list):
            return [convert(x) for x in a]
        # No literal for these in generated code: an attribute (a quantized op's packed weights
        # are TorchScript objects).
        if isinstance(a, (torch.Generator, torch.ScriptObject)):
            kind = "generator" if isinstance(a, torch.Generator) else "script_object"
            name = f"_{kind}_constant{len(attributes)}"
            attributes.append(name)
            setattr(root, name, a)
            return graph.create_node("get_attr", name, name=name)
        return a

    attributes: list[str] = []

    # See Note [Capture: grad mode].
    ambient = None  # the node reading the caller's grad mode, made when first needed
    grad = start_grad
    for qualified, overload, node_args, node_kwargs, returns, node_grad in nodes:
        if node_grad != grad:
            if ambient is None:
                ambient = graph.create_node("call_function", torch.is_grad_enabled, (),
                                            name="grad_enabled")
            mode = ambient if node_grad == start_grad else node_grad
            graph.create_node("call_function", torch._C._set_grad_enabled, (mode,),
                              name="set_grad_enabled")
            grad = node_grad
        op, name = _resolve(qualified, overload)
        n = graph.create_node(
            "call_function", op, tuple(convert(a) for a in node_args),
            {k: convert(v) for k, v in node_kwargs.items()}, name=name)
        if len(returns) == 1 and isinstance(returns[0], ValueRef):
            env[returns[0].id] = n
            continue
        for j, r in enumerate(returns):
            if isinstance(r, ValueRef):
                env[r.id] = (n, j)
            elif isinstance(r, list):
                base = n if len(returns) == 1 else graph.create_node(
                    "call_function", getitem, (n, j), name="getitem")
                for k, e in enumerate(r):
                    env[e.id] = (base, k)
    if grad != start_grad:
        graph.create_node("call_function", torch._C._set_grad_enabled, (ambient,),
                          name="set_grad_enabled")
    out_iter = iter(outputs)
    graph.output([convert(next(out_iter)) if isinstance(x, torch.Tensor) else x
                  for x in out_leaves])
    graph._codegen = _CaptureCodeGen(_PyTreeInfo(orig_args, in_spec, out_spec))
    # See Note [Capture: code generated on first use]; a graph that switches grad mode gives it
    # back to the caller even when it raises (Note [Capture: grad mode]).
    gm = _CapturedModule(root, graph)
    gm._tfz_restores_grad = ambient is not None
    # See Note [Capture: guards on inputs].
    constants = {} if func is None else {
        i: leaf for i, leaf in enumerate(flat) if i not in input_of}
    gm._tfz_inputs = _InputCheck(captured.input_guards(), orig_args, len(args), kwargs, in_spec,
                                 positions, leaf_names, constants)
    # graph_module_of's stand-in leaves are not the inputs: reinplace then asks for them.
    gm._tfz_input_layout = InputLayout(flat) if func is not None else None
    return gm


class _InputCheck:
    """What a captured graph specialized on in its call's arguments: the pytree structure, the
    non-tensor leaves (constants in the graph) and the tensors' metadata and aliasing (checked
    in C++). See Note [Capture: guards on inputs]."""

    def __init__(self, guards: Any, names: list[str], num_positional: int,
                 kwargs: dict[str, Any], spec: Any, positions: list[int], leaf_names: list[str],
                 constants: dict[int, Any]) -> None:
        self.guards, self.names, self.num_positional = guards, names, num_positional
        self.keywords = tuple(kwargs)
        self.spec, self.positions, self.leaf_names = spec, positions, leaf_names
        self.tensor_names = [leaf_names[i] for i in positions]
        self.constants = constants
        # Every argument is one leaf (tensors and numbers passed positionally, the common call):
        # the call's arguments are its leaves, without flattening (a few microseconds a call).
        self.leaf_args = not kwargs and spec.num_leaves == num_positional
        # Arguments that are tensors or lists/tuples of tensors (an optimizer's parameter and
        # state lists): their leaves are the lists' concatenation, read in one loop where
        # pytree visits each of them as a node (~240 us a call for 500 tensors, as much again as
        # the guards). The captured shape of each argument: None for a tensor, else the
        # sequence's type and length, _CONSTANT for a number; None where any other structure was
        # captured.
        self.sequence_shapes = _sequence_shapes(spec, num_positional, set(positions)) \
            if not kwargs else None

    def check(self, args: tuple, kwargs: dict[str, Any]) -> None:
        flat: Sequence[Any] | None = None
        if not kwargs and len(args) == self.num_positional:
            if self.leaf_args:
                if all(isinstance(args[i], torch.Tensor) for i in self.positions):
                    flat = args
            elif self.sequence_shapes is not None:
                flat = _tensor_sequence_leaves(args, self.sequence_shapes)
        if flat is None:
            flat = self._flat(args, kwargs)
            for i, name in zip(self.positions, self.tensor_names):
                if not isinstance(flat[i], torch.Tensor):
                    raise TypeError(
                        f"capture: the graph was captured with a tensor for {name} and is called "
                        f"with {type(flat[i]).__name__} {flat[i]!r}; pass a tensor, or capture "
                        "again for this argument.")
        for i, expected in self.constants.items():
            if not _same_constant(flat[i], expected):
                raise ValueError(
                    f"capture: the graph was captured with {self.leaf_names[i]} = {expected!r}, a "
                    f"constant in the graph, and is called with {flat[i]!r}; pass it as a tensor "
                    "or capture again for this value (Note [Capture: guards on inputs]).")
        self.guards.check([flat[i] for i in self.positions], self.tensor_names)

    def _flat(self, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        if tuple(kwargs) != self.keywords or len(args) != self.num_positional:
            args, kwargs = self._rebind(args, kwargs)
        flat, spec = pytree.tree_flatten(_call_tree(args, kwargs))
        if spec != self.spec:
            raise TypeError(
                "capture: the graph was captured for arguments of structure "
                f"{self.spec} and is called with {spec}; capture again for these arguments.")
        return flat

    def _rebind(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The call's arguments in the form the graph was captured with (positional names bound
        from keywords and the reverse), as Python binds them to the captured function."""
        given = dict(zip(self.names, args))
        for k, v in kwargs.items():
            if k in given:
                raise TypeError(f"capture: the graph got multiple values for argument '{k}'.")
            given[k] = v
        if len(args) > len(self.names) or set(given) != set(self.names):
            raise TypeError(
                f"capture: the graph takes the arguments ({', '.join(self.names)}) it was captured "
                f"with; got {len(args)} positional and keywords {sorted(kwargs)}.")
        positional = tuple(given[n] for n in self.names[:self.num_positional])
        return positional, {k: given[k] for k in self.keywords}


_CONSTANT = "constant"  # a positional argument captured as a number (a constant of the graph)
_NUMBERS = (int, float, bool, complex)


def _sequence_shapes(spec: Any, num_positional: int, tensor_leaves: set[int]
                     ) -> list[tuple[type, int] | str | None] | None:
    """Per positional argument of a captured call's pytree: None for a tensor, _CONSTANT for a
    number, (list or tuple, its length) for a sequence of tensors; None for the whole where
    anything else was captured. `tensor_leaves`: the leaf indices that were tensors."""
    def children(node: Any) -> list[Any]:
        # TreeSpec.children() is newer than torch 2.11, where children_specs (deprecated since)
        # is the only form.
        return list(node.children()) if hasattr(node, "children") else list(node.children_specs)

    if spec.type is not tuple or len(children(spec)) != num_positional:
        return None
    shapes: list[tuple[type, int] | str | None] = []
    leaf = 0
    for child in children(spec):
        grandchildren = children(child)
        if child.is_leaf():
            shapes.append(None if leaf in tensor_leaves else _CONSTANT)
            leaf += 1
        elif child.type in (list, tuple) and all(c.is_leaf() for c in grandchildren) and \
                all(i in tensor_leaves for i in range(leaf, leaf + len(grandchildren))):
            shapes.append((child.type, len(grandchildren)))
            leaf += len(grandchildren)
        else:
            return None
    return shapes


def _tensor_sequence_leaves(args: Sequence[Any], shapes: list[tuple[type, int] | str | None]
                            ) -> list[Any] | None:
    """The leaves of `args` where each argument is a tensor, a number or a list/tuple of tensors
    shaped as captured (`shapes`); None otherwise (pytree then flattens the call and names a
    mismatch)."""
    flat: list[Any] = []
    for arg, shape in zip(args, shapes):
        if shape is None:
            if not isinstance(arg, torch.Tensor):
                return None
            flat.append(arg)
        elif shape is _CONSTANT:
            if type(arg) not in _NUMBERS:
                return None
            flat.append(arg)  # compared with the captured constant by the check
        elif type(arg) is shape[0] and len(arg) == shape[1]:
            for t in arg:
                if not isinstance(t, torch.Tensor):
                    return None
            flat.extend(arg)
        else:
            return None
    return flat


def _same_constant(actual: Any, expected: Any) -> bool:
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, float) and expected != expected:
        return actual != actual
    try:
        return bool(actual == expected)
    except Exception:
        return actual is expected


class _CapturedModule(_LazyGraphModule):
    """A captured graph: checks its arguments against what it was captured with, then runs
    (Note [Capture: guards on inputs]); one that switches grad mode restores the caller's however
    the call ends (a guard that raises inside a no_grad region of f would otherwise leave grad
    mode off; Note [Capture: grad mode])."""

    _tfz_restores_grad = False
    _tfz_inputs: _InputCheck | None = None
    _tfz_has_copy: bool | None = None  # None: not looked for yet
    _tfz_differentiable: fx.GraphModule | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._tfz_inputs is not None:
            self._tfz_inputs.check(args, kwargs)
        run = super().__call__
        # See Note [Graphs: copy's derivative when a graph runs under autograd]: the graph is read
        # for aten.copy once, and its twin made on the first call that needs it.
        if torch.is_grad_enabled():
            if self._tfz_has_copy is None:
                object.__setattr__(self, "_tfz_has_copy", has_copy(self))
            if self._tfz_has_copy and any(isinstance(t, torch.Tensor) and t.requires_grad
                                          for t in pytree.tree_leaves((args, kwargs))):
                if self._tfz_differentiable is None:  # not a submodule: no state of the graph's
                    object.__setattr__(self, "_tfz_differentiable", with_copy_derivative(self))
                run = self._tfz_differentiable
        if self._tfz_restores_grad:
            with torch.set_grad_enabled(torch.is_grad_enabled()):
                return run(*args, **kwargs)
        return run(*args, **kwargs)


# Note [Capture: grad mode]
# A capture records each op with the grad mode it ran under: a no_grad block inside f (an
# optimizer's update of parameters that require grad), and autograd's backward, which runs its
# nodes with grad mode off. Replayed in one mode, the graph lost that: its epilogue wrote a leaf
# that requires grad in grad mode (eager's leaf check raised), and ops under no_grad recorded
# history eager's do not. So where the mode changes between recorded ops, the graph sets it
# (torch._C._set_grad_enabled, as make_fx's pre-dispatch graphs do), relative to the caller's:
# an op recorded in the mode the capture started under runs in the caller's mode (the graph
# reads it once, torch.is_grad_enabled()), any other in its recorded mode, and the graph ends in
# the caller's mode, also when it raises (the module restores it; FX code has no finally).
# tfz::CapturedGraph replays the same way. Rejected: absolute modes (a graph
# called under no_grad would turn grad mode on for the ops f ran in its caller's mode).


# Note [Capture: overloads named by a keyword]
# FX writes an OpOverload target as its qualified name, so aten.random.from (random_(from, to)'s
# functional form) becomes `torch.ops.aten.random.from(...)` in the generated code: a
# SyntaxError when the module first runs (make_fx's graphs have the same bug, upstream). Capture's
# graphs generate their code with a CodeGen that writes such a name as
# getattr(torch.ops.aten.random, 'from'), which is the same object, so the node's target stays
# the OpOverload for every pass that reads it.
# Rejected: a Python function as the node's target (graph passes look for OpOverloads).
_KEYWORD_OVERLOAD = re.compile(r"\b(torch\.ops\.\w+\.\w+)\.(" + "|".join(keyword.kwlist) + r")\b")


# Note [Capture: the generated code's flatten]
# FX's generated forward starts by flattening its arguments with torch.fx._pytree's
# tree_flatten_spec, which visits every leaf as a pytree node: about 1 ms a call for an
# optimizer step over 500 tensors (five lists of 100), a third of eager's whole step. The
# arguments were just checked by _InputCheck, which knows their captured shape, so the code
# capture generates calls _flatten_arguments instead: where every argument is a tensor or a
# list/tuple of tensors shaped as captured, their concatenation (one loop), else FX's own
# flatten, which also raises FX's errors for other structures. A module that is not capture's
# (a copy without the check) takes FX's flatten too. Rejected: a graph of flat arguments behind
# a wrapper (gm.code, the signature and every pass reading placeholders would change).
_FX_FLATTEN = "fx_pytree.tree_flatten_spec("


def _flatten_arguments(module: Any, tree: Any, spec: Any) -> list[Any]:
    check = getattr(module, "_tfz_inputs", None)
    shapes = check.sequence_shapes if check is not None else None
    if shapes is not None and type(tree) is list and len(tree) == len(shapes):
        flat = _tensor_sequence_leaves(tree, shapes)
        if flat is not None:
            return flat
    return fx_pytree.tree_flatten_spec(tree, spec)


class _CaptureCodeGen(_PyTreeCodeGen):
    def _gen_python_code(self, *args: Any, **kwargs: Any) -> Any:
        code = super()._gen_python_code(*args, **kwargs)
        code.src = _KEYWORD_OVERLOAD.sub(r"getattr(\1, '\2')", code.src)
        if _FX_FLATTEN in code.src:  # Note [Capture: the generated code's flatten]
            code.src = code.src.replace(_FX_FLATTEN, "_tfz_flatten_arguments(self, ", 1)
            code.globals["_tfz_flatten_arguments"] = _flatten_arguments
        return code


# Note [Capture: code generated on first use]
# An FX GraphModule turns its graph into Python source and compiles it when built: about 25 us a
# node, half of what capture costs altogether, and wasted when the graph goes to a compiler or an
# exporter, which read gm.graph and never run the generated code. capture returns FX's
# _LazyGraphModule (a GraphModule subclass, what torch.compile uses for its own graphs), which
# generates the code on the first call, `.code` or `print_readable()`. benchmarks/ reports the
# time with and without that first code generation. Rejected: a GraphModule built eagerly
# (make_fx's default), paying for code nobody may run.
