"""Views whose inverse is not a plain scatter: gapped unfold keeps its gaps, writes into tensors
with internal overlap are refused (Note [Kernel: internal overlap]), and inputs that are already
strided views keep their layout."""
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import assert_matches_eager


def _base(*shape):
    # Deterministic values: make_inputs runs once for eager and once for functionalize.
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).view(shape) / 7


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [((7,), 0, 2, 3), ((3, 8), 1, 1, 3), ((5, 2), 0, 2, 2), ((9,), 0, 3, 4)],
    ids=["1d_gapped", "2d_gapped", "tiling", "1d_gapped_tail"],
)
def test_write_through_unfold_leaves_gaps_like_eager(shape, dim, size, step, remove):
    # Elements between windows (size < step) and after the last window keep their values.
    def f(x):
        x.unfold(dim, size, step).mul_(10).add_(1)
        return x

    assert_matches_eager(f, torch.randn(shape), remove=remove)


@pytest.mark.parametrize(
    "make_view",
    [
        lambda x: x[:1].expand(3, 3),
        lambda x: x.view(-1).unfold(0, 3, 1),
        lambda x: x.view(-1).as_strided((3, 3), (1, 1)),
    ],
    ids=["expand", "overlapping_unfold", "overlapping_as_strided"],
)
def test_write_into_tensor_with_internal_overlap_raises(make_view, remove):
    # Which aliased write wins is undefined: a clear error naming the op, inputs untouched.
    def f(x):
        make_view(x.clone()).add_(1)
        return x

    x = torch.randn(3, 3)
    before = x.clone()
    with pytest.raises(RuntimeError, match=r"aten::add_\.Tensor: .*internal overlap"):
        tfz.functionalize(f, remove=remove)(x)
    assert torch.equal(x, before)


def test_expanded_input_can_be_read(remove):
    # A stride-0 input is fine to read; its layout is untouched.
    assert_matches_eager(
        lambda x: x * 2 + x.sum(), make_inputs=lambda: (_base(1, 3).expand(4, 3),), remove=remove
    )


@pytest.mark.parametrize(
    "make_input",
    [
        lambda: _base(3, 4).t(),
        lambda: _base(10)[3:],
        lambda: _base(4, 6)[:, ::2],
    ],
    ids=["transposed", "offset", "strided_slice"],
)
def test_strided_view_inputs_keep_layout_and_receive_values(make_input, remove):
    # The caller's view keeps sizes/strides/offset and receives the new values (checked on the
    # input and on its base by assert_matches_eager).
    def f(x):
        x.mul_(2)
        x[0].add_(1)
        return x.sum()

    assert_matches_eager(f, make_inputs=lambda: (make_input(),), remove=remove)


def test_write_of_no_element_through_an_expanded_input(remove):
    # A write of no element through x.expand(3) leaves x as it was (expand's inverse would sum the
    # empty written view over the expanded dimension and triple x;
    # Note [Kernel: writes of no element]).
    def f(x):
        v = x.expand(3).narrow(0, 1, 0)
        v.cumsum_(0)
        return x * 1

    assert_matches_eager(f, torch.tensor(-0.5), remove=remove)


def _write_one_element_of_an_expanded_scalar(x):
    v = x.expand(3)
    v[2] = 3
    return v * 1


def _write_through_unbind_of_an_overlapping_as_strided(x):
    v = x.as_strided((2, 1), (0, 3), 4)
    v.unbind(0)[1].sub_(1)
    return v * 1


@pytest.mark.parametrize(
    "f, make",
    [
        (_write_one_element_of_an_expanded_scalar, lambda: (torch.tensor(0.5),)),
        (_write_through_unbind_of_an_overlapping_as_strided, lambda: (torch.arange(8.0),)),
    ],
    ids=["expand", "as_strided"],
)
def test_write_through_a_view_whose_base_overlaps(remove, f, make):
    # A write through a view whose base has overlapping elements: expand's inverse must not sum the
    # copies (x = 3 + 2x), and the overlapping as_strided geometry is scattered, not refused.
    # Without views the written view's geometry comes from a meta replay of the chain; the expand
    # case is still refused by name there (check_writable). See
    # Note [Alias: writes through an overlapping view].
    if remove == "mutations_and_views" and f is _write_one_element_of_an_expanded_scalar:
        with pytest.raises(NotImplementedError, match="a view of an expanded tensor"):
            tfz.functionalize(f, remove=remove)(*make())
    else:
        assert_matches_eager(f, make_inputs=make, remove=remove)


def eager_right_graph_without_views_refused(f, make_inputs, remove, match):
    """Eager's results in both modes and in graphs with views; a graph without views (make_fx or
    capture) refuses by name what it cannot write back."""
    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
        return
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=False)
    with pytest.raises(NotImplementedError, match=match):
        tfz.capture(f, *make_inputs(), remove=remove)
    with pytest.raises(NotImplementedError, match=match):
        make_fx(tfz.functionalize(f, remove=remove))(*make_inputs())

def test_out_into_the_diagonal_of_an_expanded_input(remove):
    # A write through diagonal(expanded input) passes an overlapping view; without views the inverse
    # must not scatter into it (torch's internal-overlap error)
    # (Note [Alias: writes through an overlapping view]).
    def f(x):
        v0 = x.diagonal(1, 1, 0)
        v1, v2 = v0.split(1, 0)
        torch.add(v2, 0.5, out=v0[1:])
        return v0, v1, v2

    def make_inputs():
        return (torch.arange(3.0).view(3, 1).expand(3, 3),)

    # A graph without views has no op to write the expanded input's storage with; eagerly it is
    # written through the whole storage.
    eager_right_graph_without_views_refused(f, make_inputs, remove, "whose elements share memory")


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float16])
def test_write_through_an_expand_keeps_the_dtype(remove, dtype):
    # expand's inverse sums the broadcast dimensions back, and torch.sum promotes integers and bools
    # to int64: the written tensor must keep its dtype.
    def f(x):
        v = x.expand((1, 2))
        v.fill_(1)
        return v, x

    assert_matches_eager(f, make_inputs=lambda: (torch.zeros(2, dtype=dtype),), remove=remove)


def test_write_through_a_row_of_a_self_overlapping_input(remove):
    # x = b.as_strided((7, 2), (1, 1)) (rows share elements); x[1] = 0.5 writes storage elements 1
    # and 2. torch cannot prove x disjoint ("too hard"), which must not be read as disjoint: a
    # step-by-step inverse would write element 2 twice, the stale copy last
    # (Note [Alias: writes through an overlapping view]).
    def f(x):
        x[1] = 0.5
        return x * 1

    assert_matches_eager(
        f, make_inputs=lambda: (torch.arange(15.0).view(3, 5).as_strided((7, 2), (1, 1), 0),),
        remove=remove, check_input_strides=True)


def test_write_through_a_dtype_view_of_an_expanded_input(remove):
    # A write through unfold and view(complex64) of b.expand(3): the written view's geometry is
    # scattered into the storage seen as complex64, with neither torch's overlap error nor a refusal
    # (Note [Alias: writes through an overlapping view]).
    def f(x):
        v = x.unfold(0, 1, 3).view(torch.complex64).unsafe_split(1, 1)[0]
        v.cumsum_(-2)
        return v

    assert_matches_eager(
        f, make_inputs=lambda: (torch.tensor([1.5], dtype=torch.float64).expand((3,)),),
        remove=remove, check_graph=remove == "mutations")


def test_write_through_an_expand_of_an_input_aliased_by_another_dtype(remove):
    # x and x.view(torch.int32) share a byte base; v[2] = 0 through x.expand(3, 2).select(1, 1)
    # writes x[0, 1] (three times over in eager); the byte base must not take expand's inverse,
    # which sums the copies and triples x (Note [Alias: writes through an overlapping view]).
    def f(x0, x1):
        v = x0.expand((3, 2)).select(1, 1)
        v[2] = 0.0
        return x0 * 1, x1 * 1

    def make_inputs():
        b = torch.tensor([[1.5, 2.5]])
        return b, b.view(torch.int32)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
    else:
        with pytest.raises(NotImplementedError, match="a view of an expanded tensor"):
            tfz.functionalize(f, remove=remove)(*make_inputs())


def test_write_through_an_expand_of_as_strided_of_a_transposed_input(remove):
    # x = b.transpose(0, 2) is its own base (dense, not contiguous); x.as_strided_((2,), (2,),
    # 6).expand(2, 2)[0] = -0.25 is not inverted step by step (expand's inverse would sum the
    # copies): a dense base in any dimension order takes the one as_strided_scatter at the written
    # view's geometry, as a contiguous one does (Note [Alias: writes through an overlapping view]);
    # without views such a write is refused by name, as for a contiguous input.
    def f(x):
        x.as_strided_((2,), (2,), 6)
        v = x.expand((2, 2))
        v[0] = -0.25
        return v * 1

    def make_inputs():
        return (torch.arange(9.0).view(1, 3, 3).transpose(0, 2),)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
        b_e, b_f = make_inputs()[0], make_inputs()[0]
        f(b_e)
        tfz.functionalize(f)(b_f)
        assert torch.equal(b_f.as_strided((9,), (1,), 0), b_e.as_strided((9,), (1,), 0))
    else:
        with pytest.raises(NotImplementedError, match="a view of an expanded tensor"):
            tfz.functionalize(f, remove=remove)(*make_inputs())


def test_write_through_a_dtype_view_of_an_expanded_scalar(remove):
    # With views kept, x.expand((3,)).view(torch.int32)[0] = 1 of a 0-d x writes x's bits, as in
    # eager: the overlap scatter reinterprets the dtype of a 0-d base as its 1-D view (the
    # step-by-step inverses would lose the write)
    # (Note [Alias: writes through an overlapping view]). Without views it is refused by name.
    def f(x0):
        v2 = x0.expand((3,)).movedim(0, -1).view(torch.int32)
        v2[0] = 1
        return x0 + 0

    if remove == "mutations":
        assert_matches_eager(f, torch.tensor(0.5), remove=remove)
    else:
        with pytest.raises(NotImplementedError, match="a view of an expanded tensor"):
            tfz.functionalize(f, remove=remove)(torch.tensor(0.5))


def test_expanded_input_written_through_an_old_view_after_as_strided_(remove):
    # A view of an expanded input taken before x.as_strided_ shrank it, then written: the write
    # reaches storage elements x no longer covers. Eagerly and with views the whole storage is
    # written back; a graph without views lost them (bytes 2..5 unwritten, silently: fuzzer
    # program 532164), and now refuses by name.
    def f(x):
        v = x.unsafe_split(1, 2)[0]
        x.as_strided_((2,), (1,), 0)
        v.mul_(2).add_(1)
        return v

    def make_inputs():
        return (torch.arange(6.0).view(2, 3, 1).expand(2, 3, 3),)

    eager_right_graph_without_views_refused(f, make_inputs, remove,
                                            "then given other sizes or strides")


# An expand that repeats no element (sizes of 1 and -1: HF's position_ids buffer,
# nn.Buffer(torch.arange(n).expand((1, -1))) then init.copy_) is written without views as
# eager writes it (before: refused as "summed over the expanded copies").
@pytest.mark.parametrize("detach", [False, True], ids=["expanded", "expanded_then_detached"])
def test_write_through_an_expand_that_repeats_no_element_without_views(detach):
    def f(x):
        buf = torch.arange(4).expand((1, -1))
        if detach:
            buf = buf.detach()
        buf.copy_(x.expand((1, -1)) * 2)
        return buf + 0

    assert_matches_eager(f, torch.arange(4), remove="mutations_and_views")


@pytest.mark.parametrize("view", ["view", "flatten", "transpose", "select"])
def test_views_of_a_quantized_tensor_match_eager(view, remove):
    # Converted PTQ/QAT models flatten quantized activations; without views the wrapper's eager
    # metadata came from a meta twin, which quantized dtypes have none of (torch's "Could not run
    # 'aten::as_strided' with arguments from the 'QuantizedMeta' backend").
    take = {"view": lambda q: q.view(2, 12), "flatten": lambda q: q.flatten(1),
            "transpose": lambda q: q.transpose(1, 2), "select": lambda q: q[1]}[view]

    def f(x):
        q = torch.quantize_per_tensor(x, 0.05, 10, torch.quint8)
        return take(q).dequantize() * 2

    x = torch.randn(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated
        expected = f(x)
        torch.testing.assert_close(tfz.functionalize(f, remove=remove)(x), expected, rtol=0, atol=0)
        captured = tfz.capture(f, x, remove=remove)
        torch.testing.assert_close(captured(x), expected, rtol=0, atol=0)
