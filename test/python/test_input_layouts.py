"""Graphs of inputs whose storage is not exactly theirs: a slice of a small buffer, an expanded
input, inputs sharing a storage. A make_fx graph must be right on any input of its sizes or say
that it is not (Note [Inputs: storage coordinates under a tracer]); a captured graph checks the
storage's layout it read (Note [Capture: guards on inputs]); FX dead-code elimination keeps
every guard node. Client code traced on slices (batches of a dataset tensor, flat parameter
buffers, a KV cache) replays on other slices.
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_functional_graph, assert_trees_match,
)
from torch_functionalize import capture, functionalize


def _read(x):
    return x * 2


def _write(x):
    x.add_(1)
    return x * 1


def _write_through_a_view(x):
    x[1:3].mul_(3)
    return x.sum()


def _out_into_the_input(x):
    torch.mul(x, 2, out=x)
    return x + 1


# Each builds a fresh input of sizes (4,) and returns (input, its base or itself): the traced
# one (row 0 of a small buffer: no element past it is the input's) and others laid out otherwise.
_LAYOUTS = {
    "row 0 (traced)": lambda: _viewed(torch.arange(12.0).view(3, 4), lambda b: b[0]),
    "row 2": lambda: _viewed(torch.arange(12.0).view(3, 4) * 2, lambda b: b[2]),
    "contiguous": lambda: _viewed(torch.arange(4.0) - 7, lambda b: b),
    "slice of a large buffer": lambda: _viewed(torch.arange(4000.0), lambda b: b[7:11]),
    "column": lambda: _viewed(torch.arange(12.0).view(3, 4).t().contiguous().t(),
                              lambda b: b[:, 1].contiguous()),
    "strided": lambda: _viewed(torch.arange(12.0).view(4, 3), lambda b: b[:, 2]),
}


def _viewed(base, view):
    return view(base), base


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("program", [_read, _write, _write_through_a_view, _out_into_the_input],
                         ids=lambda p: p.__name__.strip("_"))
def test_make_fx_graph_of_a_slice_replays_on_inputs_laid_out_otherwise(remove, program):
    # Traced on b[0] of a small b, the graph read the storage whole (as_strided(b, [12], [1], 0),
    # then the input's offset): on b[2] it read row 0's values, silently.
    gm = make_fx(functionalize(program, remove=remove))(_LAYOUTS["row 0 (traced)"]()[0])
    assert_functional_graph(gm, remove)
    for name, make in _LAYOUTS.items():
        (e_in, e_base), (g_in, g_base) = make(), make()
        expected = program(e_in)
        assert_trees_match(gm(g_in), expected, f"{name}: output")
        assert torch.equal(g_base, e_base), f"{name}: the input's storage"


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_graph_of_an_expanded_input_holds_for_that_layout_and_refuses_others(remove):
    # An expanded input is read through its storage (its elements overlap): right on another
    # expanded input, and a named error on a contiguous one, where it read the first row only.
    def f(x):
        return x * 2 + x.sum(0)

    gm = make_fx(functionalize(f, remove=remove))(torch.arange(4.0).expand(3, 4))
    other = torch.tensor([1.0, -2.0, 3.0, 5.0]).expand(3, 4)
    assert_trees_match(gm(other), f(other), "another expanded input")
    with pytest.raises(RuntimeError, match=r"make_fx graph depends on the layout of input 0.*"
                                           r"traced with strides \[0, 1\]"):
        gm(torch.randn(3, 4))


def _transpose_in_place(x):
    x.t_()
    return x + 1


def _resize_in_place(x):
    x.resize_((x.numel(),))
    return x * 1


def _read_through_as_strided(x):
    return x.as_strided((2,), (1,), 1) * 2


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("program", [_transpose_in_place, _resize_in_place,
                                     _read_through_as_strided],
                         ids=lambda p: p.__name__.strip("_"))
def test_make_fx_graph_using_storage_coordinates_holds_for_that_layout_and_refuses_others(
        remove, program):
    # Traced on a contiguous x, the graph set x's geometry with as_strided_(.., offset 0) (or read
    # as_strided(.., 1) of its storage): replayed on an x at offset 3 it moved x to offset 0, or
    # read other elements, silently. The first use of storage coordinates now guards the layout.
    gm = make_fx(functionalize(program, remove=remove))(torch.arange(6.0).view(2, 3))
    e_in, g_in = torch.arange(6.0).view(2, 3) * 2, torch.arange(6.0).view(2, 3) * 2
    assert_trees_match(gm(g_in), program(e_in), "the traced layout: output")
    assert (g_in.shape, g_in.stride(), g_in.storage_offset()) == (
        e_in.shape, e_in.stride(), e_in.storage_offset())
    assert torch.equal(g_in, e_in)
    with pytest.raises(RuntimeError, match=r"depends on the layout of input 0.*"
                                           r"storage offset 0.*storage offset 3"):
        gm(torch.arange(20.0).as_strided((2, 3), (3, 1), 3))


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_graph_of_a_contiguous_input_replays_on_views(remove):
    # A program that reads no storage coordinate: no guard, right on every layout.
    gm = make_fx(functionalize(_write_through_a_view, remove=remove))(torch.arange(4.0))
    assert not any("_guard_layout" in str(n.target) for n in gm.graph.nodes), gm.code
    for name, make in _LAYOUTS.items():
        (e_in, e_base), (g_in, g_base) = make(), make()
        assert_trees_match(gm(g_in), _write_through_a_view(e_in), f"{name}: output")
        assert torch.equal(g_base, e_base), f"{name}: the input's storage"


def _random_fill(x):
    torch.manual_seed(0)
    x.normal_()
    return x * 1


def _write_through_unfold(x):
    x.unfold(0, 2, 2).mul_(2)
    return x + 1


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("program, traced, other", [
    # normal_ draws in x's memory order: traced on a transposed x, a contiguous one gets other
    # numbers in eager.
    (_random_fill, lambda: torch.zeros(4, 3).t(), lambda: torch.zeros(3, 4)),
    # unfold's inverse scatters at the input's storage offset (2 here).
    (_write_through_unfold, lambda: torch.arange(8.0)[2:6], lambda: torch.arange(4.0)),
], ids=["random fill", "write through unfold"])
def test_make_fx_graph_whose_values_follow_an_input_layout_refuses_other_layouts(
        remove, program, traced, other):
    gm = make_fx(functionalize(program, remove=remove))(traced())
    e_in, g_in = traced(), traced()
    expected = program(e_in)
    torch.manual_seed(0)  # a seed set inside f is not in the graph: the replay starts from it
    assert_trees_match(gm(g_in), expected, "the traced layout: output")
    assert torch.equal(g_in, e_in)
    with pytest.raises(RuntimeError, match="depends on the layout of (input 0|the tensor aten::normal_ fills)"):
        gm(other())


def _write_first_read_second(a, b):
    a.add_(1)
    return b * 2


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_graph_of_aliased_inputs_refuses_distinct_ones_after_dead_code_elimination(remove):
    base = torch.arange(6.0)
    gm = make_fx(functionalize(_write_first_read_second, remove=remove))(base, base[2:])
    gm.graph.eliminate_dead_code()
    gm.recompile()
    e_base, g_base = torch.arange(6.0) * 3, torch.arange(6.0) * 3
    assert_trees_match(gm(g_base, g_base[2:]), _write_first_read_second(e_base, e_base[2:]),
                       "aliased inputs")
    assert torch.equal(g_base, e_base)
    with pytest.raises(RuntimeError, match="depends on the layout of input 1.*not shared with it"):
        gm(torch.arange(6.0), torch.arange(4.0))


def test_capture_checks_the_size_of_a_storage_it_reads_whole():
    # x = b[:6] of a 37-element b is read through b's storage: a replay on a tensor whose storage
    # is smaller failed inside as_strided ("setStorage: ... out of bounds").
    def f(x):
        x.add_(1)
        return x * 2

    gm = capture(f, torch.randn(37)[:6])
    e_base = torch.randn(37)
    g_base = e_base.clone()
    assert_trees_match(gm(g_base[:6]), f(e_base[:6]), "a storage of the same size")
    assert torch.equal(g_base, e_base)
    with pytest.raises(RuntimeError, match="captured for x_1 with a storage of 148 bytes and is "
                                           "called with 24 bytes"):
        gm(torch.randn(6))


def test_dead_code_elimination_keeps_the_guards_of_values_read():
    # A guard has no users; FX's dead-code elimination dropped it, and the graph then returned
    # the branch it captured for inputs that take the other.
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x * 3

    gm = capture(f, torch.ones(3))
    gm.graph.eliminate_dead_code()
    gm.recompile()
    with pytest.raises(RuntimeError, match="specialized on it"):
        gm(-torch.ones(3))


# Client code traced on views, as a data loader or a cache hands them over: a training step on
# one batch slice of a dataset tensor, a step over parameters that are views of one flat buffer
# (FSDP-style), the same buffer as a slice of a larger one, and a KV-cache decode step writing
# a slice of the cache. Each make_fx graph is replayed on other slices, against eager.
_MLP = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
_DATA, _LABELS = torch.randn(32, 4), torch.randint(0, 2, (32,))


def _mlp_step(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9)
    loss = torch.nn.functional.cross_entropy(torch.func.functional_call(_MLP, p, (x,)), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _flat_parameter_step(flat, x, y):
    w1, b1 = flat[:32].view(8, 4), flat[32:40]
    w2, b2 = flat[40:56].view(2, 8), flat[56:58]
    loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1.t() + b1) @ w2.t() + b2, y)
    (g,) = torch.autograd.grad(loss, flat)
    with torch.no_grad():
        flat.sub_(0.1 * g)
    return loss.detach()


def _decode_step(cache, k, pos):
    cache[:, pos] = k
    return cache[:, :pos + 1].sum(1)


def _mlp_leaves():
    return {k: v.detach().clone().requires_grad_() for k, v in _MLP.named_parameters()}


_CLIENT_SLICES = {
    "batch slices": (_mlp_step, lambda i: (_mlp_leaves(), _DATA[8 * i:8 * i + 8],
                                           _LABELS[8 * i:8 * i + 8])),
    "flat parameters": (_flat_parameter_step,
                        lambda i: (torch.randn(58).requires_grad_(), _DATA[8 * i:8 * i + 8],
                                   _LABELS[8 * i:8 * i + 8])),
    "flat parameters in a larger buffer": (
        _flat_parameter_step,
        lambda i: (torch.randn(100)[10 * i:10 * i + 58].clone().requires_grad_(),
                   _DATA[8 * i:8 * i + 8], _LABELS[8 * i:8 * i + 8])),
    "cache slice": (_decode_step, lambda i: (torch.zeros(2, 16, 3)[:, 4 * i:4 * i + 8],
                                             torch.randn(2, 3), 3)),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(_CLIENT_SLICES))
def test_make_fx_graph_of_client_code_traced_on_slices_replays_on_other_slices(name, remove):
    f, make = _CLIENT_SLICES[name]

    def fresh(i):
        torch.manual_seed(i)
        return make(i)

    gm = make_fx(functionalize(f, remove=remove))(*fresh(0))
    for i in (1, 2):
        e_in, g_in = fresh(i), fresh(i)
        assert_trees_match(gm(*g_in), f(*e_in), f"slice {i}: output")
        tensors = lambda args: [a.detach() for a in args if isinstance(a, torch.Tensor)]  # noqa
        assert_trees_match(tensors(g_in), tensors(e_in), f"slice {i}: inputs")


# Programs that reach the gaps of a strided slice x = b[1:, ::2] through resize_ within its
# storage, around writes (Note [Inputs: storage coordinates of a written own base]): under make_fx
# (and for a slice of a large buffer, eagerly) the slice keeps its own base, which once written
# held x's elements alone, and the graphs read or wrote other elements than eager, silently.
def _write_then_resize_into_the_gaps(x):
    x.add_(1)
    x.resize_((6,))
    return x * 1


def _resize_into_the_gaps_then_write_through_an_older_view(x):
    v = x[0]
    x.resize_((6,))
    x.mul_(2)
    v.add_(1)
    return x * 1, v * 1


def _resize_a_view_into_the_gaps_write_it_then_the_input(x):
    v = x.unfold(-1, 2, 2)
    v.resize_((6,))
    v.sub_(3)
    x.mul_(2)
    return x * 1, v * 1


_GAP_PROGRAMS = [_write_then_resize_into_the_gaps,
                 _resize_into_the_gaps_then_write_through_an_older_view,
                 _resize_a_view_into_the_gaps_write_it_then_the_input]


def _gap_refusal(program, remove, path, rows):
    """The named error a path gives, or None where it must match eager. Without views a written
    own base holds the input's elements alone (make_fx; a slice of a large buffer on every path),
    and a graph has no view to write a storage's gaps back through."""
    if remove == "mutations":
        return None
    if program is _write_then_resize_into_the_gaps and (path == "make_fx" or rows > 3):
        return "resizing .* after writing it, to elements of that storage outside the input's"
    if program is _resize_a_view_into_the_gaps_write_it_then_the_input and path != "eager":
        return "a graph without views .* cannot write those elements back"
    return None


def _strided_slice(rows, seed):
    torch.manual_seed(seed)
    base = torch.randn(rows, 2, 4)
    return base[1:3, ::2], base


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("program", _GAP_PROGRAMS, ids=lambda p: p.__name__.strip("_"))
def test_make_fx_graph_of_a_strided_slice_resized_into_its_gaps_matches_eager(remove, program):
    traced, _ = _strided_slice(3, 0)
    refusal = _gap_refusal(program, remove, "make_fx", 3)
    if refusal:
        with pytest.raises(NotImplementedError, match="functionalize: .*" + refusal):
            make_fx(functionalize(program, remove=remove))(traced)
        return
    gm = make_fx(functionalize(program, remove=remove))(traced)
    assert_functional_graph(gm, remove)
    # Replayed on other values of the traced layout: eager's outputs and the whole buffer.
    (e_in, e_base), (g_in, g_base) = _strided_slice(3, 1), _strided_slice(3, 1)
    assert_trees_match(gm(g_in), program(e_in), "output")
    assert torch.equal(g_base, e_base), "the input's storage (its gaps included)"
    with pytest.raises(RuntimeError, match="depends on the layout of input 0"):
        gm(_strided_slice(4, 1)[0])  # same sizes, strides and offset; a larger storage


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("program", _GAP_PROGRAMS, ids=lambda p: p.__name__.strip("_"))
@pytest.mark.parametrize("rows", [3, 3000], ids=["small buffer", "large buffer"])
def test_strided_slice_resized_into_its_gaps_matches_eager_untraced_and_captured(
        remove, program, rows):
    # Untraced, a slice of a small buffer has the flat base; of a large one, its own base.
    for path, run in [("eager", lambda x: functionalize(program, remove=remove)(x)),
                      ("capture", lambda x: capture(program, _strided_slice(rows, 0)[0],
                                                    remove=remove)(x))]:
        (e_in, e_base), (g_in, g_base) = _strided_slice(rows, 1), _strided_slice(rows, 1)
        refusal = _gap_refusal(program, remove, path, rows)
        if refusal:
            with pytest.raises(NotImplementedError, match="functionalize: .*" + refusal):
                run(g_in)
            continue
        assert_trees_match(run(g_in), program(e_in), f"{path}: output")
        assert torch.equal(g_base, e_base), f"{path}: the input's storage (its gaps included)"


def _write_through_a_row_of_an_expanded_view(x):
    v = x.expand(3, *x.shape)
    v.select(0, 0)[1] = 0.0
    return x * 1, v.sum(0)


@pytest.mark.parametrize("make", [
    lambda seed: _seeded(seed, lambda: torch.randn(3, 4), lambda b: b[1:]),
    lambda seed: _seeded(seed, lambda: torch.randn(2, 4, 3, dtype=torch.complex64),
                         lambda b: b.real),
], ids=["rows at an offset", "real part"])
def test_make_fx_graph_writing_through_an_expanded_view_of_a_slice_matches_eager(make):
    # Note [Alias: writes through an overlapping view]: the write is one scatter at the written
    # view's offset in the base's storage. The base an input that does not span its storage keeps
    # under make_fx starts at an offset, or has gaps: the scatter wrote 4 elements early, or the
    # step-by-step inverse summed expand's 3 copies, silently.
    gm = make_fx(functionalize(_write_through_a_row_of_an_expanded_view))(make(0)[0])
    (e_in, e_base), (g_in, g_base) = make(1), make(1)
    assert_trees_match(gm(g_in), _write_through_a_row_of_an_expanded_view(e_in), "output")
    assert torch.equal(g_base, e_base), "the input's storage"
    (e_in, e_base), (g_in, g_base) = make(2), make(2)
    assert_trees_match(functionalize(_write_through_a_row_of_an_expanded_view)(g_in),
                       _write_through_a_row_of_an_expanded_view(e_in), "untraced: output")
    assert torch.equal(g_base, e_base), "untraced: the input's storage"


def _seeded(seed, make_base, view):
    torch.manual_seed(seed)
    base = make_base()
    return view(base), base


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_graph_of_an_input_whose_elements_overlap_writes_them_as_one(remove):
    # x = b.as_strided((2, 2), (1, 1)) does not span b: it kept its own base under make_fx, a copy
    # in which x[0, 1] and x[1, 0] (one element of b) took separate values: written through one,
    # the other kept the old value in the graph's outputs (fuzzer program 761000, without views).
    # Such an input takes the flat base, its layout guarded, as an expanded input does.
    def f(x):
        v = x.transpose(0, 1)
        v[:, 1:] += 2.0
        return v * 1

    def make():
        base = torch.arange(5.0)
        return base.as_strided((2, 2), (1, 1), 0), base

    gm = make_fx(functionalize(f, remove=remove))(make()[0])
    (e_in, e_base), (g_in, g_base) = make(), make()
    assert_trees_match(gm(g_in), f(e_in), "outputs")
    assert torch.equal(g_base, e_base), "the input's storage"
