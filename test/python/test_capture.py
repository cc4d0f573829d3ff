"""torch_functionalize.capture: graphs recorded in C++ while the engine functionalizes.

Every program the suite runs through reference.assert_matches_eager is also captured and replayed
against eager there. This file checks what is specific to capture: its graph is make_fx's graph of
the same functionalized program minus dead nodes (a stated rule, applied here to make_fx's graph),
pytrees and keyword arguments, constants, meta inputs, aliased inputs, errors, and the limits kept
visible as strict xfails.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize import capture

from torch_functionalize.testing._internal.reference import (
    _is_epilogue_node, assert_functional_graph, assert_trees_match, call_targets, clone_inputs,
)
from test_traces import CASES, CASE_IDS


def _removable(node):
    """The rule of Note [Capture: dead nodes]: unused, writes nothing, draws no random number."""
    if node.op != "call_function" or node.users:
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        return False
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags


def without_dead_nodes(gm):
    graph = gm.graph
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if _removable(node):
                graph.erase_node(node)
                changed = True
    gm.recompile()
    return gm


def without_epilogue(gm):
    """The program before its input epilogue: epilogue copy_ nodes erased, then dead nodes (the
    scatters or views that only fed them)."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and str(node.target) == "aten.copy_.default" and \
                _is_epilogue_node(node):
            gm.graph.erase_node(node)
    return without_dead_nodes(gm)


def make_fx_then_dce(f, *inputs, remove):
    gm = make_fx(tfz.functionalize(f, remove=remove))(*clone_inputs(inputs))
    return without_dead_nodes(gm)


@pytest.mark.parametrize("name, f, make_input, expected", CASES, ids=CASE_IDS)
def test_capture_is_make_fx_graph_without_dead_nodes(name, f, make_input, expected, remove):
    # Views-removed graphs: make_fx's graph minus dead nodes, op for op. Graphs with views: the
    # same before the epilogue (which capture narrows to the written regions; its numbers are
    # checked against eager by assert_matches_eager in test_traces).
    x = make_input()
    captured = capture(f, x.clone(), remove=remove)
    reference = make_fx_then_dce(f, x, remove=remove)
    assert_functional_graph(captured, remove)
    if remove == "mutations":
        captured, reference = without_epilogue(captured), without_epilogue(reference)
    assert call_targets(captured) == call_targets(reference), (
        f"capture:\n{captured.code}\nmake_fx without dead nodes:\n{reference.code}")


def test_dead_views_are_gone_and_epilogue_stays(remove):
    def f(x):
        x.diagonal()  # a view nobody reads
        x[0].add_(1)
        return x.sum()

    gm = capture(f, torch.randn(3, 3), remove=remove)
    targets = call_targets(gm)
    assert not any("diagonal" in t for t in targets), gm.code
    assert targets[-1] == "aten.copy_.default", gm.code


def test_pytrees_and_keyword_arguments_round_trip(remove):
    def f(state, x, *, scale):
        state["m"].mul_(scale)
        return {"y": x + state["m"], "n": [state["m"].sum(), 3]}

    def inputs():
        torch.manual_seed(0)
        return {"m": torch.randn(4)}, torch.randn(4)

    state, x = inputs()
    gm = capture(f, state, x, scale=2.0, remove=remove)
    state_g, x_g = inputs()
    state_e, x_e = inputs()
    assert_trees_match(gm(state_g, x_g, scale=2.0), f(state_e, x_e, scale=2.0), "output")
    assert_trees_match(state_g, state_e, "state")


def test_lists_of_tensors_are_checked_as_captured(remove):
    # An optimizer step's arguments: lists of tensors, read without pytree (capture.py,
    # _tensor_sequence_leaves); a list of another length or a tuple for a list is named as a
    # structure mismatch, another number as the constant the graph holds, and a number where a
    # tensor was captured by name (it was pybind's argument error).
    def step(params, grads, lr):
        torch._foreach_add_(params, grads, alpha=-lr)
        return params[0].sum()

    def inputs():
        torch.manual_seed(0)
        return [torch.randn(3) for _ in range(4)], [torch.randn(3) for _ in range(4)]

    gm = capture(step, *inputs(), 0.5, remove=remove)
    params_g, grads_g = inputs()
    params_e, grads_e = inputs()
    assert_trees_match(gm(params_g, grads_g, 0.5), step(params_e, grads_e, 0.5), "output")
    assert_trees_match(params_g, params_e, "params")
    params, grads = inputs()
    with pytest.raises(TypeError, match="captured for arguments of structure"):
        gm(params[:3], grads[:3], 0.5)
    with pytest.raises(TypeError, match="captured for arguments of structure"):
        gm(tuple(params), grads, 0.5)
    with pytest.raises(ValueError, match="a constant in the graph"):
        gm(params, grads, 0.25)
    with pytest.raises(TypeError, match="captured with a tensor for grads_4 and is called with"):
        gm(params, grads[:3] + [1.0], 0.5)


def test_generated_code_reads_checked_lists_and_numbers_without_fx_flatten(remove, monkeypatch):
    # Note [Capture: the generated code's flatten]: the graph's forward takes the leaves of
    # arguments shaped as captured (tensors, numbers, lists of tensors; a keyword is bound to its
    # position by the forward's signature) in one loop, and a GraphModule copy of the graph
    # without capture's check gives the same values through FX's own tree_flatten_spec.
    import torch.fx._pytree as fx_pytree

    def step(params, grads, lr):
        torch._foreach_add_(params, grads, alpha=-lr)
        return params[0] * lr

    def inputs():
        torch.manual_seed(0)
        return [torch.randn(3) for _ in range(4)], [torch.randn(3) for _ in range(4)]

    gm = capture(step, *inputs(), 0.5, remove=remove)
    assert "_tfz_flatten_arguments(self, " in gm.code
    fx_flattens = []
    fx_flatten = fx_pytree.tree_flatten_spec
    monkeypatch.setattr(fx_pytree, "tree_flatten_spec",
                        lambda *a, **k: fx_flattens.append(1) or fx_flatten(*a, **k))
    params_e, grads_e = inputs()
    expected = step(params_e, grads_e, 0.5)
    params_g, grads_g = inputs()
    assert_trees_match(gm(params_g, grads_g, 0.5), expected, "output")
    assert_trees_match(params_g, params_e, "params")
    assert fx_flattens == []
    params_k, grads_k = inputs()
    assert_trees_match(gm(params_k, grads_k, lr=0.5), expected, "output, lr by keyword")
    assert_trees_match(params_k, params_e, "params, lr by keyword")
    assert fx_flattens == []
    plain = torch.fx.GraphModule(gm, gm.graph)
    params_p, grads_p = inputs()
    assert_trees_match(plain(params_p, grads_p, 0.5), expected, "output of a plain copy")
    assert_trees_match(params_p, params_e, "params of a plain copy")
    assert fx_flattens, "the plain copy did not take FX's flatten"


def test_closure_tensors_become_buffers_of_the_graph_module(remove):
    w = torch.randn(4, 4)
    table = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def f(x):
        return (x @ w.t()) * table

    gm = capture(f, torch.randn(2, 4), remove=remove)
    attrs = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert attrs, gm.code
    assert all(isinstance(getattr(gm, a), torch.Tensor) for a in attrs)
    x = torch.randn(2, 4)
    torch.testing.assert_close(gm(x), f(x))
    if remove == "mutations_and_views":
        assert "aten.t.default" not in call_targets(gm), gm.code


def test_script_object_arguments_become_attributes_of_the_graph_module(remove):
    # A quantized op's packed weights are a TorchScript object: generated code has no literal for
    # it (the graph's code was a SyntaxError), so it is an attribute, like a generator. Quantized
    # ops have CPU kernels only: CPU tensors on every test device.
    cpu = torch.device("cpu")
    packed = torch.ops.quantized.linear_prepack(
        torch.quantize_per_tensor(torch.randn(3, 4, device=cpu), 0.05, 0, torch.qint8),
        torch.zeros(3, device=cpu))

    def f(x):
        return torch.ops.quantized.linear_dynamic(x, packed, True) * 2

    x, other = torch.randn(2, 4, device=cpu), torch.randn(2, 4, device=cpu)
    gm = capture(f, x, remove=remove)
    assert "_script_object_constant0" in gm.code
    assert torch.equal(gm(other), f(other))


def test_meta_inputs_compute_nothing_and_the_graph_runs_on_real_ones():
    def f(x, cache):
        cache[:, 3] = x
        return cache.sum(1)

    big = torch.empty(1 << 20, 1 << 20, device="meta")  # 4 TiB if it were real
    gm_big = capture(f, torch.empty(1 << 20, device="meta"), big)
    assert big.device.type == "meta"
    gm = capture(f, torch.empty(5, device="meta"), torch.empty(5, 6, device="meta"))
    x, cache = torch.randn(5), torch.zeros(5, 6)
    x_e, cache_e = x.clone(), cache.clone()
    torch.testing.assert_close(gm(x, cache), f(x_e, cache_e))
    torch.testing.assert_close(cache, cache_e)
    # Sizes are constants of a captured graph: other sizes are refused, not computed wrongly.
    with pytest.raises(RuntimeError, match=r"captured for x_1 with sizes \[1048576\]"):
        gm_big(x, cache)


def test_aliased_inputs_share_their_storage_in_the_graph():
    def f(a, b):
        a.add_(1)
        return b * 2

    # The graph is specialized to the aliasing it was captured with, as make_fx's is.
    base = torch.arange(6.0)
    gm = capture(f, base, base.view(2, 3), remove="mutations")
    x = torch.arange(6.0)
    x_e = x.clone()
    got = gm(x, x.view(2, 3))
    expected = f(x_e, x_e.view(2, 3))
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, x_e)


def test_random_ops_replay_the_generator_stream():
    def f(x):
        noise = torch.randn(3)
        x.add_(noise)
        return F.dropout(x, 0.5, training=True)

    gm = capture(f, torch.zeros(3))
    torch.manual_seed(5)
    x = torch.zeros(3)
    got = gm(x)
    torch.manual_seed(5)
    x_e = torch.zeros(3)
    expected = f(x_e)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, x_e)


def test_dead_random_op_is_kept_so_later_draws_match():
    def f(x):
        torch.rand(4)  # unused, but it advances the generator
        return x + torch.rand(4)

    gm = capture(f, torch.zeros(4))
    assert call_targets(gm).count("aten.rand.default") == 2, gm.code
    torch.manual_seed(2)
    got = gm(torch.zeros(4))
    torch.manual_seed(2)
    torch.testing.assert_close(got, f(torch.zeros(4)))


def test_module_parameters_and_buffers(remove):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
    params = dict(model.named_parameters()) | dict(model.named_buffers())

    def f(p, x):
        return torch.func.functional_call(model, p, (x,))

    def state():
        return {k: v.detach().clone() for k, v in params.items()}

    x = torch.randn(5, 4)
    gm = capture(f, state(), x, remove=remove)
    assert not any("native_batch_norm.default" == str(t) for t in call_targets(gm)), gm.code
    p_g, p_e = state(), state()
    torch.testing.assert_close(gm(p_g, x), f(p_e, x))
    assert_trees_match(p_g, p_e, "parameters and running stats")


def test_error_inside_leaves_dispatch_state_and_next_capture_works():
    def bad(x):
        x.add_(1)
        return x @ x  # 2x3 @ 2x3

    before = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        capture(bad, torch.randn(2, 3))
    after = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
    assert before == after
    gm = capture(lambda x: x.mul_(2), torch.ones(2))
    assert call_targets(gm) == ["aten.mul.Tensor", "aten.copy_.default"]


@pytest.mark.parametrize("case", ["vmap", "autocast", "nested", "tracer"])
def test_unsupported_contexts_raise_naming_make_fx(case):
    x = torch.randn(3)
    if case == "vmap":  # a transform around capture (inside f they work: test below)
        with pytest.raises(NotImplementedError, match=r"make_fx\(functionalize\(f\)\)"):
            torch.vmap(lambda t: capture(torch.sin, t))(x.view(3, 1))
    elif case == "autocast":
        with torch.autocast("cpu"):
            with pytest.raises(NotImplementedError, match=r"make_fx\(functionalize\(f\)\)"):
                capture(lambda t: t + 1, x)
    elif case == "nested":
        with pytest.raises(RuntimeError, match="capture the outer function"):
            tfz.functionalize(lambda t: capture(lambda u: u + 1, t))(x)
    else:
        with pytest.raises(NotImplementedError, match="TorchDispatchMode"):
            make_fx(lambda t: capture(lambda u: u + 1, t))(x)


def test_torch_func_transforms_inside_f_are_recorded_as_their_plain_ops(remove):
    def f(t):
        y = t.view(3, 1).clone()
        return torch.vmap(lambda r: r.mul_(2).sin())(y), torch.func.grad(lambda u: u.sin().sum())(t)

    x = torch.randn(3)
    gm = capture(f, x, remove=remove)
    assert_functional_graph(gm, remove)
    assert_trees_match(gm(x), f(x), "output")


def test_not_callable_and_bad_remove_are_errors():
    with pytest.raises(TypeError, match="capture: expected a callable"):
        capture(3, torch.ones(1))
    with pytest.raises(ValueError, match="mutations_and_views"):
        capture(lambda t: t, torch.ones(1), remove="views")


def test_generator_created_inside_f_replays_its_seeded_stream():
    # Note [Graphs: generator state set outside the dispatcher]: every replay draws from the
    # state f seeded, as each eager call does.
    def f(x):
        gen = torch.Generator(torch.get_default_device()).manual_seed(3)
        return x + torch.rand(3, generator=gen)

    gm = capture(f, torch.zeros(3))
    for _ in range(2):
        torch.testing.assert_close(gm(torch.zeros(3)), f(torch.zeros(3)))


def test_random_fill_of_transposed_input_replays_eager_numbers():
    # The graph fills a layout measured at capture time to draw eager's numbers in eager's order.
    # See Note [Kernel: random fills of strided tensors], case "in graphs".
    def f(x):
        return x.bernoulli_(0.5)

    gm = capture(f, torch.randn(3, 3).t())
    torch.manual_seed(0)
    x = torch.randn(3, 3).t()
    torch.manual_seed(1)
    got = gm(x)
    torch.manual_seed(0)
    x_e = torch.randn(3, 3).t()
    torch.manual_seed(1)
    torch.testing.assert_close(got, f(x_e))


# --- region-precise epilogue (Note [Capture: region-precise epilogue]) ---------------------------


def _epilogue_copies(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and str(n.target) == "aten.copy_.default"]


def _replay_matches_eager(gm, f, make):
    args_g, args_e = make(), make()
    assert_trees_match(gm(*args_g), f(*args_e), "output")
    assert_trees_match(args_g, args_e, "inputs")


def test_row_write_copies_only_the_row_and_drops_the_whole_input_scatter():
    def f(x):
        x[1].add_(1)
        return None

    gm = capture(f, torch.zeros(3, 4))
    (copy,) = _epilogue_copies(gm)
    dst = copy.args[0]
    assert str(dst.target) == "aten.select.int" and dst.args[1:] == (0, 1), gm.code
    assert not any("scatter" in t for t in call_targets(gm)), gm.code
    _replay_matches_eager(gm, f, lambda: (torch.arange(12.0).view(3, 4),))


def test_nested_slices_of_a_cache_write_one_slot():
    def f(cache, k):
        cache[:, :, 5:6] = k
        return cache[:, :, :6].sum()

    make = lambda: (torch.zeros(2, 3, 8, 4), torch.ones(2, 3, 1, 4))  # noqa: E731
    gm = capture(f, *make())
    (copy,) = _epilogue_copies(gm)
    # The destination is the slot, a 2x3x1x4 view of the cache.
    dst_val = copy.args[0]
    assert str(dst_val.target) == "aten.slice.Tensor" and dst_val.args[1:] == (2, 5, 6), gm.code
    _replay_matches_eager(gm, f, make)


def test_overlapping_writes_are_copied_in_program_order():
    def f(x):
        x[0:2].add_(1)
        x[1:3].mul_(2)
        x[2].fill_(7)

    make = lambda: (torch.arange(12.0).view(4, 3),)  # noqa: E731
    gm = capture(f, *make())
    assert len(_epilogue_copies(gm)) == 3, gm.code
    _replay_matches_eager(gm, f, make)


@pytest.mark.parametrize("case", ["whole_write", "metadata_then_write", "views_removed"])
def test_whole_input_copy_where_no_region_applies(case):
    # A write of the whole input, a write after a metadata change, and views-removed graphs keep
    # the single whole-input copy_ (still eager's results).
    if case == "whole_write":
        def f(x):
            x.mul_(2)
            x[0].add_(1)
    elif case == "metadata_then_write":
        def f(x):
            x.t_()
            x[0].add_(1)
    else:
        def f(x):
            x[0].add_(1)
    remove = "mutations_and_views" if case == "views_removed" else "mutations"
    make = lambda: (torch.arange(12.0).view(3, 4),)  # noqa: E731
    gm = capture(f, *make(), remove=remove)
    copies = _epilogue_copies(gm)
    assert len(copies) == 1, gm.code
    dst = copies[0].args[0]  # the input, or the input after its metadata epilogue (as_strided_)
    if str(dst.target) == "aten.as_strided_.default":
        dst = dst.args[0]
    assert dst.op == "placeholder", gm.code
    _replay_matches_eager(gm, f, make)


def test_aliased_inputs_with_region_writes():
    def f(a, b):
        a[0].add_(1)
        b[1:].mul_(3)
        return a.sum() + b.sum()

    base = torch.arange(8.0)

    def make():
        x = base.clone()
        return x.view(2, 4), x[2:]

    gm = capture(f, *make())
    _replay_matches_eager(gm, f, make)


@pytest.mark.parametrize("factory", [False, True])
def test_fake_tensor_inputs(factory):
    # FakeTensors (no mode active) work like meta tensors; a program that makes tensors of its
    # own needs a mode that accepts real constants (allow_non_fake_inputs), as any fake tracing.
    from torch._subclasses.fake_tensor import FakeTensorMode

    def f(x):
        x[0].add_(torch.ones(4) if factory else 1)
        return x.sum(0)

    with FakeTensorMode(allow_non_fake_inputs=factory):
        fake = torch.randn(3, 4)
    gm = capture(f, fake)
    x = torch.randn(3, 4)
    x_e = x.clone()
    torch.testing.assert_close(gm(x), f(x_e))
    torch.testing.assert_close(x, x_e)


def test_graph_recorded_by_the_cpp_api_reaches_python_as_the_same_fx_graph(remove):
    # _C._capture is tfz::capture (flat tensors in and out); graph_module_of builds FX from it the
    # way capture does: same ops, and it runs like the C++ graph object.
    from torch_functionalize import _C
    from torch_functionalize import graph_module_of

    def f(x, y):
        x[0].add_(y)
        return x * 2, y.sum()

    def flat(tensors):
        return list(f(*tensors))

    make = lambda: [torch.arange(12.0).view(3, 4), torch.ones(4)]  # noqa: E731
    cpp = _C._capture(make(), remove, flat)
    gm = graph_module_of(cpp)
    assert call_targets(gm) == call_targets(capture(f, *make(), remove=remove))
    a, b, e = make(), make(), make()
    assert_trees_match(list(gm(*a)), cpp(b), "FX vs C++ graph")
    assert_trees_match(a, b, "inputs: FX vs C++ graph")
    assert_trees_match(list(gm(*e)), list(f(*make())), "FX vs eager")


def test_capture_of_an_overload_named_by_a_keyword_compiles(remove):
    # aten.random.from (random_(from, to)): FX writes the overload's qualified name, a
    # SyntaxError in make_fx's graphs; capture's code names it through getattr
    # (Note [Capture: overloads named by a keyword]), and the node keeps the OpOverload.
    def f(x):
        x.random_(-3, 10)
        return x + 1

    gm = capture(f, torch.zeros(6, dtype=torch.int64), remove=remove)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert getattr(torch.ops.aten.random, "from") in targets
    torch.manual_seed(5)
    got_x = torch.zeros(6, dtype=torch.int64)
    got = gm(got_x)
    torch.manual_seed(5)
    eager_x = torch.zeros(6, dtype=torch.int64)
    expected = f(eager_x)
    assert torch.equal(got, expected) and torch.equal(got_x, eager_x)
    assert "getattr(torch.ops.aten.random, 'from')" in gm.code


# Note [Capture: guards on inputs]: a captured graph holds its inputs' sizes (and dtype, strides,
# device, aliasing, non-tensor arguments) as constants; on other ones it raises, naming the input.
def new_zeros_sized_like_input(x, y, k):
    y.add_(x)
    return x.new_zeros(x.shape[0]).add_(x.sum() * k)


@pytest.mark.parametrize("what, args", [
    ("sizes", lambda: (torch.ones(5), torch.ones(5), 2)),
    ("dtype", lambda: (torch.ones(3, dtype=torch.float64), torch.ones(3), 2)),
    ("strides", lambda: (torch.ones(6)[::2], torch.ones(3), 2)),
    ("requires_grad", lambda: (torch.ones(3, requires_grad=True), torch.ones(3), 2)),
    ("memory shared with", lambda: (lambda t: (t, t, 2))(torch.ones(3))),
    ("k_1 = 2", lambda: (torch.ones(3), torch.ones(3), 3)),
], ids=["sizes", "dtype", "strides", "requires_grad", "aliasing", "non_tensor"])
def test_graph_refuses_inputs_other_than_the_captured_ones(what, args, remove):
    gm = capture(new_zeros_sized_like_input, torch.ones(3), torch.ones(3), 2, remove=remove)
    a, e = (torch.full((3,), 2.0), torch.ones(3), 2), (torch.full((3,), 2.0), torch.ones(3), 2)
    assert_trees_match(gm(*a), new_zeros_sized_like_input(*e), "same metadata")
    assert_trees_match(a, e, "inputs")
    with pytest.raises((RuntimeError, ValueError), match=re.escape(what)):
        gm(*args())


def test_graph_takes_its_arguments_by_keyword_as_the_function_does():
    gm = capture(new_zeros_sized_like_input, torch.ones(3), torch.ones(3), 2)
    assert_trees_match(gm(torch.ones(3), k=2, y=torch.ones(3)),
                       new_zeros_sized_like_input(torch.ones(3), torch.ones(3), 2), "output")
    with pytest.raises(TypeError, match="takes the arguments"):
        gm(torch.ones(3), torch.ones(3))


# Note [Capture: dynamic sizes]: one graph for every size its shape guards accept, the inputs'
# writes and the outputs' pytree as eager's; sizes outside the guards are refused by name.
def branch_on_a_size(x, y, k=2):
    y.add_(x)
    z = x.new_zeros(x.shape[0]).add_(x.sum())
    if x.shape[0] > 2:
        return {"scaled": z * k, "flat": y.view(-1)}
    return {"scaled": z, "flat": y}


def test_dynamic_graph_replays_other_sizes_and_guards_what_it_specialized_on(remove):
    gm = capture(branch_on_a_size, torch.ones(4, 1), torch.ones(4, 1), dynamic=True, remove=remove)
    assert_functional_graph(gm, remove)
    for n in (3, 7, 50):
        a_in = (torch.randn(n, 1), torch.randn(n, 1))
        e_in = tuple(t.clone() for t in a_in)
        assert_trees_match(gm(*a_in), branch_on_a_size(*e_in), f"output, size {n}")
        assert_trees_match(a_in, e_in, f"inputs, size {n}")
    for args in [(torch.ones(2, 1), torch.ones(2, 1)),       # the other branch of the size test
                 (torch.ones(3, 1), torch.ones(4, 1)),       # sizes the trace unified
                 (torch.ones(3, 2), torch.ones(3, 2))]:      # a size 1 it specialized on
        with pytest.raises(RuntimeError, match="under the shape guards"):
            gm(*args)
    with pytest.raises(RuntimeError, match="with dtype"):
        gm(torch.ones(3, 1, dtype=torch.float64), torch.ones(3, 1))


def test_dynamic_capture_of_a_value_read_is_refused_naming_capture():
    # A branch on .item() cannot be guarded by symbolic sizes; the error was torch's
    # GuardOnDataDependentSymNode, which names neither capture nor what to do.
    def f(x):
        return x * 2 if x.sum().item() > 0 else x - 1

    with pytest.raises(NotImplementedError, match=r"capture\(dynamic=True\): the function reads"):
        capture(f, torch.randn(4), dynamic=True)
    graph = capture(f, torch.ones(4))  # without dynamic=True the read is guarded
    assert torch.equal(graph(torch.ones(4)), f(torch.ones(4)))
    with pytest.raises(RuntimeError, match="specialized on it"):
        graph(-torch.ones(4))


# Value reads make_fx lets through as unbacked symbols: before, the graph kept the captured index
# (x[i.item()]), dropped a torch._check on the value, or failed every replay with a NameError
# from the guard expression (x[:n.item()]). See Note [Capture: dynamic sizes].
UNBACKED_READS = {
    "index_by_a_value": lambda x, n: x[n.item()] * 2,
    "checked_value": lambda x, n: (torch._check(n.item() >= 2), x * n.item())[1],
    "slice_to_a_value": lambda x, n: x[:n.item()].sum(),
}


@pytest.mark.parametrize("name", sorted(UNBACKED_READS))
def test_dynamic_capture_of_a_value_read_as_an_unbacked_symbol_is_refused(name):
    with pytest.raises(NotImplementedError, match=r"capture\(dynamic=True\): the function reads"):
        capture(UNBACKED_READS[name], torch.arange(5.0), torch.tensor(3), dynamic=True)


def test_dynamic_capture_keeps_checks_on_data_dependent_sizes():
    # torch._check on nonzero's count is a deferred runtime assert of the trace: the graph raises
    # where eager does (before: dropped, the graph returned numbers).
    def f(x):
        n = x.nonzero().shape[0]
        torch._check(n >= 2)
        return x * 2 + n

    gm = capture(f, torch.tensor([1.0, 2.0, 0.0]), dynamic=True)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(gm(x), f(x))
    with pytest.raises(RuntimeError):
        f(torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(RuntimeError, match="u0 >= 2"):
        gm(torch.tensor([1.0, 0.0, 0.0]))


def _replaces_values(w, y):
    h = w * 2
    h[:, 0] = h[:, 1] * 3
    h2 = h.clone()
    h2.copy_(y)
    return (h.sin() + h2 * w).sum()


def test_backward_through_a_captured_graph_that_replaces_values_matches_eager(remove):
    # Note [Graphs: copy's derivative when a graph runs under autograd]: the graph's aten.copy has
    # no derivative in torch ("derivative for aten::copy is not implemented", before); called with
    # inputs that require grad, a twin with eager's derivative runs, and the graph keeps aten.copy.
    w, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    graph = capture(_replaces_values, w, y, remove=remove)
    assert "aten.copy.default" in call_targets(graph)
    expected = torch.autograd.grad(_replaces_values(w, y), (w, y))
    assert_trees_match(torch.autograd.grad(graph(w, y), (w, y)), expected, "gradients")
    with torch.no_grad():
        assert_trees_match(graph(w, y), _replaces_values(w, y), "output without grad")
