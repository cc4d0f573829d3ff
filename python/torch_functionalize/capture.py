"""capture(f, *args, remove=..., **kwargs): f's functional program as an FX GraphModule, recorded
by the C++ engine while it functionalizes f (no make_fx, no proxy tensors). C++ records the ops
(see Note [Capture: how ops are recorded]); this file turns its node list into FX: pytrees in and
out, closure tensors as ``get_attr`` constants, multi-output ops through ``operator.getitem``.
"""
import inspect
import keyword
import operator
import re
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.utils import _pytree as pytree

from . import _C
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
            **kwargs: Any) -> fx.GraphModule:
    """Runs ``functionalize(func, remove=remove)(*args, **kwargs)`` once and returns the functional
    program it ran as an ``fx.GraphModule`` of ATen ops (called with the same pytrees as ``func``),
    recorded in C++ as it runs: the program ``make_fx(functionalize(func))`` records, without the
    cost of Python tracing, minus the nodes nothing uses, and with remove="mutations" an epilogue
    that writes back only the regions of an input the program wrote. Inputs may be ``meta`` tensors (nothing is computed). As with make_fx on
    real tensors, the inputs are written as the functionalized call writes them.

    Raises NotImplementedError, naming ``make_fx(functionalize(func))`` as the alternative, for
    wrapper subclasses (DTensor), symbolic shapes, active torch.func transforms, autocast and
    active TorchDispatchModes (FakeTensorMode)."""
    if not callable(func):
        raise TypeError(f"capture: expected a callable, got {type(func).__name__}.")
    check_remove(remove)
    flat, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    inputs = [flat[i] for i in positions]
    for t in inputs:
        if _is_wrapper_subclass(t):
            raise NotImplementedError(
                f"capture: a {type(t).__name__} input (a wrapper subclass) runs its own "
                "__torch_dispatch__ above the engine; use make_fx(functionalize(f)) for it.")
    result: list = []

    def run(wrappers: list) -> list:
        leaves = list(flat)
        for i, w in zip(positions, wrappers):
            leaves[i] = w
        f_args, f_kwargs = pytree.tree_unflatten(leaves, spec)
        out = func(*f_args, **f_kwargs)
        out_leaves, out_spec = pytree.tree_flatten(out)
        result.append((out_leaves, out_spec))
        return [x for x in out_leaves if isinstance(x, torch.Tensor)]

    captured = _C._capture(inputs, remove, run)
    out_leaves, out_spec = result[0]
    return _graph_module(captured, func, args, kwargs, flat, positions, out_leaves, out_spec)


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


def _argument_names(func: Callable[..., Any], n: int) -> list[str]:
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


def _graph_module(captured: Any, func: Callable[..., Any], args: tuple, kwargs: dict, flat: list,
                  positions: list, out_leaves: list, out_spec: Any) -> fx.GraphModule:
    input_ids, constants, nodes, outputs, start_grad = captured.export()
    graph = fx.Graph()
    root = torch.nn.Module()
    env: dict[int, Any] = {}  # value id -> fx.Node, or (node, path) for a result not yet read
    input_of = dict(zip(positions, input_ids))
    orig_args = _argument_names(func, len(args)) + list(kwargs)
    leaf_names = []
    for name, leaf_count in zip(orig_args, [len(pytree.tree_leaves(a)) for a in args] +
                                [len(pytree.tree_leaves(v)) for v in kwargs.values()]):
        leaf_names += [f"{name}_{k + 1}" for k in range(leaf_count)]
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
        if isinstance(a, torch.Generator):  # no literal for it in generated code: an attribute
            name = f"_generator_constant{len(generators)}"
            generators.append(name)
            setattr(root, name, a)
            return graph.create_node("get_attr", name, name=name)
        return a

    generators: list[str] = []

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
    in_spec = pytree.tree_flatten((tuple(args), kwargs) if kwargs else tuple(args))[1]
    graph._codegen = _CaptureCodeGen(_PyTreeInfo(orig_args, in_spec, out_spec))
    # See Note [Capture: code generated on first use]; a graph that switches grad mode gives it
    # back to the caller even when it raises (Note [Capture: grad mode]).
    module_type = _GradModeRestoringModule if ambient is not None else _LazyGraphModule
    return module_type(root, graph)


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


class _GradModeRestoringModule(_LazyGraphModule):
    """A captured graph that switches grad mode: the caller's mode is restored however the call
    ends (a guard that raises inside a no_grad region of f would otherwise leave grad mode off)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            return super().__call__(*args, **kwargs)


# Note [Capture: overloads named by a keyword]
# FX writes an OpOverload target as its qualified name, so aten.random.from (random_(from, to)'s
# functional form) becomes `torch.ops.aten.random.from(...)` in the generated code: a
# SyntaxError when the module first runs (make_fx's graphs have the same bug, upstream; the
# fuzzer's largest class of graph errors, ~1.2% of its programs). Capture's graphs generate their
# code with a CodeGen that writes such a name as getattr(torch.ops.aten.random, 'from'), which
# is the same object, so the node's target stays the OpOverload for every pass that reads it.
# Rejected: a Python function as the node's target (graph passes look for OpOverloads).
_KEYWORD_OVERLOAD = re.compile(r"\b(torch\.ops\.\w+\.\w+)\.(" + "|".join(keyword.kwlist) + r")\b")


class _CaptureCodeGen(_PyTreeCodeGen):
    def _gen_python_code(self, *args: Any, **kwargs: Any) -> Any:
        code = super()._gen_python_code(*args, **kwargs)
        code.src = _KEYWORD_OVERLOAD.sub(r"getattr(\1, '\2')", code.src)
        return code


# Note [Capture: code generated on first use]
# An FX GraphModule turns its graph into Python source and compiles it when built: about 25 us a
# node, half of what capture costs altogether, and wasted when the graph goes to a compiler or an
# exporter, which read gm.graph and never run the generated code. capture returns FX's
# _LazyGraphModule (a GraphModule subclass, what torch.compile uses for its own graphs), which
# generates the code on the first call, `.code` or `print_readable()`. benchmarks/ reports the
# time with and without that first code generation. Rejected: a GraphModule built eagerly
# (make_fx's default), paying for code nobody may run.
