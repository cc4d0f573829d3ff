"""torch_functionalize.export: a module or function -> torch.export.ExportedProgram built from our
engine's functional graph, with parameters, buffers and constants lifted and every mutation of a
buffer or user input declared in the graph signature. See Note [Export: from our graph to an
ExportedProgram] and docs/export.md.
"""
from __future__ import annotations

import contextlib
import functools
import operator
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

if TYPE_CHECKING:
    from .api import Remove

# Note [Export: from our graph to an ExportedProgram]
# torch.export's own path keeps in-place ops in its training IR with no declared mutation, and
# functionalizes only in run_decompositions (pytorch/pytorch#147318), refusing inputs that alias
# each other. Ours traces `functional_call(module, state, args, kwargs)` with every parameter,
# buffer and user input as a graph input, under make_fx(functionalize(...), tracing_mode="fake")
# (fake tensors: every node gets the meta["val"] that serialization and AOTInductor read). The
# engine ends that graph with one copy_ per input the program wrote (the epilogue of the
# Note [API: input epilogue]); each such copy_ is taken out and its value becomes an output, in
# torch.export's conventions, as BUFFER_MUTATION (a buffer), PARAMETER_MUTATION or
# USER_INPUT_MUTATION, before the user outputs. Tensor constants the program made become
# CONSTANT_TENSOR inputs. The graph then holds no in-place op, and ExportedProgram.module()
# replays the declared writes itself. Inputs whose metadata the program changed (t_, resize_:
# an as_strided_/resize_ epilogue) have no signature form and are refused by name.
# Rejected: torch.export.export followed by rewriting its graph with our engine (its tracer
# refuses aliased inputs before we could see them, and its training IR decides what a mutation
# is), and building the signature from a capture() graph (capture records no meta["val"]).

# Note [Export: tracing as torch.export traces]
# The trace runs with torch.compiler.is_compiling() and is_exporting() true, as torch.export's
# does: library code that reads tensor values on its eager path takes its export path instead
# (transformers' attention-mask checks call .all() on a fake tensor otherwise). Where that path
# cannot be traced and the eager one can, the eager one is traced instead: torch.optim's Adam
# passes its steps as CPU scalar tensors to _foreach_addcdiv_ when compiling, which fake tensors
# cannot run (torch.export.export fails there too), and reads them with .item() eagerly, which
# traces to data-dependent scalars. The program is traced a second time only after the first
# trace failed; on fake tensors, so only Python side effects of f can happen twice. Rejected:
# the eager path alone (transformers models then fail to export), the export path alone (Adam
# then fails as torch.export does).

_EPILOGUE_METADATA = {torch.ops.aten.as_strided_.default, torch.ops.aten.resize_.default}


# Note [Export: inputs as values]
# An ExportedProgram's inputs are values: ep.module() is called later with tensors of any
# storage. So each example input is traced as a tensor that owns its storage (a copy where the
# example is a view into a larger storage: our engine would otherwise write its whole storage
# back through as_strided, a write no signature declares), and inputs that share memory are
# refused by name: the graph our engine records for them is right only for callers that pass
# them aliased again, which nothing in an ExportedProgram checks. Rejected: exporting the
# aliased program with a guard (ep.module() loses Python guards on save/load).
def _own_storage(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.storage_offset() == 0 and t.is_contiguous() and \
            t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _sharing_memory(tensors: list[tuple[str, torch.Tensor]],
                    counts: Callable[[str, str], bool] = lambda a, b: True
                    ) -> tuple[str, str] | None:
    """The first two names whose tensors share a storage and for which ``counts`` holds, in one
    pass over the tensors (ep.module() runs this on every call)."""
    owners: dict[Any, list[str]] = {}
    for name, t in tensors:
        if t.numel() == 0:
            continue
        earlier = owners.setdefault((t.device, t.untyped_storage().data_ptr()), [])
        for other in earlier:
            if counts(other, name):
                return other, name
        earlier.append(name)
    return None


def _refuse_shared_memory(tensors: list[tuple[str, torch.Tensor]]) -> None:
    shared = _sharing_memory(tensors)
    if shared is not None:
        raise NotImplementedError(
            f"torch_functionalize.export: {shared[0]} and {shared[1]} share memory; an "
            "ExportedProgram's inputs are independent values, so a program of aliased inputs "
            "cannot be exported (torch_functionalize.capture records it with a guard). Pass "
            "the base tensor once and take the views inside the program.")


def _rename_placeholders(placeholders: list[fx.Node], state: list[tuple[str, Any, Any, bool]],
                         module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """torch.export's names: p_/b_ + the state's name, user inputs by the forward's parameter
    names (capture's rule, with the path inside a nested argument)."""
    import re

    from torch.export.graph_signature import InputKind

    from .capture import _argument_names

    fn = module.fn if isinstance(module, _FunctionModule) else module.forward
    params = _argument_names(fn, len(args))
    used: set[str] = set()

    def clean(name: str) -> str:
        name = re.sub(r"\W", "_", name).strip("_") or "arg"
        name = name if not name[0].isdigit() else f"_{name}"
        base, k = name, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        return name

    names = [clean(("p_" if kind is InputKind.PARAMETER else "b_") + n)
             for n, _, kind, _ in state]
    for path, _ in pytree.tree_flatten_with_path((args, kwargs))[0]:
        where, first, rest = path[0].idx, path[1], path[2:]  # type: ignore[attr-defined]
        if where == 0:
            head = params[first.idx]  # type: ignore[attr-defined]
        else:
            head = str(first.key)  # type: ignore[attr-defined]
        names.append(clean(head + "".join(f"_{getattr(k, 'idx', getattr(k, 'key', ''))}"
                                          for k in rest)))
    if not hasattr(fx.Node, "_rename"):
        return
    for ph, name in zip(placeholders, names):
        ph._rename(name)  # unique in the graph: may become name_1 beside a node named so
        ph.target = ph.name


class _ExportedProgram(torch.export.ExportedProgram):
    """An ExportedProgram whose module() refuses, by name, a call that passes inputs sharing
    memory when the program writes one of them (Note [Export: inputs as values]: its graph is
    right for independent inputs only; torch.export's own program gives wrong values there).
    torch.export.load returns a plain ExportedProgram, without this check."""

    def module(self, *args: Any, **kwargs: Any) -> torch.nn.Module:
        m = super().module(*args, **kwargs)
        written = set(self.graph_signature.user_inputs_to_mutate.values())
        if not written:
            return m
        names = [s.arg.name for s in self.graph_signature.input_specs
                 if s.kind.name == "USER_INPUT"]

        def check(_module: Any, call_args: tuple, call_kwargs: dict | None = None) -> None:
            leaves = pytree.tree_leaves((call_args, call_kwargs or {}))
            tensors = [(n, t) for n, t in zip(names, leaves) if isinstance(t, torch.Tensor)]
            shared = _sharing_memory(tensors, lambda a, b: a in written or b in written)
            if shared is not None:
                raise RuntimeError(
                    f"torch_functionalize.export: inputs {shared[0]} and {shared[1]} share "
                    "memory, and the program writes one of them; the exported program treats "
                    "its inputs as independent values. Pass copies, or export a program that "
                    "takes the base once.")

        m.register_forward_pre_hook(check, with_kwargs=True)
        return m


class _FunctionModule(torch.nn.Module):
    """A function with no state, exported as the forward of a module without parameters. Its
    forward has the function's signature, so dynamic_shapes name the function's parameters."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

        def forward(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        functools.update_wrapper(forward, fn)
        self.forward = forward  # type: ignore[method-assign]


# Note [Export: dynamic shapes]
# dynamic_shapes takes torch.export's specification (Dim, Dim.AUTO/DYNAMIC/STATIC, derived dims,
# per-argument dicts or tuples) and means what it means there: the user inputs are fake tensors
# of a ShapeEnv with one symbol per dynamic dimension (torch's make_fake_inputs, as non-strict
# torch.export makes them), state and constants are static, and our engine runs under make_fx on
# those symbols. Every condition the program (or our engine) put on a symbol is a guard of the
# ShapeEnv; after the trace torch's produce_guards_and_solve_constraints raises, naming the
# dimension and the suggested fix, where a guard specialized a dimension declared dynamic or
# related two declared independent, and make_constraints gives the range_constraints that
# ep.module() checks on each call. Without dynamic_shapes every dimension is static, as in
# torch.export. Rejected: our own specification format and solver (users already write
# torch.export's, and its error messages say how to fix a specification), and capture(...,
# dynamic=True)'s graph (it records no meta["val"], which the signature and AOTInductor read).
def _fake_inputs(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any],
                 dynamic_shapes: Any) -> tuple[Any, list[Any], Callable[[fx.GraphModule, int],
                                                                           dict[Any, Any]]]:
    """The fake mode, the flat fake user inputs, and a function that checks the trace's guards
    against dynamic_shapes and returns the range constraints (Note [Export: dynamic shapes])."""
    try:
        from torch._export.non_strict_utils import (make_constraints, make_fake_inputs,
                                                    produce_guards_and_solve_constraints)
        from torch.export.dynamic_shapes import _combine_args
        from torch._dynamo.exc import UserError, UserErrorType
        from torch.fx.experimental.symbolic_shapes import (ConstraintViolationError,
                                                           free_unbacked_symbols)
    except ImportError as e:  # pragma: no cover  (torch 2.11-2.15 have them)
        raise NotImplementedError(
            f"torch_functionalize.export: this torch ({torch.__version__}) lacks torch.export's "
            f"fake-input helpers ({e}); torch 2.11 to 2.15 have them.") from e

    fake_mode, fake_args, fake_kwargs, equalities, signature, dynamic_shapes = \
        make_fake_inputs(module, args, kwargs, dynamic_shapes)

    def range_constraints(gm: fx.GraphModule, num_lifted: int) -> dict[Any, Any]:
        shape_env = fake_mode.shape_env
        gm.meta["inline_constraints"] = {k: v for k, v in shape_env.var_to_range.items()
                                         if free_unbacked_symbols(k)}
        try:
            produce_guards_and_solve_constraints(fake_mode, gm, dynamic_shapes, equalities,
                                                 signature)
        except ConstraintViolationError as e:  # the error type torch.export raises here
            raise UserError(UserErrorType.CONSTRAINT_VIOLATION,
                            f"torch_functionalize.export: {e}") from None
        # Positional arguments first, then keyword ones in the caller's order: the order of
        # the graph's user inputs (torch.export orders them so too).
        combined = _combine_args(module, args, kwargs)
        ordered = {k: v for k, v in combined.items() if k not in kwargs}
        ordered.update((k, combined[k]) for k in kwargs if k in combined)
        ordered.update((k, v) for k, v in combined.items() if k not in ordered)
        return make_constraints(fake_mode, gm, ordered, dynamic_shapes, num_lifted)

    return fake_mode, pytree.tree_leaves((tuple(fake_args), fake_kwargs)), range_constraints


def _forward_arg_names(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> list[str]:
    """The forward's parameter names for the positional arguments (a *args parameter as name_0,
    name_1, ...), then the keyword arguments in the caller's order: the names ep.module()'s
    forward takes, which its shape guards refer to."""
    import inspect

    signature = inspect.signature(module.forward)
    names: list[str] = []
    for name, value in signature.bind_partial(*args).arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}_{i}" for i in range(len(value))]
        else:
            names.append(name)
    return names + list(kwargs)


def _state(module: torch.nn.Module) -> tuple[list[tuple[str, torch.Tensor, Any, bool]],
                                             dict[str, str]]:
    """One entry per distinct parameter or buffer (tied weights share one, named by their first
    name, as torch.export does): (name, tensor, InputKind, persistent), and every name -> the
    name of its entry."""
    from torch.export.graph_signature import InputKind

    state: list[tuple[str, torch.Tensor, Any, bool]] = []
    seen: dict[int, str] = {}
    persistent = {name for name, _ in module.state_dict(keep_vars=True).items()}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen[id(p)] = name
            state.append((name, p, InputKind.PARAMETER, True))
    for name, b in module.named_buffers(remove_duplicate=False):
        if id(b) not in seen:
            seen[id(b)] = name
            state.append((name, b, InputKind.BUFFER, name in persistent))
    all_names = {n: seen[id(t)] for n, t in [*module.named_parameters(remove_duplicate=False),
                                             *module.named_buffers(remove_duplicate=False)]}
    return state, all_names


def _trace(module: torch.nn.Module, state: list[tuple[str, torch.Tensor, Any, bool]],
           all_names: dict[str, str], in_spec: Any, fake_state: list[torch.Tensor],
           fake_user: list[Any], remove: Remove) -> tuple[fx.GraphModule, Any]:
    """make_fx(functionalize(functional_call(module, ...))) on the fake inputs; the graph and
    the output's pytree spec. See Note [Export: tracing as torch.export traces]."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .api import functionalize

    from ._attribute_state import pointed_at, state_attribute_slots

    names = [name for name, *_ in state]
    out_spec: list[Any] = []
    # See Note [Export: state reached through plain attributes]
    slots = state_attribute_slots(module, [t for _, t, _, _ in state])

    def run(*flat: Any) -> list[Any]:
        by_name = dict(zip(names, flat[:len(names)]))
        tensors = {n: by_name[first] for n, first in all_names.items()}
        a, kw = pytree.tree_unflatten(list(flat[len(names):]), in_spec)
        with pointed_at(slots, list(flat[:len(names)])):
            out = torch.func.functional_call(module, tensors, a, kw)
        leaves, spec = pytree.tree_flatten(out)
        out_spec[:] = [spec]
        return leaves

    try:
        from torch._export.utils import _compiling_state_context as exporting
    except ImportError:  # a torch without it: library code sees an eager call
        exporting = contextlib.nullcontext  # type: ignore[assignment]

    def trace() -> fx.GraphModule:
        return make_fx(functionalize(run, remove=remove), tracing_mode="symbolic",
                       _allow_non_fake_inputs=True)(*fake_state, *fake_user)

    try:
        with exporting():
            gm = trace()
    except Exception as first:  # noqa: BLE001  (the eager path may trace where this did not)
        try:
            gm = trace()
        except Exception:  # noqa: BLE001
            raise first from None
    return gm, out_spec[0]


def _take_epilogue(graph: fx.Graph, role: dict[fx.Node, int]) -> list[tuple[fx.Node, fx.Node]]:
    """The input epilogue's copy_(placeholder, value) nodes, removed: (placeholder, value)."""
    mutations: list[tuple[fx.Node, fx.Node]] = []
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _EPILOGUE_METADATA and node.args[0] in role:
            raise NotImplementedError(
                f"torch_functionalize.export: the program changes the metadata of an input "
                f"({node.target.name()}: an in-place view op or resize_ of it), which an "
                "ExportedProgram's signature cannot declare. Return the new view instead of "
                "changing the input in place.")
        if node.target is torch.ops.aten.copy_.default and node.args[0] in role:
            mutations.append((node.args[0], node.args[1]))  # type: ignore[arg-type]
            node.replace_all_uses_with(node.args[0])  # type: ignore[arg-type]
            graph.erase_node(node)
    return mutations


def _lift_constants(gm: fx.GraphModule, fake_mode: Any, before: fx.Node | None
                    ) -> tuple[dict[str, torch.Tensor], list[tuple[fx.Node, str]]]:
    """Tensor constants the program made become CONSTANT_TENSOR placeholders (static, inserted
    before the first user input)."""
    graph = gm.graph
    constants: dict[str, torch.Tensor] = {}
    nodes: list[tuple[fx.Node, str]] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = operator.attrgetter(node.target)(gm)  # type: ignore[arg-type]
        if not isinstance(value, torch.Tensor):
            continue
        target = f"lifted_tensor_{len(constants)}"
        constants[target] = value
        with graph.inserting_before(before if before is not None else next(iter(graph.nodes))):
            ph = graph.placeholder(f"c_{target}")
        ph.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
        delattr(gm, node.target)  # type: ignore[arg-type]
        nodes.append((ph, target))
    return constants, nodes


# Note [Export: scalar lists of data-dependent values]
# A program that reads tensor values into Python numbers (torch.optim's non-capturable Adam:
# each step count through .item() into bias corrections) traces to unbacked symbols, and a
# foreach op then takes a list of them (_foreach_div.ScalarList). The ExportedProgram is right
# on every input, but AOTInductor's extern-kernel call for a foreach op refuses symbolic scalar
# lists ("Expected ... List[Scalar] ... but got as_sym_ints"). So, where a ScalarList argument
# holds a traced value, the foreach op becomes one pointwise op per element (div.Scalar,
# addcdiv with value=...), which Inductor lowers like any pointwise op with a symbolic scalar
# (and fuses horizontally again). Foreach ops of constant scalars are left as they are.
# Rejected: leaving it to users (AOTInductor then fails on every non-capturable optimizer),
# and turning the scalars into 0-d tensors (_foreach_div.List): a new tensor per symbol, and
# AOTInductor's foreach TensorList lowering would still see one extern call.
_PER_ELEMENT = {
    "_foreach_add.ScalarList": ("add.Scalar", None),
    "_foreach_sub.ScalarList": ("sub.Scalar", None),
    "_foreach_mul.ScalarList": ("mul.Scalar", None),
    "_foreach_div.ScalarList": ("div.Scalar", None),
    "_foreach_pow.ScalarList": ("pow.Tensor_Scalar", None),
    "_foreach_addcdiv.ScalarList": ("addcdiv.default", "value"),
    "_foreach_addcmul.ScalarList": ("addcmul.default", "value"),
}


def _unfold_symbolic_scalar_lists(graph: fx.Graph) -> None:
    """Note [Export: scalar lists of data-dependent values]."""
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        entry = _PER_ELEMENT.get(node.target.name().split("::")[-1])
        if entry is None or node.kwargs:
            continue
        *tensor_lists, scalars = node.args
        if not any(isinstance(s, fx.Node) for s in scalars):  # type: ignore[union-attr]
            continue
        op_name, scalar_kw = entry
        packet, overload = op_name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        users = list(node.users)
        if not all(u.target is operator.getitem for u in users):
            continue
        values = []
        with graph.inserting_before(node):
            for i, scalar in enumerate(scalars):  # type: ignore[arg-type]
                operands = [ts[i] for ts in tensor_lists]  # type: ignore[index]
                if scalar_kw is None:
                    new = graph.call_function(op, (*operands, scalar))
                else:
                    new = graph.call_function(op, tuple(operands), {scalar_kw: scalar})
                new.meta["val"] = node.meta["val"][i]
                new.meta["stack_trace"] = node.meta.get("stack_trace")
                values.append(new)
        for user in users:
            user.replace_all_uses_with(values[user.args[1]])  # type: ignore[index]
            graph.erase_node(user)
        graph.erase_node(node)


def export(
    m_or_f: torch.nn.Module | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    remove: Remove = "mutations",
    dynamic_shapes: Any = None,
) -> torch.export.ExportedProgram:
    """An ExportedProgram of `m_or_f(*args, **kwargs)` built from the functional graph of our
    engine: parameters, buffers and constants lifted, mutations declared in the graph signature
    (`ep.graph_signature.buffers_to_mutate`, `user_inputs_to_mutate`), no in-place op left.
    `remove="mutations_and_views"` also replaces views by *_copy ops. `dynamic_shapes` is
    torch.export's specification (Note [Export: dynamic shapes]); without it the program is
    specialized to the example inputs' shapes."""
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import (ConstantArgument, ExportGraphSignature, InputKind,
                                              InputSpec, OutputKind, OutputSpec,
                                              SymIntArgument, TensorArgument)

    from .api import check_remove

    check_remove(remove)
    kwargs = dict(kwargs or {})
    module = m_or_f if isinstance(m_or_f, torch.nn.Module) else _FunctionModule(m_or_f)
    if not isinstance(args, tuple):
        raise TypeError(f"torch_functionalize.export: args must be a tuple, got "
                        f"{type(args).__name__}")
    state, all_names = _state(module)
    flat_user, in_spec = pytree.tree_flatten((args, kwargs))
    for leaf in flat_user:
        if leaf is not None and not isinstance(leaf, (torch.Tensor, int, float, bool, str)):
            raise TypeError(f"torch_functionalize.export: an input of type "
                            f"{type(leaf).__name__} is not supported (tensors and Python "
                            "scalars are)")
    _refuse_shared_memory([(f"input {i}", t) for i, t in enumerate(flat_user)
                           if isinstance(t, torch.Tensor)] + [(n, t) for n, t, _, _ in state])
    own_args, own_kwargs = pytree.tree_map_only(torch.Tensor, _own_storage, (args, kwargs))
    fake_mode, fake_user, range_constraints = _fake_inputs(module, own_args, own_kwargs,
                                                           dynamic_shapes)
    # State is static, as in torch.export. The fake mode allows non-fake tensors: closure
    # tensors of f become constants (below).
    fake_state = [fake_mode.from_tensor(_own_storage(t), static_shapes=True)
                  for _, t, _, _ in state]
    n_state = len(state)
    gm, out_spec = _trace(module, state, all_names, in_spec, fake_state, fake_user, remove)

    graph = gm.graph
    _unfold_symbolic_scalar_lists(graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    _rename_placeholders(placeholders, state, module, args, kwargs)
    output = next(n for n in graph.nodes if n.op == "output")
    user_outputs = list(output.args[0])
    role = {ph: i for i, ph in enumerate(placeholders)}
    mutations = _take_epilogue(graph, role)
    constants, constant_nodes = _lift_constants(
        gm, fake_mode, placeholders[n_state] if len(placeholders) > n_state else None)

    kinds_out = {InputKind.PARAMETER: OutputKind.PARAMETER_MUTATION,
                 InputKind.BUFFER: OutputKind.BUFFER_MUTATION}
    output_specs = []
    outputs = []
    for ph, value in mutations:
        i = role[ph]
        if i < n_state:
            name, _, kind, _ = state[i]
            output_specs.append(OutputSpec(kinds_out[kind], TensorArgument(value.name), name))
        else:
            output_specs.append(OutputSpec(OutputKind.USER_INPUT_MUTATION,
                                           TensorArgument(value.name), ph.name))
        outputs.append(value)
    for value in user_outputs:
        if isinstance(value, fx.Node):
            arg: Any = SymIntArgument(value.name) if isinstance(value.meta.get("val"),
                                                                torch.SymInt) \
                else TensorArgument(value.name)
        else:
            arg = ConstantArgument(name="", value=value)
        output_specs.append(OutputSpec(OutputKind.USER_OUTPUT, arg, None))
        outputs.append(value)
    output.args = (tuple(outputs),)

    input_specs = [InputSpec(kind, TensorArgument(ph.name), name,
                             persistent=keep if kind is InputKind.BUFFER else None)
                   for ph, (name, _, kind, keep) in zip(placeholders[:n_state], state)]
    input_specs += [InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(ph.name), target)
                    for ph, target in constant_nodes]
    for ph, leaf in zip(placeholders[n_state:], fake_user):
        if isinstance(leaf, torch.Tensor):
            input_specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(ph.name), None))
        elif isinstance(leaf, torch.SymInt):  # an int declared dynamic
            ph.meta["val"] = leaf
            input_specs.append(InputSpec(InputKind.USER_INPUT, SymIntArgument(ph.name), None))
        else:  # a Python scalar: the program is specialized to its value, as torch.export's
            ph.meta["val"] = leaf
            input_specs.append(InputSpec(InputKind.USER_INPUT,
                                         ConstantArgument(name=ph.name, value=leaf), None))
    graph.eliminate_dead_code()
    gm.recompile()
    ranges = range_constraints(gm, n_state + len(constant_nodes))

    state_dict = {name: t for name, t, kind, keep in state
                  if kind is InputKind.PARAMETER or keep}
    for name, t, kind, keep in state:
        if kind is InputKind.BUFFER and not keep:
            constants[name] = t
    signature = ModuleCallSignature(inputs=[], outputs=[], in_spec=in_spec, out_spec=out_spec,
                                    forward_arg_names=_forward_arg_names(module, args, kwargs))
    return _ExportedProgram(
        root=gm, graph=graph,
        graph_signature=ExportGraphSignature(input_specs, output_specs),
        state_dict=state_dict, range_constraints=ranges,
        module_call_graph=[ModuleCallEntry(fqn="", signature=signature)],
        example_inputs=(args, kwargs), constants=constants)
