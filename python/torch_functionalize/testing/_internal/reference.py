"""Reference checks shared by the Python tests (and the OpInfo cases): eager parity and graph
inspection.

`assert_matches_eager` runs a program eagerly and functionalized on separate copies of the same
inputs and compares outputs and the final state of every input (modeled on PyTorch's
`assert_functionalization`). `trace`, `graph_ops` and `assert_functional_graph` inspect the
graph that `make_fx` records for a functionalized program.
"""

import contextlib
import os
import re

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing import clone_inputs, compare

REMOVE_MODES = ("mutations", "mutations_and_views")

# The device the tests run on: the one place it is read (test/python/conftest.py makes it
# torch's default device; opinfo_programs.DEVICE reads the same variable). Default cpu.
TEST_DEVICE = os.environ.get("TFZ_TEST_DEVICE", "cpu")

# Ops the input write-back epilogue may apply to placeholders: data write-back (copy_) and eager's
# final metadata (as_strided_, and resize_ where the storage grows).
# See Note [Inputs: metadata epilogue].
EPILOGUE_OPS = frozenset({"copy_", "as_strided_", "resize_"})


def default_impl():
    """The functionalize under test; imported lazily so this module loads without the engine."""
    import torch_functionalize

    return torch_functionalize.functionalize


def assert_trees_match(actual, expected, what, check_strides=False):
    """Same pytree structure; tensors equal (type, dtype, shape, values, NaNs); other leaves ==.
    The rule is torch_functionalize.testing.compare's (shared with the benchmarks and the CLI)."""
    problem = compare(actual, expected, what, check_strides=check_strides)
    assert problem is None, problem


def assert_matches_eager(
    f,
    *inputs,
    remove="mutations",
    impl=None,
    make_inputs=None,
    check_input_strides=True,
    check_graph=True,
    capture_values=True,
    make_fx_refusal=None,
    **kwargs,
):
    """Checks that impl(f, remove=remove) matches eager f on outputs and final input state.

    Inputs are either given (and cloned twice, strides preserved) or built fresh twice by
    `make_inputs()`, which returns the tuple of positional arguments; use it for inputs that
    are views of a base. kwargs are passed to f. With check_graph, the program is also traced
    with make_fx and its graph must pass assert_functional_graph (no mutation escaped the
    pass). With check_graph, torch_functionalize.capture(f) must also give a functional graph
    that, replayed on fresh inputs, matches eager (assert_capture_matches_eager); capture_values=False
    limits that replay to shapes and dtypes, for programs whose random stream a graph cannot
    replay (say why at the call). Returns the functionalized outputs.
    """
    impl = impl or default_impl()
    if make_inputs is not None:
        assert not inputs, "pass either inputs or make_inputs, not both"
        eager_args, func_args = tuple(make_inputs()), tuple(make_inputs())
    else:
        eager_args, func_args = clone_inputs(inputs), clone_inputs(inputs)
    eager_kwargs, func_kwargs = clone_inputs(kwargs), clone_inputs(kwargs)

    rng = _rng_state()
    with _recording_seeds() as seeds:
        expected = f(*eager_args, **eager_kwargs)
    actual = impl(f, remove=remove)(*func_args, **func_kwargs)
    assert_trees_match(actual, expected, "output")

    # Final state of every input tensor, and of the base it views when it is a view.
    eager_leaves = pytree.tree_leaves((eager_args, eager_kwargs))
    func_leaves = pytree.tree_leaves((func_args, func_kwargs))
    for i, (a, e) in enumerate(zip(func_leaves, eager_leaves)):
        if not isinstance(e, torch.Tensor):
            continue
        assert_trees_match(a, e, f"input {i}", check_input_strides)
        if check_input_strides:
            assert a.storage_offset() == e.storage_offset(), f"input {i}: storage offset"
        if e._base is not None:
            assert a._base is not None, f"input {i}: lost its base"
            assert_trees_match(a._base, e._base, f"base of input {i}", check_input_strides)

    if check_graph:
        graph_args = tuple(make_inputs()) if make_inputs is not None else clone_inputs(inputs)
        functional = impl(f, remove=remove)
        if make_fx_refusal is None:
            gm = make_fx(lambda a, kw: functional(*a, **kw))(graph_args, clone_inputs(kwargs))
            assert_functional_graph(gm, remove)
        else:
            try:
                make_fx(lambda a, kw: functional(*a, **kw))(graph_args, clone_inputs(kwargs))
            except NotImplementedError as error:
                assert re.search(make_fx_refusal, str(error)), error
            else:
                raise AssertionError(f"make_fx did not refuse: expected {make_fx_refusal!r}")
        if impl is default_impl():
            fresh = (lambda: tuple(make_inputs())) if make_inputs is not None else (
                lambda: clone_inputs(inputs))
            # A seed set inside f is a Python side effect no graph records (make_fx's neither):
            # the replay starts from it, which is right while f seeds before drawing.
            if len(seeds) == 1:
                torch.manual_seed(seeds[0])
                rng = _rng_state()
            assert len(seeds) <= 1, "f seeds more than once: a graph cannot replay that"
            assert_capture_matches_eager(f, fresh, kwargs, remove, expected,
                                         (eager_args, eager_kwargs), rng, check_input_strides,
                                         capture_values)
    return actual


def assert_foreach_on_aliased_lists_matches_eager(f, *args, remove):
    """assert_matches_eager for in-place _foreach_ ops whose lists alias each other, per device.
    On the CPU the values must be eager's. On CUDA eager's fused kernel runs all elements at once,
    so where elements overlap across positions with a write its result is a race: ours refuses
    those by name, and gives eager's values for lists that share a storage without overlapping
    (Note [Kernel: _foreach_ ops on aliased lists on CUDA]); a value that differs from eager's
    fails on every device."""
    if torch.device(TEST_DEVICE).type == "cpu":
        return assert_matches_eager(f, *args, remove=remove)
    try:
        return assert_matches_eager(f, *args, remove=remove)
    except NotImplementedError as error:
        assert "overlap in memory on cuda" in str(error), error
        return None


@contextlib.contextmanager
def _recording_seeds():
    """The seeds torch.manual_seed is called with in the block."""
    seeds, original = [], torch.manual_seed

    def record(seed):
        seeds.append(seed)
        return original(seed)

    torch.manual_seed = record
    try:
        yield seeds
    finally:
        torch.manual_seed = original


def _rng_state():
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all()
                                   if torch.cuda.is_available() else None)


def _set_rng_state(state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def assert_capture_matches_eager(f, fresh_args, kwargs, remove, expected, eager_state, rng,
                                 check_input_strides=True, values=True):
    """torch_functionalize.capture(f) gives a functional graph (assert_functional_graph) that, run
    on fresh inputs, returns eager's outputs and leaves the inputs as eager left them. Random ops
    replay: the generator is reset to the same state before eager's run and the graph's."""
    import torch_functionalize

    gm = torch_functionalize.capture(f, *fresh_args(), remove=remove, **clone_inputs(kwargs))
    assert_functional_graph(gm, remove)
    args, kw = fresh_args(), clone_inputs(kwargs)
    after = _rng_state()
    _set_rng_state(rng)
    out = gm(*args, **kw)
    _set_rng_state(after)
    if not values:
        out, expected = _metadata(out, False), _metadata(expected, False)
        args, kw = _metadata((args, kw), check_input_strides)
        eager_state = _metadata(eager_state, check_input_strides)
    assert_trees_match(out, expected, "captured graph output")
    for i, (a, e) in enumerate(zip(pytree.tree_leaves((args, kw)), pytree.tree_leaves(eager_state))):
        if isinstance(e, torch.Tensor):
            assert_trees_match(a, e, f"captured graph: input {i}", check_input_strides)


def _metadata(tree, strides):
    """Tensors replaced by their shape and dtype (and strides): what a replay must match when its
    values cannot."""
    return pytree.tree_map(lambda t: (tuple(t.shape), t.dtype) + ((t.stride(),) if strides else ())
                           if isinstance(t, torch.Tensor) else t, tree)


def trace(f, *inputs, remove="mutations", impl=None, tracing_mode="real"):
    """The GraphModule make_fx records for impl(f, remove=remove) on clones of inputs."""
    impl = impl or default_impl()
    return make_fx(impl(f, remove=remove), tracing_mode=tracing_mode)(*clone_inputs(inputs))


def call_targets(gm):
    """str(node.target) of every call_function node, in graph order."""
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def graph_ops(f, *inputs, remove="mutations", impl=None, tracing_mode="real"):
    """Op sequence (str(node.target) of call_function nodes) of the traced program."""
    return call_targets(trace(f, *inputs, remove=remove, impl=impl, tracing_mode=tracing_mode))


def _schema(node):
    return getattr(node.target, "_schema", None)


def _is_view_schema(schema):
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _is_epilogue_node(node):
    """An epilogue op whose mutated argument is a placeholder (or module state, which
    functionalize_graph keeps as attributes), directly or via epilogue ops."""
    schema = _schema(node)
    if schema is None or schema.name.split("::")[-1] not in EPILOGUE_OPS:
        return False
    first = node.args[0] if node.args else None
    if not isinstance(first, torch.fx.Node):
        return False
    return _is_input_region(first) or _is_epilogue_node(first)


def _is_input_region(node):
    """A placeholder (or module state), or a chain of view ops of one: capture's epilogue writes
    the regions a program wrote through views of the input (Note [Capture: region-precise
    epilogue]), e.g. copy_(select(x, 0, 1), new_row). An epilogue op returns its input, so a
    view of one is a region too: a storage grown by the epilogue's resize_ is written whole through
    as_strided of the resized input (Note [Inputs: writes to a grown storage])."""
    if node.op in ("placeholder", "get_attr"):
        return True
    schema = _schema(node)
    return (node.op == "call_function" and schema is not None and _is_view_schema(schema)
            and bool(node.args) and isinstance(node.args[0], torch.fx.Node)
            and (_is_input_region(node.args[0]) or _is_epilogue_node(node.args[0])))


def assert_functional_graph(gm, remove):
    """No mutable op except the trailing input write-back; no view op in mutations_and_views.

    The epilogue is the maximal tail of call_function nodes that are epilogue ops applied to
    placeholders, together with the functional ops that compute their operands.
    """
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    first_epilogue = len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        schema = _schema(nodes[i])
        if _is_epilogue_node(nodes[i]):
            first_epilogue = i
        elif schema is not None and schema.is_mutable:
            break
    written = set()  # placeholders an epilogue op has already written
    for i, node in enumerate(nodes):
        schema = _schema(node)
        if schema is None:
            continue
        in_epilogue = i >= first_epilogue and _is_epilogue_node(node)
        if schema.is_mutable:
            assert in_epilogue, f"mutable op {node.target} left in the graph:\n{gm.code}"
        elif remove == "mutations_and_views" and _is_view_schema(schema):
            raise AssertionError(f"view op {node.target} left in the graph:\n{gm.code}")
        if in_epilogue:
            written.update((node, node.args[0]))
        elif i > first_epilogue and _is_input_region(node):
            pass  # a view of a written input, for the next epilogue op: it reads no data
        else:
            read = set(node.all_input_nodes) & written
            assert not read, f"{node.target} reads {read} after the write-back:\n{gm.code}"


def _autograd_state(t):
    """What autograd says of an input after the call: requires_grad, is_leaf, the grad_fn's type
    and .grad (detached, or None)."""
    grad = t.grad.detach() if t.is_leaf and t.grad is not None else None
    return (t.requires_grad, t.is_leaf, type(t.grad_fn).__name__, grad)


def assert_captured_module_step_matches_eager(model, make_step, inputs, remove, atol=None,
                                               rtol=None):
    """A step over a module that f captures (model(x) inside f, not functional_call), run on two
    deep copies of `model`: `make_step(m)` eagerly and functionalized, from the same seed. Their
    outputs, the copies' state_dicts and their parameters' .grad must be eager's. Returns the
    functionalized step's output. See Note [Kernel: writes into captured tensors]."""
    import copy

    import torch_functionalize

    expected_model, actual_model = copy.deepcopy(model), copy.deepcopy(model)
    torch.manual_seed(1)
    expected = make_step(expected_model)(*inputs)
    torch.manual_seed(1)
    actual = torch_functionalize.functionalize(make_step(actual_model), remove=remove)(*inputs)
    tolerances = {} if atol is None else {"atol": atol, "rtol": rtol}
    torch.testing.assert_close(actual, expected, **tolerances)
    torch.testing.assert_close(actual_model.state_dict(), expected_model.state_dict(),
                               **tolerances)
    for p, q in zip(actual_model.parameters(), expected_model.parameters()):
        assert (p.grad is None) == (q.grad is None), "a .grad is set in one run only"
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **tolerances)
    return actual


def assert_call_and_graphs_match_eager(f, traced_on, other, remove):
    """The eager call on `other`, and make_fx and capture graphs traced on `traced_on` and
    replayed on `other`, against eager on `other`."""
    import torch_functionalize

    expected = f(*other)
    assert_trees_match(torch_functionalize.functionalize(f, remove=remove)(*other), expected,
                       "eager call")
    graph = make_fx(torch_functionalize.functionalize(f, remove=remove))(*traced_on)
    assert_functional_graph(graph, remove)
    assert_trees_match(graph(*other), expected, "make_fx on other inputs")
    captured = torch_functionalize.capture(f, *traced_on, remove=remove)
    assert_trees_match(captured(*other), expected, "capture on other inputs")


def assert_client_matches_eager(f, make_inputs, *, remove, graphs=("make_fx", "capture"),
                                check_version=True):
    """Client code (torch.optim steps, nn modules, training loops) against eager: the same inputs
    from `make_inputs()` (seeded), f run eagerly and functionalized from the same generator state.
    Compares the outputs and every input's final value and autograd state (requires_grad, is_leaf,
    grad_fn type, .grad, and the version counter). Then each graph in `graphs` (make_fx of the
    functionalized f, capture(f)) must be functional (assert_functional_graph) and, replayed on
    fresh inputs from the same generator state, give eager's outputs and input values (.grad is
    not a graph's: a graph returns what f returns), and so on inputs drawn from another seed.
    Both graphs are called like f, in grad mode:
    a make_fx graph holds the backward ops it traced, and writes leaves that require grad with
    grad mode off (Note [API: epilogue writes of leaves in graphs])."""
    import torch_functionalize

    def run(fn, inputs_seed=0):
        torch.manual_seed(inputs_seed)
        inputs = make_inputs()
        versions = [t._version for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        torch.manual_seed(1)
        out = fn(*inputs)
        return inputs, out, versions

    def replay_matches(gm, out, inputs, label, inputs_seed=0):
        r_in, r_out, _ = run(gm, inputs_seed)
        assert_trees_match(r_out, out, f"{label}: output")
        expected = [t for t in pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
        replayed = [t for t in pytree.tree_leaves(r_in) if isinstance(t, torch.Tensor)]
        for i, (r, e) in enumerate(zip(replayed, expected)):
            assert_trees_match(r.detach(), e.detach(), f"{label}: input {i}")

    e_in, e_out, e_versions = run(f)
    a_in, a_out, a_versions = run(torch_functionalize.functionalize(f, remove=remove))
    assert a_versions == e_versions
    assert_trees_match(a_out, e_out, "output")
    e_leaves = [t for t in pytree.tree_leaves(e_in) if isinstance(t, torch.Tensor)]
    a_leaves = [t for t in pytree.tree_leaves(a_in) if isinstance(t, torch.Tensor)]
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        assert_trees_match(a, e, f"input {i}")
        actual, expected = _autograd_state(a), _autograd_state(e)
        assert actual[:3] == expected[:3], f"input {i}: autograd state {actual[:3]} != {expected[:3]}"
        assert_trees_match(actual[3], expected[3], f"input {i}: .grad")
        if check_version:
            assert a._version == e._version, f"input {i}: version {a._version} != {e._version}"
    builders = {
        "make_fx": lambda *args: make_fx(torch_functionalize.functionalize(f, remove=remove))(*args),
        "capture": lambda *args: torch_functionalize.capture(f, *args, remove=remove),
    }
    for name in graphs:
        gm = run(builders[name])[1]
        assert_functional_graph(gm, remove)
        replay_matches(gm, out=e_out, inputs=e_in, label=f"{name} replay")
        # Other inputs: a value the graph baked in (a constant where an input-derived tensor
        # belongs) gives the traced inputs' numbers here.
        o_in, o_out, _ = run(f, inputs_seed=2)
        try:
            replay_matches(gm, out=o_out, inputs=o_in, label=f"{name} replay on other inputs",
                           inputs_seed=2)
        except RuntimeError as error:  # a guarded read: Note [Capture: guards on values read]
            if "specialized on" not in str(error):
                raise
