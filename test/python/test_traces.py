"""Op sequences that make_fx records after the pass, pinned and compared with torch.func.

The programs are those of torch.func.functionalize's documentation and PyTorch's
functionalization design note. For each one the graph must (1) equal the op sequence of
torch.func.functionalize traced in the same run, in both remove modes and for real and fake
tracing, (2) equal the short expected list written below, and (3) hold no mutable op except
the input write-back epilogue, and no view op in "mutations_and_views" mode.
"""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
# The first four programs are also demo programs: one definition for both.
from torch_functionalize.cli.programs import clone_add as clone_then_add_
from torch_functionalize.cli.programs import input_mutated_through_view, view_of_mutated_intermediate
from torch_functionalize.cli.programs import slice_mutation as column_of_clone_mutated

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_functional_graph, assert_matches_eager, assert_trees_match, call_targets,
    trace,
)


def several_aliases_mutated_and_read(x):
    a = x.clone()
    flat = a.view(-1)
    row = a[0]
    tr = a.t()
    flat.add_(1)
    row.mul_(2)
    return flat, row, tr, a


def diagonal_of_input_mutated(x):
    y = torch.ones(3, 3)
    torch.diagonal(x).add_(y[0])
    return x


# (id, program, input factory, expected ops with remove="mutations").
CASES = [
    # (a) A mutation of a fresh clone becomes an out-of-place add; nothing is written back.
    ("clone_then_add_", clone_then_add_, lambda: torch.randn(2, 3),
     ["aten.clone.default", "aten.add.Tensor"]),
    # (b) The view b of a mutated intermediate is regenerated from the new base before return.
    ("view_of_mutated_intermediate", view_of_mutated_intermediate, lambda: torch.randn(2, 3),
     ["aten.add.Tensor", "aten.view.default", "aten.add.Tensor", "aten.view.default"]),
    # (c) A mutation through a view of an input is replayed on the base, then copied back.
    ("input_mutated_through_view", input_mutated_through_view, lambda: torch.randn(2, 3),
     ["aten.view.default", "aten.add.Tensor", "aten.view.default", "aten.view.default",
      "aten.copy_.default"]),
    # (d) A mutation through a select view becomes select_scatter into the base.
    ("column_of_clone_mutated", column_of_clone_mutated, lambda: torch.randn(3, 3),
     ["aten.clone.default", "aten.select.int", "aten.add.Tensor",
      "aten.select_scatter.default", "aten.select.int"]),
    # (e) Several outstanding aliases of one base: each write is scattered into the base and
    # every alias returned is regenerated from the final base.
    ("several_aliases_mutated_and_read", several_aliases_mutated_and_read,
     lambda: torch.randn(2, 3),
     ["aten.clone.default", "aten.view.default", "aten.select.int", "aten.t.default",
      "aten.add.Tensor", "aten.view.default", "aten.view.default", "aten.select.int",
      "aten.mul.Tensor", "aten.select_scatter.default", "aten.select.int",
      "aten.view.default", "aten.t.default"]),
    # (f) A factory inside f (ones) feeds a mutation through diagonal of an input:
    # diagonal_scatter into the input's value, then one trailing copy_ into the input.
    ("diagonal_of_input_mutated", diagonal_of_input_mutated, lambda: torch.randn(3, 3),
     ["aten.ones.default", "aten.diagonal.default", "aten.select.int", "aten.add.Tensor",
      "aten.diagonal_scatter.default", "aten.diagonal.default", "aten.copy_.default"]),
]
CASE_IDS = [c[0] for c in CASES]

# View op -> its *_copy form, which "mutations_and_views" records instead.
_COPY_VARIANT = {
    "aten.view.default": "aten.view_copy.default",
    "aten.select.int": "aten.select_copy.int",
    "aten.t.default": "aten.t_copy.default",
    "aten.diagonal.default": "aten.diagonal_copy.default",
}
_VIEW_OPS = set(_COPY_VARIANT)
_MUTABLE_OPS = {"aten.add_.Tensor", "aten.mul_.Tensor", "aten.fill_.Scalar"}


def expected_ops(expected_mutations, remove):
    if remove == "mutations":
        return list(expected_mutations)
    return [_COPY_VARIANT.get(op, op) for op in expected_mutations]


@pytest.mark.parametrize("tracing_mode", ["real", "fake"])
@pytest.mark.parametrize("name, f, make_input, expected", CASES, ids=CASE_IDS)
def test_trace_matches_torch_func(name, f, make_input, expected, remove, tracing_mode):
    # Our graph's op sequence equals torch.func.functionalize's for the same program and mode.
    x = make_input()
    ours = trace(f, x, remove=remove, tracing_mode=tracing_mode)
    theirs = trace(f, x, remove=remove, impl=torch.func.functionalize, tracing_mode=tracing_mode)
    assert call_targets(ours) == call_targets(theirs), f"ours:\n{ours.code}\ntorch.func:\n{theirs.code}"
    assert_functional_graph(ours, remove)


@pytest.mark.parametrize("name, f, make_input, expected", CASES, ids=CASE_IDS)
def test_trace_matches_expected_ops(name, f, make_input, expected, remove):
    # The pinned op list is present, no in-place op survives, and in "mutations_and_views"
    # no view op survives.
    gm = trace(f, make_input(), remove=remove)
    ops = call_targets(gm)
    assert ops == expected_ops(expected, remove), gm.code
    assert not _MUTABLE_OPS & set(ops), gm.code
    if remove == "mutations_and_views":
        assert not _VIEW_OPS & set(ops), gm.code


@pytest.mark.parametrize("name, f, make_input, expected", CASES, ids=CASE_IDS)
def test_traced_program_matches_eager(name, f, make_input, expected, remove):
    # The program itself, and the graph traced from it, compute what eager computes.
    assert_matches_eager(f, make_input(), remove=remove)
    x = make_input()
    gm = trace(f, x, remove=remove)
    eager_x, graph_x = x.clone(), x.clone()
    torch.testing.assert_close(gm(graph_x), f(eager_x))
    torch.testing.assert_close(graph_x, eager_x)


def test_trace_has_no_wrapper_constants(remove):
    # Wrappers never leak into the graph as constants: every tensor comes from a placeholder or
    # a recorded op.
    gm = trace(diagonal_of_input_mutated, torch.randn(3, 3), remove=remove)
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"], gm.code


def test_trace_of_metadata_mutation_on_input(remove):
    # x.t_() on an input ends the graph with one as_strided_ to eager's sizes, strides and offset
    # (Note [Inputs: metadata epilogue]), and no copy_: no data was written.
    def f(x):
        x.t_()
        return x + 1

    gm = trace(f, torch.randn(2, 3), remove=remove)
    assert_functional_graph(gm, remove)
    on_input = [str(n.target) for n in gm.graph.nodes
                if n.op == "call_function" and n.args and getattr(n.args[0], "op", "") == "placeholder"
                and str(n.target).endswith("_.default")]
    assert on_input == ["aten.as_strided_.default"], gm.code


def test_trace_of_metadata_mutations_that_cancel_has_no_epilogue(remove):
    # t_ twice, or unsqueeze_ then squeeze_, leaves the input as it was: nothing is emitted.
    def f(x):
        x.t_()
        x.t_()
        x.unsqueeze_(0).squeeze_(0)
        return x + 1

    gm = trace(f, torch.randn(2, 3), remove=remove)
    assert_functional_graph(gm, remove)
    targets = call_targets(gm)
    assert not any(t.endswith("_.default") or t.endswith("_.int") or t.endswith("_.dim")
                   for t in targets), gm.code


def test_metadata_epilogue_with_storage_growth_matches_eager(remove):
    # resize_ past the storage, then a transpose: resize_ (eager's storage size) then as_strided_.
    def f(x):
        x.resize_(4, 5)
        x.t_()
        x.fill_(2)
        return x.clone()

    x, e = torch.randn(2, 3), torch.randn(2, 3)
    gm = trace(f, x.clone(), remove=remove)
    assert_functional_graph(gm, remove)
    got = tfz.functionalize(f, remove=remove)(x)
    expected = f(e)
    torch.testing.assert_close(got, expected)
    assert (x.shape, x.stride(), x.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
    assert x.untyped_storage().nbytes() == e.untyped_storage().nbytes()
    torch.testing.assert_close(x, e)


def test_trace_symbolic_matches_torch_func(remove):
    # Symbolic tracing of (c) gives the same op sequence as torch.func.
    ours = make_fx(
        tfz.functionalize(input_mutated_through_view, remove=remove), tracing_mode="symbolic"
    )(torch.randn(2, 3))
    theirs = make_fx(
        torch.func.functionalize(input_mutated_through_view, remove=remove),
        tracing_mode="symbolic",
    )(torch.randn(2, 3))
    # Size reads (sym_size) are no ops: FX places each before its first use, and ours are used
    # earlier (the meta run that gives a view wrapper eager's symbolic strides without views).
    def ops(gm):
        return [t for t in call_targets(gm) if not t.startswith("aten.sym_")]

    assert ops(ours) == ops(theirs), f"ours:\n{ours.code}\ntorch.func:\n{theirs.code}"
    assert sorted(call_targets(ours)) == sorted(call_targets(theirs))


def _transposed_in_place(x):
    x.t_()
    return x + 1


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_symbolic_trace_of_an_in_place_view_of_an_input_is_functional(remove):
    # x.t_() on an input: the epilogue is one as_strided_ with symbolic arguments (no aten.t_
    # left in the graph), and a replay on another size leaves the input as eager's t_ does.
    gm = make_fx(tfz.functionalize(_transposed_in_place, remove=remove),
                 tracing_mode="symbolic")(torch.randn(3, 4))
    assert_functional_graph(gm, remove)
    assert "aten.t_." not in gm.code
    x, expected_x = torch.randn(5, 2), torch.randn(5, 2)
    expected_x.copy_(x)
    expected = _transposed_in_place(expected_x)
    assert_trees_match(gm(x), expected, "output")
    assert (x.shape, x.stride()) == (expected_x.shape, expected_x.stride())


OUT_OF_SYMBOLIC_SIZES = {
    "add": lambda x, out: torch.add(x, 1, out=out),
    "sin": lambda x, out: torch.sin(x, out=out),
    "cat": lambda x, out: torch.cat([x, x], out=out),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(OUT_OF_SYMBOLIC_SIZES))
def test_symbolic_trace_of_an_empty_out_resizes_it_to_symbolic_sizes(name, remove):
    # An empty out= resized to a result of symbolic sizes: the epilogue's resize_ takes the
    # result's symbolic sizes (it took the traced ones, 5 and 10: a replay on another size raised;
    # torch.func's trace fails with torch's "Expected IntList but got GenericList").
    f = OUT_OF_SYMBOLIC_SIZES[name]
    gm = make_fx(tfz.functionalize(f, remove=remove),
                 tracing_mode="symbolic")(torch.randn(5, 2), torch.empty(0))
    assert_functional_graph(gm, remove)
    for rows in (5, 7):
        x = torch.randn(rows, 2)
        out, expected_out = torch.empty(0), torch.empty(0)
        expected = f(x, expected_out)
        assert_trees_match(gm(x, out), expected, "output")
        assert_trees_match(out, expected_out, "out")


def test_resize_to_symbolic_sizes_is_refused_by_name():
    def f(x, out):
        return out.resize_(x.shape).copy_(x + 1)

    with pytest.raises(NotImplementedError, match="aten::resize_: resizing to symbolic sizes"):
        make_fx(tfz.functionalize(f), tracing_mode="symbolic")(torch.randn(5, 2), torch.empty(0))


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_symbolic_trace_of_resize_as_to_the_same_sizes_changes_nothing(remove):
    # resize_as_ of a tensor of the same symbolic sizes: eager changes nothing (a guard between
    # the two inputs' sizes, not a refusal).
    def f(x, y):
        return y.resize_as_(x).copy_(x) * 2

    gm = make_fx(tfz.functionalize(f, remove=remove),
                 tracing_mode="symbolic")(torch.randn(5, 2), torch.empty(5, 2))
    assert_functional_graph(gm, remove)
    x, y, expected_y = torch.randn(7, 2), torch.empty(7, 2), torch.empty(7, 2)
    assert_trees_match(gm(x, y), f(x, expected_y), "output")
    assert_trees_match(y, expected_y, "y")


def _restrided_then_written(x):
    x.as_strided_((2, 2), (1, 2), 1)
    x.add_(1)
    return x * 2


def test_input_restrided_then_written_is_copied_back_once(remove):
    # The entry write (x's six elements, written before its metadata changed) already holds the
    # four final ones: the epilogue is that copy_ and the as_strided_, not a second copy_ of the
    # same values.
    gm = trace(_restrided_then_written, torch.arange(6.0), remove=remove)
    assert_functional_graph(gm, remove)
    assert call_targets(gm).count("aten.copy_.default") == 1, gm.code
    assert_matches_eager(_restrided_then_written, torch.arange(6.0), remove=remove)


def test_constant_index_tensor_survives_graph_replay(remove, deterministic_fill):
    # torch.tensor's own construction (empty + raw copy) must stay out of the graph
    # (Note [Layer: torch's untraced regions]); it used to record empty's deterministic fill_
    # onto the constant, and the replay indexed with 9223372036854775807.
    def f(x):
        x.index_copy_(1, torch.tensor([3]), torch.ones(4, 1, dtype=x.dtype))
        return x.index_select(0, torch.tensor([0, 2]))

    x = torch.randn(4, 6, dtype=torch.float64)
    gm = make_fx(tfz.functionalize(f, remove=remove))(x.clone())
    assert "fill_" not in gm.code
    fresh, expected_in = x.clone(), x.clone()
    expected = f(expected_in)
    torch.testing.assert_close(gm(fresh), expected, rtol=0, atol=0)
    torch.testing.assert_close(fresh, expected_in, rtol=0, atol=0)
    assert_matches_eager(f, x, remove=remove)
