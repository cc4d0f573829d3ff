"""functionalize_graph: turn a possibly mutating FX graph into an equivalent functional one.

A thin wrapper over `capture` (or `functionalize` + `make_fx` for fake inputs): it lifts module state (parameters, buffers,
tensor attributes) to inputs so that state mutations become epilogue copies like input mutations,
retraces, and turns the lifted inputs back into attributes. It does not optimize or reorder.
"""
from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo

from ._fx import concrete, example_value, has_example_value, placeholders, sizes_and_strides
from ._tree import Flat

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .api import Remove

_log = logging.getLogger("torch_functionalize")


# NB: the result is called like `gm` and uses gm's own parameters and buffers (not copies); a
# mutation of module state becomes a trailing copy_ into that attribute. With example inputs the
# graph is traced on copies of them (real mode, so data-dependent ops work); without, on fake
# tensors built from the placeholders' meta values. Either way it is specialized to those shapes.
def functionalize_graph(
    gm: torch.fx.GraphModule | torch.export.ExportedProgram,
    *example_inputs: Any,
    remove: Remove = "mutations",
) -> torch.fx.GraphModule:
    """Retrace `gm` (a GraphModule or ExportedProgram) into an equivalent functional GraphModule."""
    # Imported lazily: the package __init__ re-exports this module, and api imports the engine.
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    from .api import check_remove, functionalize
    from .capture import capture

    module = _as_graph_module(gm)
    check_remove(remove)

    tracing_mode: Literal["real", "fake"]
    if example_inputs:
        args = tuple(example_inputs)
        # A SymInt is dynamo's symbolic size (a graph of sizes alone: `s0 * 2`).
        is_fake = any(isinstance(a, (FakeTensor, torch.SymInt)) for a in pytree.tree_leaves(args))
        tracing_mode = "fake" if is_fake else "real"
    else:
        args, tracing_mode = _inputs_from_meta(module), "fake"

    targets, state = _collect_state(module)
    if tracing_mode == "real":
        # make_fx in real mode executes the program, epilogue included: trace on copies so
        # neither the caller's inputs nor the module's buffers are mutated.
        traced_state, args = _clone_preserving_aliases((state, args))
    else:
        # Detached like the copies above, so autograd adds no ops (detach) to either trace.
        traced_state = [t.detach() for t in state]

    num_state = len(state)
    state_names = [(name, index) for index, names in enumerate(targets) for name in names]

    def run(*state_and_args: Any) -> Any:
        params = {name: state_and_args[index] for name, index in state_names}
        return torch.func.functional_call(module, params, tuple(state_and_args[num_state:]))

    # Fake inputs may carry symbolic sizes (dynamo's): symbolic-size rules of view ops such as
    # slice_copy live in Python kernels, reached only through the Python dispatcher (make_fx
    # enables it for tracing_mode="symbolic"; AOTAutograd does the same for dynamo's graphs).
    traced: torch.fx.GraphModule | None = None
    traced_by = "make_fx (fake example inputs)"
    if tracing_mode == "real":  # See Note [Graph: capture first]
        try:
            traced, traced_by = capture(run, *traced_state, *args, remove=remove), "capture"
        except NotImplementedError as error:
            traced_by = f"make_fx ({str(error).splitlines()[0]})"
            _log.info("functionalize_graph: capture does not apply, using make_fx: %s", error)
    if traced is None and tracing_mode == "fake":
        traced = _trace_on_fake_inputs(functionalize(run, remove=remove), *traced_state, *args)
    elif traced is None:
        traced = make_fx(functionalize(run, remove=remove))(*traced_state, *args)
    result = _lifted_state_to_attributes(traced, [names[0] for names in targets], state, args)
    if tracing_mode == "real":
        result = _guarded(result, args)
    result.meta["tfz_traced_by"] = traced_by
    return result.train(module.training)


# Note [Graph: capture first]
# With real example inputs the program is recorded by capture (C++, no proxy tensors: about a
# tenth of make_fx's time); what capture refuses (wrapper subclasses, autocast, modes, symbolic
# sizes) falls back to make_fx, logged at INFO on the "torch_functionalize" logger and written to
# the result's meta["tfz_traced_by"]. Fake example inputs and inputs rebuilt from placeholder
# metadata keep make_fx: FakeTensors need their mode and may carry symbolic sizes, and compilers
# downstream of dynamo read the meta["val"] that make_fx writes on every node. Rejected: capture
# on meta tensors in place of fake ones (no symbolic sizes, and constants made inside the program
# would be real tensors mixed with meta ones).


# Note [Graph: tracing on fake inputs as they are]
# make_fx(tracing_mode="fake") passes every input through its fake mode's from_tensor, which makes
# even a FakeTensor of that very mode anew: an input that is a view (dynamo's fake value of a view
# of a larger buffer, or of an overlapping as_strided view) comes back as a tensor of its own,
# whose storage ends where its elements do. The engine reads storage coordinates of its inputs
# (the flat base of an input whose elements overlap, the layout guards, an input that does not
# start its storage: Note [Inputs: storage coordinates under a tracer]), so the graph was traced
# on another layout than the one it runs on: it refused the real input (a storage of 64 bytes,
# traced with 52) or wrote the base in the wrong coordinates (a raw as_strided_scatter error).
# Fake inputs are therefore traced as they are, as AOTAutograd traces dynamo's: make_fx in its
# "real" mode inside the inputs' fake mode (and the Python dispatcher, for the symbolic-size rules
# of view ops that live in Python kernels), with only real tensors (module state) converted.
# Rejected: tracing_mode="fake" with the views' bases passed too (a calling convention change of
# the graph, and the fake values' bases are not always there to pass).
def _trace_on_fake_inputs(fn: Any, *inputs: Any) -> torch.fx.GraphModule:
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    # The inputs' own mode: dynamo's tracing context may hold another one when it calls a backend.
    # Without a fake tensor among them (sizes alone), the mode of the context the SymInts come
    # from; without any, factories inside the program make the fake values in a mode of make_fx's.
    mode = next((t.fake_mode for t in pytree.tree_leaves(inputs) if isinstance(t, FakeTensor)),
                None) or detect_fake_mode()
    if mode is None:
        with enable_python_dispatcher():
            return make_fx(fn, tracing_mode="fake")(*inputs)
    converted = pytree.tree_map_only(
        torch.Tensor, lambda t: t if isinstance(t, FakeTensor) else mode.from_tensor(t), inputs)
    with enable_python_dispatcher(), mode:
        return make_fx(fn, tracing_mode="real")(*converted)


def _as_graph_module(gm: object) -> torch.fx.GraphModule:
    """Return the GraphModule behind `gm`, unlifting an ExportedProgram."""
    if isinstance(gm, torch.export.ExportedProgram):
        gm = gm.module()
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            "functionalize_graph: expected a torch.fx.GraphModule or torch.export.ExportedProgram; "
            f"got {type(gm).__name__}. Trace the callable first (torch.fx.symbolic_trace, make_fx, "
            "torch.export), or call functionalize(f) on it directly."
        )
    return gm


def _inputs_from_meta(gm: torch.fx.GraphModule) -> tuple:
    """Build fake example inputs, in a fresh FakeTensorMode, from the placeholders' meta values."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    inputs = placeholders(gm.graph)
    missing = [n.name for n in inputs if not has_example_value(n)]
    if missing:
        raise ValueError(
            "functionalize_graph: no example inputs were given and placeholder(s) "
            f"{', '.join(missing)} carry no meta['val']; pass example inputs, "
            "e.g. functionalize_graph(gm, *inputs)."
        )
    # A fresh mode with static shapes: the values may come from another (symbolic) mode, which we
    # must not extend with new guards. The result is specialized to the recorded shapes.
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    flat = [_fresh_value(example_value(n), fake_mode) for n in inputs]

    codegen = gm.graph._codegen
    if not isinstance(codegen, _PyTreeCodeGen):
        return tuple(flat)
    # A pytree signature (torch.export's .module(), make_fx of nested inputs): rebuild the structure
    # the generated forward() flattens.
    structured = pytree.tree_unflatten(flat, codegen.pytree_info.in_spec)
    if _is_args_kwargs_spec(codegen.pytree_info.in_spec):
        args, kwargs = structured
        if kwargs:
            raise ValueError(
                "functionalize_graph: graphs with keyword inputs are not supported; got keyword "
                f"inputs {sorted(kwargs)}. Export the program with positional inputs only."
            )
        return tuple(args)
    return tuple(structured)


def _fresh_value(value: Any, fake_mode: FakeTensorMode) -> Any:
    """A concrete-shaped stand-in for `value` that lives in `fake_mode`."""
    if not isinstance(value, torch.Tensor):
        return concrete(value)  # a number (a symbolic one: its hint) or another constant
    size, stride = sizes_and_strides(value)
    with fake_mode:
        return torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)


def _is_args_kwargs_spec(spec: Any) -> bool:
    """True when `spec` is the (args, kwargs) form that _PyTreeCodeGen treats specially."""
    return (
        spec.type is tuple
        and spec.num_children == 2
        and spec.child(0).type is tuple
        and spec.child(1).type is dict
    )


def _collect_state(gm: torch.fx.GraphModule) -> tuple[list[list[str]], list[torch.Tensor]]:
    """Unique state tensors of `gm` and, for each, every attribute name it is reachable under."""
    targets: list[list[str]] = []
    state: list[torch.Tensor] = []
    index_of: dict[int, int] = {}

    def add(name: str, tensor: torch.Tensor) -> None:
        index = index_of.get(id(tensor))
        if index is None:
            index_of[id(tensor)] = len(state)
            state.append(tensor)
            targets.append([name])
        elif name not in targets[index]:
            targets[index].append(name)

    named = itertools.chain(
        gm.named_parameters(remove_duplicate=False), gm.named_buffers(remove_duplicate=False)
    )
    for name, tensor in named:
        add(name, tensor)
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _fetch_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                add(node.target, value)
    return targets, state


def _clone_preserving_aliases(tree: Any) -> Any:
    """Copy every tensor in `tree`, keeping strides, offsets and aliasing between tensors."""
    storages: dict[tuple[torch.device, int], torch.UntypedStorage] = {}

    def clone(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.layout != torch.strided or t.device.type == "meta":
            return t.detach().clone()
        if t.untyped_storage().nbytes() == 0:
            return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        key = (t.device, t.untyped_storage().data_ptr())
        if key not in storages:
            storages[key] = t.untyped_storage().clone()
        out = torch.empty(0, dtype=t.dtype, device=t.device)
        return out.set_(storages[key], t.storage_offset(), t.size(), t.stride())

    return pytree.tree_map(clone, tree)


def _fetch_attr(module: Any, target: str) -> Any:
    """getattr over a dotted attribute path."""
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _assign_attr(root: torch.nn.Module, target: str, value: Any) -> None:
    """Set a dotted attribute (tensors as parameters or buffers), creating submodules on the way."""
    *path, field = target.split(".")
    for part in path:
        if not hasattr(root, part):
            root.add_module(part, torch.nn.Module())
        root = getattr(root, part)
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        if hasattr(root, field) and field not in root._buffers:
            delattr(root, field)
        root.register_buffer(field, value)
    else:
        setattr(root, field, value)


def _guarded(result: torch.fx.GraphModule, args: tuple) -> torch.fx.GraphModule:
    """The graph, checking on each call that its arguments are like the real example inputs it
    was traced on (Note [Capture: guards on inputs]): its sizes are theirs."""
    from . import _C
    from .capture import _CapturedModule, _InputCheck

    guarded = _CapturedModule(result, result.graph)
    guarded.meta.update(result.meta)
    arguments = Flat(tuple(args))
    names = [n.name for n in placeholders(result.graph)]
    if len(names) != len(arguments.leaves):
        names = [f"arg{i}" for i in range(len(arguments.leaves))]
    codegen = result.graph._codegen
    arg_names = codegen.pytree_info.orig_args if isinstance(codegen, _PyTreeCodeGen) else names
    guarded._tfz_inputs = _InputCheck(_C._input_guards(arguments.tensors()), list(arg_names),
                                      len(args), {}, arguments.spec, arguments.positions, names,
                                      arguments.constants())
    return guarded


def _lifted_state_to_attributes(traced: torch.fx.GraphModule, state_targets: list[str],
                                state: list[torch.Tensor], args: tuple) -> torch.fx.GraphModule:
    """Replace the first len(state) placeholders of `traced` by get_attr nodes on the state."""
    graph = traced.graph
    lifted = placeholders(graph)
    first_op = next(n for n in graph.nodes if n.op != "placeholder")

    # Attributes make_fx created for constants (_tensor_constant0, ...) stay; rename those whose
    # name a lifted state attribute is about to take.
    taken = set(state_targets)
    for node in graph.nodes:
        if node.op != "get_attr":
            continue
        target, suffix = node.target, itertools.count(1)
        while target in taken or (target != node.target and hasattr(traced, target)):
            target = f"{node.target}_{next(suffix)}"
        if target != node.target:
            _assign_attr(traced, target, _fetch_attr(traced, node.target))
            node.target = target
        taken.add(target)

    for node, target, tensor in zip(lifted, state_targets, state):
        _assign_attr(traced, target, tensor)
        with graph.inserting_before(first_op):
            attr = graph.get_attr(target)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        graph.erase_node(node)

    codegen = graph._codegen
    if isinstance(codegen, _PyTreeCodeGen):
        # make_fx built the signature over (*state, *args); drop the state part.
        info = codegen.pytree_info
        in_spec = pytree.tree_structure(tuple(args))
        codegen.pytree_info = _PyTreeInfo(info.orig_args[len(state) :], in_spec, info.out_spec)
    graph.lint()
    # Rebuilding copies only the attributes the graph uses and registers tensors as buffers.
    return torch.fx.GraphModule(traced, graph)
