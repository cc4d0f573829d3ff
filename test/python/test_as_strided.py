"""as_strided and as_strided_ under functionalize, compared with eager: they address storage
coordinates, so they are taken from the storage's base (seen in the view's dtype) rather than from
the view (Note [Kernel: as_strided without views]); writes through them may reach elements no
input covers (Note [Inputs: writes outside every input's elements]); and inputs that do not start
their storage, or whose storage has another dtype or conjugate bits, are refused by name where
their coordinates cannot be expressed."""

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import capture, functionalize


# make_fx's refusal of as_strided on an input that does not span its storage
# (Note [Inputs: storage coordinates under a tracer]); capture's graphs guard the layout instead.
TRACED_INSIDE_STORAGE = "does not span its storage"


def _matches_eager_but_graphs_without_views_refuse(f, make_inputs, remove, match,
                                                   make_fx_refusal=None):
    """Eager functionalization matches eager in both modes; with views kept so does the graph,
    without views capture refuses by name (the epilogue would need a view of the input)."""
    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove,
                             make_fx_refusal=make_fx_refusal)
        return
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=False)
    with pytest.raises(NotImplementedError, match=match):
        capture(f, *make_inputs(), remove=remove)


def test_as_strided_of_a_view_without_views(remove):
    # as_strided of an unfold view, written through, with remove="mutations_and_views" too (it must
    # not fail with "setStorage: ... out of bounds"). See Note [Kernel: as_strided without views].
    def f(x):
        v = x.unfold(0, 2, 2)
        w = v.as_strided((1, 2, 2), (1, 2, 1), 4)
        w.mul_(10)
        return v + 0, w + 0

    assert_matches_eager(f, torch.randn(12), remove=remove)


@pytest.mark.parametrize("write", ["fill_", "index_fill_"])
def test_as_strided_of_an_empty_input_inside_its_storage_is_refused_by_name(remove, write):
    # x = b[1:, ::2] of a (1, 5) b has no element, and x.as_strided((1,), (1,), 4) is b's element 4.
    # The empty input keeps its own base, whose coordinates are not the storage's, so the write
    # would be silently lost. It is refused like as_strided of a slice of a large buffer; the input
    # is left as it was. See Note [Inputs: inputs that do not start their storage].
    def f(x):
        v = x.as_strided((1,), (1,), 4)
        if write == "fill_":
            v.fill_(3)
        else:
            v.index_fill_(0, torch.tensor([0]), 3)
        return v

    b = torch.arange(1.0, 6.0).view(1, 5)
    with pytest.raises(NotImplementedError, match="as_strided.*starts inside a larger storage"):
        functionalize(f, remove=remove)(b[1:, ::2])
    assert torch.equal(b, torch.arange(1.0, 6.0).view(1, 5))


def test_as_strided_of_an_empty_slice_of_a_large_buffer_is_refused_by_name(remove):
    buffer = torch.arange(10000.0)
    with pytest.raises(NotImplementedError, match="as_strided.*starts inside a larger storage"):
        functionalize(lambda x: x.as_strided((1,), (1,), 4).fill_(3), remove=remove)(
            buffer[5000:5000])
    assert torch.equal(buffer, torch.arange(10000.0))


def _write_through_as_strided_of_a_view(x0):
    # The as_strided view reaches elements its own view does not cover.
    v = x0.unbind(-2)[0].as_strided((1, 1), (4, 1), 3)
    v.add_(10)
    return v, x0 * 1


def _write_through_as_strided_of_a_later_view(x0):
    # as_strided of a view reaching past the input's elements.
    v = x0.view(-1).as_strided((1, 4), (1, 3), 8)
    v.index_put_((torch.tensor([0]),), torch.tensor(2.0), accumulate=True)
    return v, x0 * 1


@pytest.mark.parametrize(
    "name, f, make",
    [
        ("unbind then as_strided", _write_through_as_strided_of_a_view,
         lambda: (torch.arange(4.0).reshape(2, 2),)),
        # ... and the write past the input's elements reaches the caller's storage
        # (Note [Inputs: writes outside every input's elements]).
        ("view then as_strided", _write_through_as_strided_of_a_later_view,
         lambda: (torch.arange(24.0).reshape(2, 4, 3).select(0, 0),)),
    ],
)
def test_writes_through_as_strided_of_a_view(remove, name, f, make):
    # as_strided_scatter on the view cloned it (its own elements, offset 0), so the write was lost
    # with remove="mutations" (Note [Kernel: as_strided without views]).
    if f is _write_through_as_strided_of_a_view:
        assert_matches_eager(f, make_inputs=make, remove=remove)
        return
    # A graph without views cannot write the elements past the input (its replay used to drop
    # them).
    _matches_eager_but_graphs_without_views_refuse(f, make, remove,
                                                   "cannot write those elements back",
                                                   TRACED_INSIDE_STORAGE)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: x.as_strided((2,), (1,), 12).mul_(10),
        lambda x: (x.add_(1), x[1:].as_strided((2,), (1,), 12) * 1)[1],
        lambda x: x.as_strided_((2,), (1,), 12),
    ],
    ids=["write", "read after a write", "as_strided_"],
)
def test_as_strided_of_a_slice_of_a_large_buffer_is_refused_by_name(remove, f):
    # Such an input keeps its own base (Note [Inputs: inputs that do not start their storage]),
    # whose coordinates are not the storage's: as_strided's inverse wrote the wrong elements or
    # failed inside torch with a setStorage bound error.
    buffer = torch.arange(10000.0)
    with pytest.raises(NotImplementedError, match="as_strided.*starts inside a larger storage"):
        functionalize(f, remove=remove)(buffer[10:20])
    assert torch.equal(buffer, torch.arange(10000.0))


def test_as_strided_of_an_input_aliased_with_another_dtype(remove):
    # The two inputs share a byte base. Without views the step would be taken from that base and
    # return uint8 (Note [Kernel: as_strided without views]); it is refused by name there, and with
    # views kept it reads eager's values.
    def f(x0, x1):
        return x0.as_strided((1, 4, 2), (1, 1, 1), 0) * 1

    def make_inputs():
        b = torch.linspace(-2.0, 2.0, 8).reshape(4, 2, 1)
        return b[..., ::2], b[..., ::2].view(torch.int32)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Float view"):
            functionalize(f, remove=remove)(*make_inputs())


def test_as_strided_write_outside_the_inputs_under_a_tracer_without_views(remove):
    # x = b[..., ::2] covers elements 0 and 2 of b's storage; a write through x.as_strided(.., 3)
    # reaches element 3. Eagerly the epilogue writes the whole storage
    # (Note [Inputs: writes outside every input's elements]); a captured graph without views has no
    # view to do that with and would drop the write: refused by name.
    def f(x):
        v = x.as_strided((1,), (0,), 3)
        v.add_(v)
        return v * 1

    def make_inputs():
        return (torch.arange(4.0).view(2, 2)[..., ::2],)

    _matches_eager_but_graphs_without_views_refuse(f, make_inputs, remove,
                                                   "cannot write those elements back",
                                                   TRACED_INSIDE_STORAGE)


def test_as_strided_of_a_conjugate_view_without_views_is_refused_by_name():
    # Without views x.mH.as_strided(..) would be taken from the storage's base, which has no
    # conjugation, and return the unconjugated values: refused by name
    # (Note [Kernel: as_strided without views]).
    def f(x):
        return x.mH.as_strided((3,), (1,), 1) * 1

    x = torch.randn(5, 1, 1, dtype=torch.complex64)
    torch.testing.assert_close(functionalize(f)(x.clone()), f(x.clone()))
    with pytest.raises(NotImplementedError, match="conjugate/negative bits"):
        functionalize(f, remove="mutations_and_views")(x.clone())


def test_as_strided_below_the_start_of_a_grown_input(remove):
    # x = b[1:, ::2] has no element and starts at b's element 4; ones(out=x) grows the storage to 8
    # elements, which keep b's first four, so as_strided(.., 2) reads b's element 2 and x's first.
    # With views the grown base holds the storage from its element 0 (Note [Kernel: resize_]); it
    # was refused by name while the base began at x's start. Without views an unwritten storage
    # still grows from x's start (a graph could not write the elements before it back), so
    # as_strided below it stays refused by name there.
    def f(x):
        torch.ones((1, 4), out=x)
        return x.as_strided((2,), (3,), 2) * 1

    def make_inputs():
        return (torch.arange(4.0).view(1, 4)[1:, ::2],)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
    else:
        with pytest.raises(NotImplementedError, match="storage was grown by a resize"):
            functionalize(f, remove=remove)(*make_inputs())


def test_write_through_as_strided_of_a_real_view_of_a_complex_input(remove):
    # view_as_real(x) of a complex x, then as_strided reaching floats the view does not cover: with
    # views kept the step is taken from the base reinterpreted as float, since the view's own
    # inverse (as_strided_scatter into the view's own elements) would lose the write
    # (Note [Kernel: as_strided without views]); without views it is refused by name.
    def f(x):
        v = torch.view_as_real(x.unsqueeze(-2)[0])
        w = v.as_strided((2, 1), (3, 2), 8)
        w.add_(2.0, alpha=-1)
        return w * 1, x * 1

    def make_inputs():
        return (torch.arange(12.0).view(4, 3).to(torch.complex64) * (1 + 2j),)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Float view"):
            functionalize(f, remove=remove)(*make_inputs())


def test_as_strided_of_inputs_of_two_dtypes_stays_a_view_of_them(remove):
    # Inputs of two dtypes share a byte base; an as_strided taken from the byte base reinterpreted
    # is returned as a view of the inputs, as in eager, not as a copy.
    def f(x0, x1, x2):
        x2.mul_(2)
        return x0.as_strided((4, 3), (0, 0), 1)

    def make_inputs():
        b0 = torch.linspace(-1.0, 1.0, 4).view(1, 4)
        return b0, b0.view(torch.int32), b0

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
        inputs = make_inputs()
        out = functionalize(f)(*inputs)
        assert out.untyped_storage().data_ptr() == inputs[0].untyped_storage().data_ptr()
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Float view"):
            functionalize(f, remove=remove)(*make_inputs())


def test_write_through_as_strided_of_an_input_beside_its_view_of_another_dtype(remove):
    # x0 = b[1:, ::2] and x1 = x0.view(torch.float64) share a byte base; x0.as_strided((1,), (0,),
    # 7) reaches b's element 7, which neither input covers. With views kept the step is taken from
    # the byte base seen as int64 (x0's own inverse writes x0's elements only, and the write would
    # be lost, in the output and in b), and the output is still a view of b
    # (Note [Kernel: as_strided without views]).
    def f(x0, x1):
        v = x0.as_strided((1,), (0,), 7)
        v.fill_(-2)
        return v

    def run(fn):
        b = torch.arange(16).view(2, 2, 4)
        out = fn(b[1:, ::2], b[1:, ::2].view(torch.float64))
        return b, out

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=lambda: run(lambda *a: a)[1])
        b_e, out_e = run(f)
        b_f, out_f = run(functionalize(f))
        assert torch.equal(b_f, b_e) and torch.equal(out_f, out_e)
        assert out_f.untyped_storage().data_ptr() == b_f.untyped_storage().data_ptr()
        assert out_f.storage_offset() == out_e.storage_offset() == 7
        b_g = torch.arange(16).view(2, 2, 4)
        capture(f, *run(lambda *a: a)[1])(b_g[1:, ::2], b_g[1:, ::2].view(torch.float64))
        assert torch.equal(b_g, b_e)
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Long view"):
            functionalize(f, remove=remove)(*run(lambda *a: a)[1])


def test_write_then_as_strided__of_an_input_beside_its_view_of_another_dtype(remove):
    # x1 = b.view(torch.int32) beside x0 = b[::2]; a write to all of x1, then x1.as_strided_ to one
    # element. The epilogue writes the byte base whole, after the metadata ops eagerly and before
    # them in graphs; x1's final element alone would lose the storage's other written bytes. See
    # Note [Inputs: writes before a metadata change].
    def f(x0, x1):
        x1.masked_fill_(x1 > 0, 2)
        x1.as_strided_((1, 1), (3, 2), 8)
        return x0 * 1

    def run(fn):
        b = torch.linspace(-1.0, 1.0, 30).view(5, 2, 3)
        out = fn(b[::2], b.view(torch.int32))
        return b, out

    def make_inputs():
        return run(lambda *a: a)[1]

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
        b_e, _ = run(f)
        b_f, _ = run(functionalize(f))
        assert torch.equal(b_f.view(torch.int32), b_e.view(torch.int32))
        b_g = torch.linspace(-1.0, 1.0, 30).view(5, 2, 3)
        capture(f, *make_inputs())(b_g[::2], b_g.view(torch.int32))
        assert torch.equal(b_g.view(torch.int32), b_e.view(torch.int32))
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Int view"):
            functionalize(f, remove=remove)(*make_inputs())


def test_write_outside_the_inputs_then_a_metadata_change_reaches_graphs(remove):
    # x = b[1:, ::2]; x.as_strided((2,), (1,), 10).fill_(0) writes b's element 11, which x does not
    # cover, then x.squeeze_(). With views kept the graph writes the storage whole before its
    # metadata ops (x's own elements alone would lose element 11); without views it is refused by
    # name (Note [Inputs: writes outside every input's elements]).
    def f(x):
        v = x.as_strided((2,), (1,), 10)
        v.fill_(0)
        x.squeeze_()
        return v * 1

    def make_inputs():
        return (torch.arange(12).view(2, 6)[1:, ::2],)

    _matches_eager_but_graphs_without_views_refuse(f, make_inputs, remove,
                                                   "cannot write those elements back",
                                                   TRACED_INSIDE_STORAGE)
    if remove == "mutations":
        # The storage itself, element 11 included, as eager leaves it, through a captured graph.
        base_e, base_g = torch.arange(12).view(2, 6), torch.arange(12).view(2, 6)
        f(base_e[1:, ::2])
        gm = capture(f, *make_inputs())
        gm(base_g[1:, ::2])
        assert torch.equal(base_g, base_e)


def test_write_outside_the_members_of_inputs_of_two_dtypes(remove):
    # Inputs b[::2] and b.real of a complex b share a byte base; an as_strided_ of the first reaches
    # b's element 3, whose imaginary half neither input covers: the epilogue writes the byte base
    # whole, not the inputs only (Note [Inputs: writes outside every input's elements]); without
    # views as_strided of a view whose storage has another dtype is refused by name.
    def f(x0, x1):
        v = x0.split(3, 0)[0]
        v.as_strided_((2,), (3,), 0)
        v.mul_(2)
        return v * 1, x1 * 1

    def make_inputs():
        b = torch.tensor([1 + 2j, 3 - 4j, -5 + 6j, 7 + 8j, 9 - 1j, 2 + 3j], dtype=torch.complex64)
        return b[::2], b.real

    if remove == "mutations":
        b_e, b_o = make_inputs()[0]._base, make_inputs()[0]._base
        f(b_e[::2], b_e.real)
        functionalize(f)(b_o[::2], b_o.real)
        assert torch.equal(b_o, b_e)
        assert_matches_eager(f, make_inputs=make_inputs)
    else:
        with pytest.raises(NotImplementedError, match="shared with a tensor of another dtype"):
            functionalize(f, remove=remove)(*make_inputs())


@pytest.mark.parametrize("case", ["as_strided", "as_strided_of_a_view", "write", "as_strided_"])
def test_as_strided_of_a_result_laid_out_otherwise_in_graphs(remove, case):
    # Traced without views, `x.t().exp()` is computed from the contiguous t_copy and reports eager's
    # transposed strides; as_strided on it (or on a view of it, or written through it) reads the
    # storage in eager's layout: the base is copied into eager's strides first (empty_strided + copy
    # in the graph). See
    # Note [Strides: what eager gives], case "storage coordinates".
    def f(x):
        v = x.t().exp()
        if case == "as_strided":
            return v.as_strided((2, 3), (1, 2), 1) * 1
        if case == "as_strided_of_a_view":
            return v[1:].as_strided((2, 3), (1, 2), 1) * 1
        if case == "write":
            v[1:].as_strided((2, 3), (1, 2), 1).mul_(2)
            return v * 1
        v.as_strided_((2, 3), (1, 2), 1)
        v.mul_(2)
        return v * 1

    assert_matches_eager(f, torch.arange(12.0).view(4, 3), remove=remove)


def test_as_strided__of_a_view_of_another_dtype_of_an_input_slice(remove):
    # x = b[:2] of a float b gets the flat base; v = x.view(torch.int32), v.as_strided_((1,), (1,),
    # 2) reaches b's element 2, which x does not cover. With views kept the step is taken from the
    # base seen as int32 (base_in_dtype_of), so the scatter_ through it reaches b (on the view it
    # would be lost), and the output is still a view of b.
    def f(x):
        v = x.view(torch.int32)
        v.as_strided_((1,), (1,), 2)
        v.scatter_(0, torch.tensor([0]), -1)
        return v

    def run(fn):
        b = torch.tensor([0.5, -0.75, 2.0])
        return b, fn(b[:2])

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=lambda: (run(lambda x: x)[0][:2],),
                             make_fx_refusal=TRACED_INSIDE_STORAGE)
        b_e, out_e = run(f)
        b_f, out_f = run(functionalize(f))
        assert torch.equal(b_f.view(torch.int32), b_e.view(torch.int32))
        assert torch.equal(out_f, out_e) and out_f.storage_offset() == 2
        assert out_f.untyped_storage().data_ptr() == b_f.untyped_storage().data_ptr()
    else:
        with pytest.raises(NotImplementedError, match="as_strided of a Int view"):
            functionalize(f, remove=remove)(run(lambda x: x)[0][:2])
