"""Conjugate and negative views (x.conj(), x._neg_view(), x.adjoint()) under functionalize: writes
through them reach their bases, and resizes, splits and copies of them keep or resolve the bits as
eager does. See Note [Wrapper: mirrored conjugate and negative bits]. What a wrapper reports about
its bits: test_tensor_metadata.py."""

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import functionalize


def _complex(*shape):
    return torch.randn(*shape, dtype=torch.complex64)


def test_write_through_conj_view_updates_input(remove):
    def f(x):
        c = x.conj()
        c.mul_(2j)
        c[0] = 1 + 1j
        return c.resolve_conj(), x

    assert_matches_eager(f, _complex(4), remove=remove)


def test_write_through_neg_view_updates_intermediate_base(remove):
    def f(x):
        base = x.clone()
        torch._neg_view(base).add_(1)
        return base

    assert_matches_eager(f, torch.randn(4), remove=remove)


def test_view_as_real_of_conj_resolved_write_updates_input(remove):
    def f(x):
        torch.view_as_real(x)[:, 1].mul_(-1)
        return torch.view_as_complex(torch.view_as_real(x)), x

    assert_matches_eager(f, _complex(3), remove=remove)


def test_conj_physical_inplace_on_conj_view_keeps_the_bit():
    def f(x):
        c = x.conj()
        c.conj_physical_()
        return c.is_conj(), c.resolve_conj(), x

    assert_matches_eager(f, _complex(3), remove="mutations")


@pytest.mark.parametrize("case", ["resize_", "as_strided_", "resize_ of a negative view"])
def test_resize_of_a_conjugate_view_keeps_its_bit(remove, case):
    # v = x.adjoint() has the conjugate bit; v.resize_((1, 3)) rebuilds its chain from the base as
    # one as_strided step, which must keep the bit, or v would read the elements unconjugated: the
    # new chain ends with the old one's _conj / _neg_view steps. See Note [Kernel: resize_].
    def f(x):
        if case == "resize_ of a negative view":
            v = torch._neg_view(x).t()
        else:
            v = x.adjoint()
        if case == "as_strided_":
            v.as_strided_((1, 3), (3, 1), 2)
        else:
            v.resize_((1, 3))
        return v * 1

    def make_inputs():
        return (torch.arange(12.0).view(2, 6).to(torch.complex64).mul(1 + 2j)[:, ::2],)

    if case == "as_strided_" and remove == "mutations_and_views":
        # Refused by name without views, as before (the base's elements are not the view's).
        with pytest.raises(NotImplementedError, match="conjugate/negative bits"):
            functionalize(f, remove=remove)(*make_inputs())
        return
    # x[:, ::2] does not span its storage: make_fx refuses its as_strided_ by name
    # (Note [Inputs: storage coordinates under a tracer]).
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove,
                         make_fx_refusal="does not span its storage" if case == "as_strided_"
                         else None)


def test_resize_of_an_unsafe_chunk_of_a_conjugate_view_reads_eager_storage(remove):
    # unsafe_chunk of x.adjoint() splits a resolved copy (eager's conjugate fallback), laid out like
    # x.adjoint(); resizing a chunk over that copy's storage reads it in that order, also in graphs
    # without views, whose copy would be row-major (Note [Kernel: unsafe_split]).
    def f(x):
        v1 = x.adjoint()
        v2 = v1.unsafe_chunk(3, -1)[0]
        v2.resize_as_(v1)
        return v1 * 1, v2 * 1

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(20.0).view(5, 4) * (1 - 1j),),
                         remove=remove)


@pytest.mark.parametrize("bit", ["conj", "neg"])
def test_unsafe_chunk_of_a_conjugate_view_does_not_alias_it(remove, bit):
    # Eager's conjugate (and negative) fallback resolves the bit into a copy before unsafe_split, so
    # unsafe_chunk of x.conj() does not alias x, and a later write to x.conj() does not reach the
    # chunk, in ours as in eager (Note [Kernel: unsafe_split]).
    def f(x):
        torch.manual_seed(0)
        v = x.conj() if bit == "conj" else x._neg_view()
        chunk = v.unsafe_chunk(2, 0)[1]
        torch.rand((4,), out=v)
        return chunk * 1, v * 1

    def make_inputs():
        return (torch.tensor([1 + 2j, 3 - 4j, -5 + 6j, 7 + 8j], dtype=torch.complex64),)

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


def test_write_through_imag_of_conj_of_an_input_aliased_by_its_real(remove):
    # x1 and x1.real are both inputs (a byte base), and x1.conj().imag is written. Without views
    # such a chain takes the steps' own inverses: the overlap check's replay of the chain on meta
    # tensors would set the conjugate bit (_conj) that the *_copy values do not carry, and
    # view_as_real of it raises.
    def f(x0, x1):
        v = x1.conj().imag
        v -= -0.25
        return v + 0

    def make_inputs():
        torch.manual_seed(0)
        b = torch.randn(3, dtype=torch.complex64)
        return b.real, b

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


@pytest.mark.parametrize("bit", ["conj", "neg"])
def test_inputs_aliasing_a_conjugate_view_of_a_slice(remove, bit):
    # x.conj() of a row of a buffer and its unsqueeze(0) are two inputs of one storage: their flat
    # base was the whole storage copied out of the conjugate view, which the conjugate fallback
    # first copied down to the view's own elements, so the copy read past their end (a raw
    # setStorage error; fuzzer program 1003330 through torch.compile). With views the bit is
    # undone as a view first; without, no view may enter the graph, and it is refused by name.
    def f(v0, v2):
        v0.copy_(v0 * 2)
        return v2.unfold(-1, 1, 3) * 1

    def make_inputs():
        torch.manual_seed(0)
        row = torch.randn(4, 2, dtype=torch.complex64).select(0, 1)
        v0 = row.conj() if bit == "conj" else torch._neg_view(row.conj())
        return v0, v0.unsqueeze(0)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
    else:
        with pytest.raises(NotImplementedError, match="conjugate or negative view .* not its whole"):
            functionalize(f, remove=remove)(*make_inputs())
