"""Ops that change a tensor's storage: resize_ (Note [Kernel: resize_]) and storage coordinates
after writes, compared with eager or checked for their error. set_: test_set_ops.py.
"""

import itertools

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import capture, functionalize


def test_resize_shrink_input(remove):
    # Shrinking an input keeps its leading elements; the epilogue resizes the caller's tensor.
    def f(x):
        x.resize_(2, 3)
        x.mul_(2)
        return x + 1

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


def test_resize_grow_input_then_fill_new_elements(remove):
    # Growing an input keeps the old elements; the new ones are written before being read.
    def f(x):
        x.resize_(4, 4)
        x[2:].fill_(3.0)
        return x * 1

    assert_matches_eager(f, torch.randn(2, 4), remove=remove)


def test_resize_grow_input_then_views_and_mutations(remove):
    # After growing, views of the input (row, column) are written and read like eager.
    def f(x):
        x.resize_(3, 3)
        x[2] = torch.tensor([7.0, 8.0, 9.0])
        x[:, 1].mul_(10)
        return x.sum(0)

    assert_matches_eager(f, torch.randn(6), remove=remove)


def test_resize_input_after_mutation_then_view_write(remove):
    # An input mutated, then shrunk, then written through a flat view.
    def f(x):
        x.mul_(3)
        x.resize_(2, 2)
        x.view(-1)[1:3] = 0
        return x.t() + 0

    assert_matches_eager(f, torch.randn(3, 3), remove=remove)


def test_resize_non_contiguous_input(remove):
    # A column-major (non-view) input: shrinking resets eager's contiguous strides; resizing to
    # the same shape keeps the original strides.
    def shrink(x):
        x.resize_(2, 2)
        return x + 0

    def same(x):
        x.resize_(4, 3)
        return x + 0

    col_major = torch.empty_strided((4, 3), (1, 4)).copy_(torch.randn(4, 3))
    assert_matches_eager(shrink, col_major, remove=remove)
    assert_matches_eager(same, col_major, remove=remove)


def test_resize_intermediates_shrink_and_grow(remove):
    # resize_ on clones of the input: shrink to 5 elements, grow to 3x3 with the tail overwritten.
    def f(x):
        shrunk = x.clone()
        shrunk.resize_(5)
        grown = x.clone()
        grown.resize_(3, 3)
        grown[2:].zero_()
        return shrunk, grown

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_resize_to_zero_elements_and_resize_as(remove):
    # resize_(0) empties an input; resize_as_ reshapes another to a tensor's shape.
    def f(x, y, like):
        x.resize_(0)
        y.resize_as_(like)
        y.copy_(like)
        return x, y

    assert_matches_eager(f, torch.randn(3), torch.randn(3), torch.randn(2, 2), remove=remove)


def test_resize_int_input_grow(remove):
    # Growing an int64 input; the new row is written.
    def f(x):
        x.resize_(2, 5)
        x[1] = torch.arange(5)
        return x

    assert_matches_eager(f, torch.arange(5), remove=remove)


# Fresh values for every test that reads uninitialized-looking memory: a buffer freed by an earlier
# test with the same values could otherwise be handed out again and hide a wrong result.
_SPARE_STORAGE_SEEDS = itertools.count(1000)


def _inputs_with_spare_storage():
    """make_inputs for a 16-element tensor (not a view) whose storage holds 32 elements.

    Eager's resize_ reuses spare storage when growing, so the values past numel are
    deterministic: each call returns a new tensor with the same storage contents.
    """
    values = torch.randn(32, generator=torch.Generator(torch.get_default_device()).manual_seed(next(_SPARE_STORAGE_SEEDS)))

    def make_inputs():
        spare = values.clone()
        spare.resize_(16)
        return (spare,)

    return make_inputs


RESIZE_STORAGE_CASES = [
    ("grow_into_spare_storage", lambda x: x.resize_(32)),
    ("shrink_then_grow", lambda x: x.resize_(4).resize_(32)),
]


@pytest.mark.parametrize("name, op", RESIZE_STORAGE_CASES, ids=[c[0] for c in RESIZE_STORAGE_CASES])
def test_resize_grow_within_storage_keeps_storage_elements(name, op, remove):
    # Eager's resize_ never shrinks or reallocates a storage that is big enough, so growing shows
    # the elements already in the storage.
    def f(x):
        op(x)
        return x + 0

    assert_matches_eager(f, make_inputs=_inputs_with_spare_storage(), remove=remove)


# (id, program, expected message fragment). Each raises NotImplementedError naming aten::resize_.
RESIZE_ERROR_CASES = [
    (
        "input_grown_past_storage_with_live_view",
        lambda x: (x.view(-1), x.resize_(5, 5)),
        "views of it are alive",
    ),
    (
        "intermediate_with_live_view",
        lambda x: (lambda t: (t[0], t.resize_(20)))(x.clone()),
        "views of it are alive",
    ),
]


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x[0].resize_(10),
        lambda x: x[0].resize_(2),
        lambda x: x.view(-1).resize_(12),
        lambda x: x.clone().t().resize_(9),
    ],
    ids=["grow_view_within_storage", "shrink_view", "same_size_flat_view", "view_of_intermediate"],
)
def test_resize_of_view_within_storage_matches_eager(op, remove):
    # A view resized within its storage is a view of the storage, as in eager.
    def f(x):
        y = op(x)
        y.add_(1)
        return x + 0, y + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


def test_resize_within_storage_with_live_view_matches_eager(remove):
    # Shrinking while a view is alive only changes metadata (see Note [Kernel: resize_]): the view
    # keeps its elements, and later writes through either are seen as in eager.
    def f(x):
        flat = x.view(-1)
        x.resize_(2, 2)
        x.add_(1)
        return flat + 0, x + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


@pytest.mark.parametrize(
    "name, op, message", RESIZE_ERROR_CASES, ids=[c[0] for c in RESIZE_ERROR_CASES]
)
def test_resize_unsupported_raises_not_implemented_naming_op(name, op, message, remove):
    # Unsupported resize_ raises a clear NotImplementedError naming aten::resize_; an earlier
    # mutation of the inputs is not written back.
    def f(x, y):
        y.mul_(2)
        x.add_(1)
        return op(x)

    x, y = torch.randn(3, 4), torch.randn(3)
    x_before, y_before = x.clone(), y.clone()
    with pytest.raises(NotImplementedError, match=rf"aten::resize_: .*{message}"):
        functionalize(f, remove=remove)(x, y)
    assert torch.equal(x, x_before) and x.shape == (3, 4)
    assert torch.equal(y, y_before)


def _slice_input():
    return (torch.arange(6.0)[1:],)


def _transposed_input():
    return (torch.arange(6.0).view(2, 3).t(),)


def _write_then_as_strided(x):
    x.add_(1)
    return x.as_strided((2,), (1,), 1) * 2


def _write_then_shrink(x):
    x.add_(1)
    x.resize_(2)
    return x


def _shrink_write_grow(x):
    x.resize_(2)
    x.add_(1)
    x.resize_(4)
    return x + 0


def _write_through_view_after_shrink(x):
    v = x[2:]
    x.resize_(2)
    v.mul_(2)
    return v + 0


def _write_then_grow_past_storage(x):
    x.add_(1)
    x.resize_(7)
    x[5:].fill_(0)
    return x + 0


@pytest.mark.parametrize("program", [
    _write_then_as_strided, _write_then_shrink, _shrink_write_grow,
    _write_through_view_after_shrink, _write_then_grow_past_storage,
], ids=lambda p: p.__name__.strip("_"))
@pytest.mark.parametrize("make", [_slice_input, _transposed_input], ids=["slice", "transposed"])
def test_storage_coordinates_after_writes(remove, program, make):
    # as_strided and resize_ read storage coordinates, and the epilogue must write the elements an
    # input covered on entry before its metadata changes. Each gave wrong values.
    # See Note [Inputs: inputs that do not start their storage].
    # See Note [Inputs: writes before a metadata change].
    # A slice does not span its storage, so make_fx gives it its own base: as_strided on it is
    # refused by name (capture, which guards the layout, keeps the storage's base); its growth
    # counts from its first element, which its final elements cover whole here. See
    # Note [Inputs: storage coordinates under a tracer].
    refusal = None
    if make is _slice_input and program is _write_then_as_strided:
        refusal = "does not span its storage"
    assert_matches_eager(program, make_inputs=make, remove=remove, make_fx_refusal=refusal)


def test_resize_to_no_element_of_an_input_whose_offset_is_past_its_storage(remove):
    # b[1:] of a (3, 0) tensor has storage offset 1 in an empty storage; resize_((0,)) must not take
    # the growth path (a capacity of -1: "Storage size calculation overflowed").
    def f(x):
        x.resize_((0,))
        return x

    assert_matches_eager(f, make_inputs=lambda: (torch.zeros(3, 0, dtype=torch.int64)[1:, ::2],),
                         remove=remove)


@pytest.mark.parametrize("size", [(1, 3), (3,)], ids=["other shape", "its own shape"])
def test_resize_of_an_expanded_input_grows_its_storage(remove, size, deterministic_fill):
    # x = b.expand(3) has one element of storage; x.resize_((1, 3)) grows it to three in eager, and
    # so does the epilogue, although x's sizes are (3,) already (a resize_((3,)) of x would be a
    # no-op, and the as_strided_ after it would fail inside torch: "setStorage: ... out of bounds").
    # See Note [Inputs: metadata epilogue].
    def f(x):
        x.resize_(size)
        return x * 1

    assert_matches_eager(f, make_inputs=lambda: (torch.tensor([1.5]).expand(3),), remove=remove)


def _storage_values(t):
    return torch.tensor([], dtype=t.dtype).set_(t.untyped_storage()).clone()


def test_writes_to_a_grown_storage_survive_a_later_shrink(remove):
    # ones(out=x) grows x's storage to 12 elements and writes them all; x.resize_((2,)) then covers
    # 2, and the epilogue writes the whole grown storage, not only those 2
    # (Note [Inputs: writes to a grown storage]).
    def f(x):
        torch.ones((4, 3), out=x)
        x.resize_((2,))
        return x * 1

    x_e, x_o = torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64)
    expected = f(x_e)
    got = functionalize(f, remove=remove)(x_o)
    torch.testing.assert_close(got, expected)
    assert x_o.shape == x_e.shape and x_o.stride() == x_e.stride()
    torch.testing.assert_close(_storage_values(x_o), _storage_values(x_e))
    if remove == "mutations_and_views":
        with pytest.raises(NotImplementedError, match="cannot write the others back"):
            capture(f, torch.zeros(2, 3, dtype=torch.float64), remove=remove)
    else:
        gm = capture(f, torch.zeros(2, 3, dtype=torch.float64), remove=remove)
        x_g = torch.zeros(2, 3, dtype=torch.float64)
        torch.testing.assert_close(gm(x_g), expected)
        torch.testing.assert_close(_storage_values(x_g), _storage_values(x_e))


def test_write_between_two_resizes_of_a_strided_input_reaches_its_storage(remove):
    # x = b[1:, ::2] resized to (4,) covers elements 4..7 of b's storage, index_fill_ writes 4, 5
    # and 7, and x.resize_((2, 1)) then covers 4 and 5: element 7 is in neither x's entry nor its
    # final elements, and its write reaches b all the same
    # (Note [Inputs: writes outside every input's elements]).
    def f(x):
        x.resize_((4,))
        x.index_fill_(0, torch.tensor([0, 1, 1, 3]), -1.5)
        x.resize_((2, 1))
        return x * 1

    def make():
        return torch.arange(12.0).view(3, 4)

    b_e, b_o = make(), make()
    expected = f(b_e[1:, ::2])
    got = functionalize(f, remove=remove)(b_o[1:, ::2])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(b_o, b_e)


def test_write_through_a_view_of_a_grown_input_after_its_as_strided_(remove, deterministic_fill):
    # x = b[::2] of 6 elements; x.resize_((4, 2)) grows the storage to 8, v = x[2:] views elements
    # 4..7, x.as_strided_((2, 2), (2, 3), 2) leaves x covering 2, 4, 5, 7, and a write through v
    # reaches element 6 too. A graph with views writes the grown storage whole after its metadata
    # ops (before them the storage is still the caller's 6 elements, and element 6 would keep the
    # new memory's fill, NaN under deterministic_fill). Without views the graph refuses by name: v's
    # step no longer counts as x's once as_strided_ replaced it without covering it.
    def f(x):
        x.resize_((4, 2))
        v = x.tensor_split([2], -2)[1]
        x.as_strided_((2, 2), (2, 3), 2)
        v.fill_(5.0)
        return v + 0

    def make_inputs():
        return (torch.arange(6.0)[::2],)

    if remove == "mutations_and_views":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=False)
        with pytest.raises(NotImplementedError, match="cannot write those elements back"):
            capture(f, *make_inputs(), remove=remove)
    else:
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
        eager, graph = make_inputs()[0], make_inputs()[0]
        f(eager)
        capture(f, *make_inputs())(graph)
        whole = torch.tensor([]).set_(graph.untyped_storage())
        assert whole[4:].tolist() == [5.0] * 4
        torch.testing.assert_close(whole, torch.tensor([]).set_(eager.untyped_storage()),
                                   rtol=0, atol=0, equal_nan=True)


def test_set_of_a_resized_input_onto_its_own_view_is_refused_by_name(remove):
    # Fuzzer program 550254: the input grew past its storage (a new storage, no longer the
    # caller's), then set_ onto a view of it; the epilogue then failed with torch's shape error.
    def f(x):
        x.resize_((4, 2))
        v = x.unsafe_chunk(3, 1)[0]
        x.set_(v)
        return v

    x = torch.rand(4, 1, 1) > 0.5
    before = x.clone()
    with pytest.raises(NotImplementedError, match=r"aten::set_.source_Tensor: set_ swaps"):
        functionalize(f, remove=remove)(x)
    assert torch.equal(x, before) and x.shape == (4, 1, 1)
