"""The torch.compile backend "tfz": each graph dynamo captures becomes a functional ATen graph.

Registered by name through the ``torch_dynamo_backends`` entry point (setup.py), so after
``pip install`` ``torch.compile(model, backend="tfz")`` works; ``backend(compiler=fn)`` hands the
functional graph to a compiler of the user's instead of running it. A thin adapter over
``functionalize_graph``: no partitioning, no autograd of its own (see Note [Dynamo: the backend]).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence, cast

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ._fx import concrete, example_value, placeholders, run_without_grad, sizes_and_strides
from ._copy_derivative import with_copy_derivative
from ._view_chain import ViewChain, view_chain, view_root
from .api import Remove, check_remove
from .graph import _fetch_attr, functionalize_graph

Compiler = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]

# Note [Dynamo: the backend]
# Dynamo hands a backend one graph per region between graph breaks, over torch-level calls
# (x.add_(1), F.batch_norm, ...), with every tensor it reads as a placeholder (module parameters
# and buffers too, as modules are inlined) and each placeholder's fake value in
# meta["example_value"]. The backend retraces that graph with functionalize_graph on those fake
# values (no real execution at compile time, so random ops draw from the generator only when the
# graph runs; symbolic sizes stay symbolic), giving a graph of functional ATen ops whose input
# mutations are the trailing copy_ (as_strided_/resize_ for metadata) of the input epilogue
# (Note [API: input epilogue]). Running that graph on the real inputs therefore leaves them as
# eager would, which is what the code after a graph break reads.
#   What the graph cannot express is aliasing between an output and an input: graph outputs
# never alias graph inputs (Note [Inputs: outputs that alias inputs]), but code after a graph
# break may write through an output that eager made a view of an input (y = x.view(-1); break;
# y.add_(1)). The backend finds such outputs at compile time from dynamo's fake values (output
# and input share a fake storage) and, after each run, remakes each on its input: by replaying
# the graph's view calls where they lead from the input to the output
# (Note [Dynamo: outputs that view inputs]), else as an as_strided view with the sizes, strides,
# offset, dtype and conjugate/negative bits of the fake output (symbolic ones evaluated against
# the real inputs' sizes); an output that is an input itself (dynamo returns one that an in-place
# operator rebound: `x *= 2`) is the caller's tensor, and outputs that eager returns as one
# tensor object under two names (v1 = v0.to(v0.dtype) is v0) come back as one object.
# Outputs that alias each other keep doing so because remove="mutations" (the default) keeps
# views in the graph; with remove="mutations_and_views" the graph returns copies, so an output
# reached by view calls from another output (v1 = v0[2], both returned) is remade by replaying
# them on that output (where they cannot be replayed, an out= into the view, it is made with
# as_strided of an output that is its whole storage), and outputs that view an intermediate the
# graph does not return (v1 = v0[0], v2 = v0[:, 1]) are remade from it, the graph returning it
# as well for that (`_returning_shared_bases`).
#   Autograd is eager's: the functional graph is run op by op under autograd at run time, so
# .backward() through a compiled region works as through any ATen program; a write autograd
# does not see is a tfz._with_gradient_of node (Note [Graphs: writes autograd does not see]).
# Rejected: tracing a joint forward/backward graph here, which is AOTAutograd's job (a user
# compiler that wants one can call aot_autograd on the functional graph).


def backend(
    gm: Optional[torch.fx.GraphModule] = None,
    example_inputs: Optional[Sequence[Any]] = None,
    *,
    compiler: Optional[Compiler] = None,
    remove: Remove = "mutations",
) -> Any:
    """The dynamo backend. ``torch.compile(m, backend="tfz")`` (or ``backend=backend``) runs each
    captured graph functionalized; ``backend(compiler=fn, remove=...)`` returns a backend that
    passes the functional graph and dynamo's example inputs to ``fn`` and runs what it returns."""
    check_remove(remove)
    if gm is None:
        if example_inputs is not None:
            raise TypeError(
                "functionalize: backend: example_inputs given without a graph; got "
                f"{type(example_inputs).__name__}. Call backend(gm, example_inputs), or "
                "backend(compiler=fn) to make a backend."
            )
        if compiler is not None and not callable(compiler):
            raise TypeError(
                f"functionalize: backend: compiler must be callable; got "
                f"{type(compiler).__name__}. Pass a function (gm, example_inputs) -> callable."
            )
        return functools.partial(backend, compiler=compiler, remove=remove)
    if example_inputs is None:
        raise TypeError(
            "functionalize: backend: called with a graph but no example inputs. Dynamo calls "
            "backend(gm, example_inputs); use torch.compile(f, backend=backend)."
        )
    return _compile(gm, list(example_inputs), compiler, remove)


def _compile(gm: torch.fx.GraphModule, example_inputs: list[Any], compiler: Compiler | None,
             remove: Remove) -> Callable[..., Any]:
    hidden = 0
    if remove == "mutations_and_views":
        gm, hidden = _returning_shared_bases(gm)
    fake_inputs = _with_geometry_of(
        [_example_value(n) for n in placeholders(gm.graph)], example_inputs)
    if _symbolic(fake_inputs) and _share_a_storage(fake_inputs):
        run = _per_layout(gm, compiler, remove)
    else:
        run = _functional(gm, fake_inputs, example_inputs, compiler, remove)
    aliases = _output_aliases(gm, fake_inputs, example_inputs)
    repeated = _repeated_outputs(gm)
    # With views kept the graph's outputs that view each other already do.
    views = _views_of_outputs(gm, aliases, repeated, example_inputs) \
        if remove == "mutations_and_views" else []
    if not aliases and not repeated and not views and remove != "mutations_and_views":
        return run
    # Without views every other output is laid out in eager's strides too: code after a break
    # that reads its storage order (resize_, view) sees eager's.
    if remove == "mutations_and_views":
        skipped = set(aliases) | {index for index, _ in repeated} | {v[0] for v in views}
        values = [example_value(n, ("example_value",)) if isinstance(n, torch.fx.Node) else None
                  for n in _output_nodes(gm)]
        fresh = {i: v for i, v in enumerate(values) if i not in skipped
                 and isinstance(v, torch.Tensor) and v.layout == torch.strided}
    else:
        fresh = {}
    root_fakes = {root: _fake_output(gm, root) for _, root, _, _ in views}
    as_strided_roots = {root for _, root, chain, _ in views if chain is None}
    shape_env = _shape_env(fake_inputs)
    # Symbols are bound from the arguments as they come, before the graph changes their sizes.
    needs_bindings = _symbolic(fake_inputs) and (bool(views) or bool(fresh) or any(
        fake is not None for _, fake, _ in aliases.values()))

    replayed_inputs = {i for i, fake, chain in aliases.values() if chain is not None}

    def run_and_restore_aliases(*args: Any) -> Any:
        bindings = _bind(shape_env, fake_inputs, args) if needs_bindings else {}
        before = {i: _geometry(args[i]) for i in replayed_inputs}
        outputs = run(*args)
        single = not isinstance(outputs, (tuple, list))
        outs = [outputs] if single else list(outputs)
        for index, (input_index, fake_out, chain) in aliases.items():
            base = args[input_index]
            if fake_out is None:  # the input itself (x *= 2 rebinds x to x)
                outs[index] = base
                continue
            if _same_storage(outs[index], base):
                continue  # the graph's view of an unmutated input is already an alias
            # A replay reads the input's geometry after the run: where the run changed it
            # through a name dynamo did not see as the input (x.flatten(1, 1) is x), the views
            # were taken before (Note [Dynamo: outputs that view inputs]).
            if chain is not None and _geometry(base) == before[input_index]:
                outs[index] = chain.replay(args)
                continue
            outs[index] = _view_of(base, fake_out, bindings)
        laid_out: set[int] = set()
        for index, root, chain, geometry in views:  # a root is remade before its views
            if root not in laid_out:
                laid_out.add(root)
                outs[root] = _in_eager_strides(outs[root], root_fakes[root], bindings,
                                               whole=root in as_strided_roots)
            outs[index] = chain.replay(args, outs[root]) if chain is not None else \
                _view_of(outs[root], geometry, bindings)
        for index, fake in fresh.items():
            if isinstance(outs[index], torch.Tensor):
                outs[index] = _in_eager_strides(outs[index], fake, bindings)
        for index, first in repeated:
            outs[index] = outs[first]
        if hidden:  # the shared bases the graph returns for its views only
            del outs[-hidden:]
        if single:
            return outs[0]
        return type(outputs)(outs) if isinstance(outputs, tuple) else outs

    return run_and_restore_aliases


def _functional(gm: torch.fx.GraphModule, traced_inputs: list[Any], example_inputs: list[Any],
                compiler: Compiler | None, remove: Remove) -> Callable[..., Any]:
    """gm's functional graph traced on `traced_inputs`, handed to the user's compiler (or run
    with copy's derivative), run keeping autograd's saved copies of written inputs."""
    functional = functionalize_graph(gm, *traced_inputs, remove=remove)
    _drop_unread_detaches(functional)
    _leaf_writes_without_grad(functional, example_inputs)
    # See Note [Graphs: copy's derivative when a graph runs under autograd].
    compiled = with_copy_derivative(functional) if compiler is None \
        else compiler(functional, example_inputs)
    return _saving_written_inputs(compiled, *_written_inputs(functional))


# Note [Dynamo: inputs sharing a storage with dynamic shapes]
# Inputs that share a storage are functionalized as views of one flat base, whose size and
# steps are storage coordinates: concrete numbers (Note [Inputs: aliased inputs]). With dynamic
# shapes (torch.compile(dynamic=True), or dynamo's automatic dynamic after a recompile) such
# inputs would be functionalized apart, and a write through one not seen through the other
# (the engine refuses the write by name). So a graph whose inputs share a storage and have
# symbolic sizes is traced once per layout of its arguments, on static fake tensors made from
# the real ones (sizes, strides, offsets, which share a storage), and each call runs the graph
# of its layout; dynamo's own guards and the output aliasing (read from dynamo's symbolic
# values) stay as they are. Rejected: a symbolic flat base (every storage coordinate of the
# engine, the epilogue's included, would have to be symbolic), and refusing such graphs (a
# view of an input written after a graph break is common).
def _per_layout(gm: torch.fx.GraphModule, compiler: Compiler | None,
                remove: Remove) -> Callable[..., Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs: dict[tuple, Callable[..., Any]] = {}

    def run(*args: Any) -> Any:
        key = _layout(args)
        graph = graphs.get(key)
        if graph is None:
            mode = FakeTensorMode(allow_non_fake_inputs=True, static_shapes=True)
            static = [mode.from_tensor(a, static_shapes=True)
                      if isinstance(a, torch.Tensor) else a for a in args]
            graph = graphs[key] = _functional(gm, static, list(args), compiler, remove)
        return graph(*args)

    return run


def _layout(args: Sequence[Any]) -> tuple:
    """What a graph traced on static fake tensors specializes on: each tensor's dtype, device,
    sizes, strides, offset, bits, grad requirement and which earlier argument's storage it
    shares; each number's value."""
    storages: dict[StorageWeakRef, int] = {}
    key: list[Any] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.layout == torch.strided:
            shared = storages.setdefault(StorageWeakRef(a.untyped_storage()), i)
            key.append((a.dtype, a.device, tuple(a.shape), a.stride(), a.storage_offset(),
                        a.is_conj(), a.is_neg(), a.requires_grad, shared,
                        a.untyped_storage().nbytes()))
        elif isinstance(a, torch.Tensor):
            key.append((a.layout, a.dtype, a.device, tuple(a.shape), a.requires_grad))
        elif isinstance(a, (int, float, bool)):
            key.append((type(a), a))
        else:
            key.append(type(a))
    return tuple(key)


def _share_a_storage(fake_inputs: list[Any]) -> bool:
    storages = [StorageWeakRef(v.untyped_storage()) for v in fake_inputs
                if isinstance(v, torch.Tensor) and v.layout == torch.strided]
    return len(set(storages)) < len(storages)


def _drop_unread_detaches(functional: torch.fx.GraphModule) -> None:
    """Removes the detach (detach_copy without views) of a value autograd saved while the graph
    was traced on inputs that require grad (relu's output): nothing reads it, and without views it
    would copy the value on every run."""
    detaches = (torch.ops.aten.detach.default, torch.ops.aten.detach_copy.default)
    dropped = False
    for node in reversed(list(functional.graph.nodes)):
        if node.op == "call_function" and node.target in detaches and not node.users:
            functional.graph.erase_node(node)
            dropped = True
    if dropped:
        functional.recompile()


def _leaf_writes_without_grad(functional: torch.fx.GraphModule, example_inputs: list[Any]) -> None:
    """Runs each epilogue write of a leaf that requires grad (a parameter a module's forward
    updates under no_grad: nn.Embedding(max_norm=...) renormalizing its weight) with grad mode
    off, as eager's write ran: in grad mode the graph's copy_ into it raised autograd's "a leaf
    Variable that requires grad is being used in an in-place operation" (Note [API: epilogue
    writes of leaves in graphs]). Other written inputs keep the mode: a non-leaf written in grad
    mode takes the write's history, as in eager."""
    value_of = dict(zip(placeholders(functional.graph), example_inputs))  # dynamo's: real ones

    def is_grad_leaf(node: Any) -> bool:
        if not isinstance(node, torch.fx.Node):
            return False
        if node.op == "placeholder":
            value = value_of.get(node)
        elif node.op == "get_attr":
            value = _fetch_attr(functional, cast(str, node.target))
        else:
            return False
        return isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad

    writes = [n for n in functional.graph.nodes if n.op == "call_function"
              and n.target is torch.ops.aten.copy_.default and n.args and is_grad_leaf(n.args[0])]
    for node in writes:
        run_without_grad(functional.graph, node, node)
        # The leaf keeps its identity: the gradient edge a hidden write gave the value written
        # back is never read (Note [Graphs: writes autograd does not see]).
        src = node.args[1] if len(node.args) > 1 else None
        if isinstance(src, torch.fx.Node) and src.target is _gradient_of() and len(src.users) == 1:
            node.replace_input_with(src, src.args[0])
            functional.graph.erase_node(src)
    if writes:
        functional.recompile()


def _gradient_of() -> Any:
    return torch.ops.tfz._with_gradient_of.default


# Note [Dynamo: saved inputs the epilogue overwrites]
# Run under autograd, the functional graph reads an input's old value in a functional op (e.g.
# _native_batch_norm_legit_functional reads running_mean, and autograd saves it for backward),
# then the epilogue's copy_ overwrites that input, so backward would fail eager's version check
# ("modified by an inplace operation") although eager itself raised nothing: eager's in-place op
# updated the buffer before autograd saved it. While the graph runs with grad enabled, a
# saved-tensor hook therefore saves a copy of any tensor that shares storage with an input the
# epilogue writes (the value the functional op actually read), and keeps autograd's version check
# for every other saved tensor (a write after the call still raises, as in eager). Rejected:
# running the epilogue under no_grad (the version counter is bumped anyway); saving without the
# check (later user writes would give silently wrong gradients).
def _written_inputs(functional: torch.fx.GraphModule) -> tuple[list[int], list[torch.Tensor]]:
    """Placeholder indices and attribute tensors that epilogue ops of `functional` write."""
    index_of = {n: i for i, n in enumerate(placeholders(functional.graph))}
    indices: set[int] = set()
    attributes: list[torch.Tensor] = []
    for node in functional.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable or not node.args:
            continue
        target = node.args[0]
        if not isinstance(target, torch.fx.Node):
            continue
        if target.op == "placeholder":
            indices.add(index_of[target])
        elif target.op == "get_attr":
            attributes.append(_fetch_attr(functional, cast(str, target.target)))
    return sorted(indices), attributes


def _saving_written_inputs(run: Callable[..., Any], indices: list[int],
                           attributes: list[torch.Tensor]) -> Callable[..., Any]:
    if not indices and not attributes:
        return run

    def run_saving_copies(*args: Any) -> Any:
        if not torch.is_grad_enabled():
            return run(*args)
        written = {StorageWeakRef(t.untyped_storage()) for t in attributes}
        written.update(
            StorageWeakRef(args[i].untyped_storage())
            for i in indices
            if isinstance(args[i], torch.Tensor)
        )

        def pack(t: torch.Tensor) -> tuple[torch.Tensor, int | None]:
            if StorageWeakRef(t.untyped_storage()) in written:
                return t.clone(), None
            return t, t._version

        def unpack(packed: tuple[torch.Tensor, int | None]) -> torch.Tensor:
            t, version = packed
            if version is not None and t._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: [{t.type()} {list(t.shape)}] is at version "
                    f"{t._version}; expected version {version} instead (tensor saved by a graph "
                    "of the torch_functionalize backend)."
                )
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return run(*args)

    return run_saving_copies


def _example_value(node: torch.fx.Node) -> Any:
    """The fake value dynamo recorded for a placeholder, detached from dynamo's history but still
    requiring grad where the input does (a leaf, or a non-leaf with a stand-in grad_fn): the trace
    records no backward, but a write autograd does not see of a value whose gradient comes from
    an input leaves tfz._with_gradient_of in the graph
    (Note [Graphs: writes autograd does not see]); autograd applies when the graph runs."""
    value = example_value(node, ("example_value", "val"))
    if value is None:
        raise ValueError(
            f"functionalize: backend: placeholder {node.name} carries no example value; the "
            "backend expects graphs from dynamo (torch.compile). For other graphs call "
            "functionalize_graph(gm, *inputs)."
        )
    if isinstance(value, torch.Tensor):
        detached = value.detach()
        if value.requires_grad:
            detached = detached.requires_grad_() if value.is_leaf else _as_non_leaf(detached)
        # The symbol dynamo gave the value read out of it (a float attribute passed as a 0-d
        # tensor with dynamic shapes, then .item() in the graph: BatchNorm's momentum); without
        # it the retrace reads a value out of a fake tensor and fails.
        memo = getattr(value, "item_memo", None)
        if memo is not None:
            detached.item_memo = memo
        return detached
    return value


class _NonLeafStandIn(torch.autograd.Function):
    """Gives a detached tensor a grad_fn in place (this Function's node, never run): the fake
    input of a non-leaf that requires grad, which the graph may write in place as eager writes the
    real one (a leaf that requires grad may not be)."""

    @staticmethod
    def forward(  # type: ignore[override]
            ctx: Any, t: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(t)
        return t

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        raise RuntimeError("functionalize: backend: a backward reached the stand-in history of a "
                           "traced input; this is a bug in torch_functionalize.")


def _as_non_leaf(t: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        return cast(torch.Tensor, _NonLeafStandIn.apply(t, torch.zeros((), requires_grad=True)))


def _with_geometry_of(fake_inputs: list[Any], example_inputs: list[Any]) -> list[Any]:
    """The fake inputs laid out as the real inputs dynamo passes beside them. Dynamo traces with
    its fake input objects, so a change of an input's geometry in the graph that dynamo does not
    see as one (x += x rebinds x; x.t_() then runs on a new name) is left on the placeholder's
    fake value: traced on it, the graph would transpose the input once more and give it back as
    it was. A fake input with static sizes is given the real input's sizes,
    strides and offset (its storage stays dynamo's); one with symbolic sizes is refused by name
    (dynamo's own guards on it fail then, with its plain eager backend too)."""
    if len(example_inputs) != len(fake_inputs):
        return fake_inputs
    restored = list(fake_inputs)
    for i, (fake, real) in enumerate(zip(fake_inputs, example_inputs)):
        if not isinstance(fake, torch.Tensor) or type(real) is not torch.Tensor or \
                fake.layout != torch.strided or real.layout != torch.strided:
            continue
        geometry = (tuple(real.shape), tuple(real.stride()), real.storage_offset())
        if _geometry(fake) == geometry:
            continue
        if any(isinstance(v, torch.SymInt) for v in
               (*fake.shape, *fake.stride(), fake.storage_offset())):
            raise NotImplementedError(
                f"functionalize: backend: graph input {i} (sizes {list(real.shape)}) changes its "
                "sizes or strides in place inside the compiled region in a way dynamo traced on "
                "its fake value (x += x, then x.t_()), which the backend cannot undo with "
                "dynamic shapes. Use torch.compile(..., dynamic=False), or y = x.t() instead "
                "of x.t_().")
        restored[i] = fake.detach()
        restored[i].as_strided_(*geometry)
    return restored


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _output_aliases(gm: torch.fx.GraphModule, fake_inputs: list[Any], example_inputs: list[Any]
                    ) -> dict[int, tuple[int, torch.Tensor | None, ViewChain | None]]:
    """{output index: (input index, fake output, view chain)} for outputs eager makes views of
    an input; the fake output is None where the output is the input itself, the chain None where
    the view cannot be remade by replaying the graph's view calls. Dynamo returns an input that
    an in-place op rebound (`x *= 2` is `x = x.__imul__(2)`, which is x) as an output, and the
    code after the graph break goes on with that output as x: it must be the caller's tensor,
    not a view of it (x.resize_(..) of a view leaves x as it was) nor a copy."""
    # dynamo's own fake inputs (fake_inputs are detached copies): the output is one of them
    raw_inputs = [example_value(n, ("example_value", "val")) for n in placeholders(gm.graph)]
    # Placeholders whose fake value (dynamo's, changed as the graph changed the input) ends as
    # the real input began: an out= into them wrote in place.
    kept_geometry = frozenset(
        node for node, fake, real in zip(placeholders(gm.graph), raw_inputs, example_inputs)
        if isinstance(fake, torch.Tensor) and type(real) is torch.Tensor
        and fake.layout == torch.strided and real.layout == torch.strided
        and _geometry(fake) == (tuple(real.shape), tuple(real.stride()), real.storage_offset()))
    storages: dict[StorageWeakRef, int] = {}
    for i, value in enumerate(fake_inputs):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            storages.setdefault(StorageWeakRef(value.untyped_storage()), i)
    flat = _output_nodes(gm)
    aliases = {}
    for index, node in enumerate(flat):
        value = example_value(node, ("example_value",)) if isinstance(node, torch.fx.Node) else None
        same = next((i for i, v in enumerate(raw_inputs)
                     if value is not None and v is value), None)
        if same is not None:
            aliases[index] = (same, None, None)
        elif isinstance(value, torch.Tensor) and value.layout == torch.strided:
            input_index = storages.get(StorageWeakRef(value.untyped_storage()))
            if input_index is not None:
                aliases[index] = (input_index, value,
                                  view_chain(gm, node, kept_geometry=kept_geometry))
    if any(fake is not None for _, fake, _ in aliases.values()):
        # Rebuilt from a value where no replay is possible, or where the input's geometry
        # changed in a way the graph does not show (see run_and_restore_aliases): eager's
        # kernels' geometry where a run on meta inputs gives it.
        meta = _meta_outputs(gm, example_inputs)
        for index, (input_index, fake, chain) in list(aliases.items()):
            if fake is not None and meta is not None and _same_meta(meta[index], fake):
                aliases[index] = (input_index, meta[index], chain)
    return aliases


def _meta_outputs(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[Any] | None:
    """The graph's outputs run on meta tensors laid out as the real inputs (sharing a meta
    storage where they share one), or None where that cannot run (symbolic sizes, a value read
    from a tensor, another layout). Meta tensors run eager's C++ kernels, where dynamo's fake
    values take some view ops through Python references with other geometry at the edges (the
    offset of an empty diagonal); see Note [Dynamo: outputs that view inputs]."""
    bases: dict[StorageWeakRef, torch.Tensor] = {}
    inputs = []
    for real in example_inputs:
        if isinstance(real, torch.SymInt):
            return None
        if not isinstance(real, torch.Tensor):
            inputs.append(real)
            continue
        if type(real) is not torch.Tensor or real.layout != torch.strided or real.is_conj() \
                or real.is_neg():
            return None
        storage = real.untyped_storage()
        base = bases.setdefault(StorageWeakRef(storage),
                                torch.empty(storage.nbytes(), dtype=torch.uint8, device="meta"))
        try:
            inputs.append(base.view(real.dtype).as_strided(
                real.shape, real.stride(), real.storage_offset()))
        except RuntimeError:
            return None
    # Factories without a device make meta tensors; one with a device draws from a generator
    # that is given back its state (compiling consumes no random numbers).
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.no_grad(), torch.device("meta"), torch.random.fork_rng(devices=devices):
            outputs = gm(*inputs)
    except Exception:  # noqa: BLE001 - data-dependent ops and the like: the fake values serve
        return None
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _same_meta(meta: Any, fake: torch.Tensor) -> bool:
    return isinstance(meta, torch.Tensor) and meta.device.type == "meta" and \
        meta.dtype == fake.dtype and _geometry(meta)[0] == _geometry(fake)[0]


def _views_of_outputs(gm: torch.fx.GraphModule, aliases: Mapping[int, Any],
                      repeated: list[tuple[int, int]], example_inputs: list[Any]
                      ) -> list[tuple[int, int, ViewChain | None, Any]]:
    """(output index, root output index, chain, geometry) for outputs that eager makes views of
    another output (v1 = v0[2], both returned), in the graph's order: without views the graph
    returns them as separate tensors, and a write through one after a graph break (v0.mul_(v0))
    must show through the other. Each is remade by replaying its chain on the root output, or,
    where the calls cannot be replayed (an out= into the view, which may resize it), as an
    as_strided view of an output that is its whole storage, in the geometry of the meta run (or
    the fake value) with `chain` None. Outputs viewing inputs are in `aliases`; see
    Note [Dynamo: outputs that view inputs]."""
    flat = _output_nodes(gm)
    roots: dict[torch.fx.Node, int] = {}
    storages: dict[int, StorageWeakRef] = {}
    values: dict[int, torch.Tensor] = {}
    for index, node in enumerate(flat):
        value = example_value(node, ("example_value",)) if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            roots.setdefault(node, index)
            storages[index] = StorageWeakRef(value.untyped_storage())
            values[index] = value
    skipped = set(aliases) | {index for index, _ in repeated}
    # An output that is its whole storage (offset 0, dense) in eager's storage coordinates and
    # a base in eager (a view of it that is its whole storage too, v0.flatten() of a 0-d v0,
    # must not become v0's base: v0.detach_() after the break would then refuse a view).
    whole: dict[StorageWeakRef, int] = {}
    for index, value in values.items():
        if index not in skipped and value._base is None and _is_whole_storage(value):
            whole.setdefault(storages[index], index)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    views = []
    unreplayed = []
    for node, index in roots.items():
        if index in skipped:
            continue
        chain = view_chain(gm, node, {n: i for n, i in roots.items() if i != index})
        # Calls that may copy (x.to(dtype), reshape) took the values of their time: only where
        # eager's output shares its root's storage were they views.
        if chain is not None and chain.root_output is not None and \
                storages[chain.root_output] == storages[index]:
            views.append((order[node], index, chain.root_output, chain, None))
        elif values[index]._base is not None and whole.get(storages[index], index) != index:
            unreplayed.append((order[node], index, whole[storages[index]], None, values[index]))
    if unreplayed:
        meta = _meta_outputs(gm, example_inputs)
        for k, (position, index, root, _, fake) in enumerate(unreplayed):
            if meta is not None and _same_meta(meta[index], fake):
                unreplayed[k] = (position, index, root, None, meta[index])
    ordered = sorted(views + unreplayed, key=lambda v: v[0])
    return [(index, root, chain, geometry) for _, index, root, chain, geometry in ordered]


def _is_whole_storage(value: torch.Tensor) -> bool:
    """Element i of the storage is one of value's, from offset 0 (static sizes only)."""
    if any(isinstance(v, torch.SymInt) for v in (*value.shape, *value.stride(),
                                                value.storage_offset())):
        return False
    return value.storage_offset() == 0 and \
        _non_overlapping_and_dense(list(value.shape), list(value.stride())) and \
        value.numel() * value.element_size() == value.untyped_storage().nbytes() and \
        not value.is_conj() and not value.is_neg()


def _returning_shared_bases(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    """gm returning after its outputs each intermediate that two or more of them view and it
    does not return, and how many it added. Without views each output comes back as a copy;
    remade as views of the returned intermediate (`_views_of_outputs`), a write through one
    after a graph break shows through the others, as in eager (v1 = v0[0]; v2 = v0[:, 1]). The
    backend drops the added outputs after the run. Rejected: returning the outputs as they are
    (a write through one was not seen through the other, silently)."""
    flat = _output_nodes(gm)
    returned = {n for n in flat if isinstance(n, torch.fx.Node)}
    input_storages = {
        StorageWeakRef(v.untyped_storage()) for v in
        (example_value(n, ("example_value",)) for n in placeholders(gm.graph))
        if isinstance(v, torch.Tensor) and v.layout == torch.strided}
    groups: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    for node in flat:
        root = view_root(node)
        if root is None or root in returned:
            continue
        value = example_value(node, ("example_value",))
        root_value = example_value(root, ("example_value",))
        if not all(isinstance(v, torch.Tensor) and v.layout == torch.strided
                   for v in (value, root_value)):
            continue
        storage = StorageWeakRef(root_value.untyped_storage())
        if storage != StorageWeakRef(value.untyped_storage()) or storage in input_storages:
            continue  # a copy (x.reshape of a transposed x), or a view of an input
        # Remade by replaying its view calls, or (an out= into it) with as_strided of the
        # intermediate where that is its whole storage: see _views_of_outputs.
        if view_chain(gm, node, {root: -1}) is not None or \
                (root_value._base is None and _is_whole_storage(root_value)):
            groups.setdefault(root, set()).add(node)
    bases = [root for root, views in groups.items() if len(views) > 1]
    if not bases:
        return gm, 0
    graph = torch.fx.Graph()
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    results = graph.graph_copy(gm.graph, copied)
    results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
    graph.output((*results, *(copied[root] for root in bases)))
    return torch.fx.GraphModule(gm, graph), len(bases)


def _output_nodes(gm: torch.fx.GraphModule) -> list[Any]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    results = output.args[0]
    return list(results) if isinstance(results, (tuple, list)) else [results]


def _fake_output(gm: torch.fx.GraphModule, index: int) -> Any:
    node = _output_nodes(gm)[index]
    return example_value(node, ("example_value",)) if isinstance(node, torch.fx.Node) else None


def _in_eager_strides(out: torch.Tensor, fake_out: Any, bindings: Mapping[Any, Any],
                      whole: bool = False) -> torch.Tensor:
    """An output that views of it are replayed on, in eager's strides where they differ: without
    views the graph's value is laid out by its *_copy ops, and a view of it at an offset (v0[1:])
    that an out= resizes after the break names storage elements through them. `whole`: views of
    it are made with as_strided, so it must also be its whole storage from offset 0."""
    if not isinstance(fake_out, torch.Tensor) or concrete(fake_out.storage_offset(), bindings):
        return out
    size, stride = sizes_and_strides(fake_out, bindings)
    if list(out.shape) != size or not _non_overlapping_and_dense(size, stride):
        return out
    if list(out.stride()) == stride and (not whole or (
            out.storage_offset() == 0 and
            out.untyped_storage().nbytes() == out.numel() * out.element_size())):
        return out
    return torch.empty_strided(size, stride, dtype=out.dtype, device=out.device).copy_(out)


def _non_overlapping_and_dense(size: list[int], stride: list[int]) -> bool:
    """Every element of [0, numel) is one element of the layout (a permutation of a
    contiguous tensor)."""
    expected = 1
    dims = sorted((st, n) for n, st in zip(size, stride) if n != 1)
    for st, n in dims:
        if st != expected:
            return False
        expected *= n
    return True


def _repeated_outputs(gm: torch.fx.GraphModule) -> list[tuple[int, int]]:
    """(output index, index of the first output that is the same tensor) for outputs eager
    returns as one tensor object under two names (v1 = v0.to(v0.dtype) is v0): the code after a
    graph break that resizes v0 sees v1 resized too, so they must come back as one object. (The
    graph's outputs are separate tensors: a view, or a copy without views.)"""
    flat = _output_nodes(gm)
    first: dict[int, int] = {}
    repeated = []
    for index, node in enumerate(flat):
        value = example_value(node, ("example_value",)) if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            continue
        if id(value) in first:
            repeated.append((index, first[id(value)]))
        else:
            first[id(value)] = index
    return repeated


def _geometry(t: torch.Tensor) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """Sizes, strides and offset as traced (symbolic ones by their hints)."""
    return (tuple(concrete(v) for v in t.shape), tuple(concrete(v) for v in t.stride()),
            concrete(t.storage_offset()))


def _view_of(base: torch.Tensor, fake_out: torch.Tensor, bindings: Mapping[Any, Any]
             ) -> torch.Tensor:
    """A view of input `base` laid out as eager's output `fake_out`: its sizes, strides and
    offset, and its dtype and conjugate/negative bits (x.view(torch.int32), x.conj(): as_strided
    alone keeps the input's, which gave an output of the input's dtype, or conjugated values)."""
    size, stride, offset = _eager_geometry(fake_out, bindings)
    view = base
    if fake_out.dtype != base.dtype:
        # The whole storage as one row, read in the output's dtype: offsets and strides are then
        # counted in the output's elements, as eager's view(dtype) counts them.
        whole = base.untyped_storage().nbytes() // base.element_size()
        view = base.as_strided((whole,), (1,), 0).view(fake_out.dtype)
    view = view.as_strided(size, stride, offset)
    if view.is_conj() != fake_out.is_conj():
        view = view.conj()
    if view.is_neg() != fake_out.is_neg():
        view = torch._neg_view(view)
    return view


def _symbolic(fake_inputs: list[Any]) -> bool:
    return any(isinstance(v, torch.SymInt) or (
        isinstance(v, torch.Tensor) and v.layout == torch.strided and any(
            isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride(), v.storage_offset())))
        for v in fake_inputs)


def _shape_env(fake_inputs: list[Any]) -> Any:
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode([v for v in fake_inputs if isinstance(v, torch.Tensor)])
    return None if mode is None else mode.shape_env


def _bind(shape_env: Any, fake_inputs: list[Any], args: tuple) -> Mapping[Any, Any]:
    """Symbol -> value, from the real arguments' sizes (empty with static shapes)."""
    if shape_env is None:
        return {}
    return shape_env.bind_symbols(fake_inputs, args)


def _eager_geometry(fake_out: torch.Tensor,
                    bindings: Mapping[Any, Any]) -> tuple[list[int], list[int], int]:
    """Sizes, strides and storage offset of `fake_out` for the real arguments (`bindings`)."""
    size, stride = sizes_and_strides(fake_out, bindings)
    return size, stride, concrete(fake_out.storage_offset(), bindings)
