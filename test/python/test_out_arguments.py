"""Ops called with out= under functionalize, compared with eager: the out tensor (an input, an
intermediate, a view of one, several for multi-output ops) is written; an out of another size is
resized to the result, keeping the storage elements it no longer covers and the views of it
(Note [Kernel: out= resize]), and restrided as eager's kernel restrides it (Note [Kernel: out=
strides in graphs]); an out of another dtype gets the numbers eager's out= kernel computes in
that dtype (Note [Kernel: out= of another dtype, eagerly])."""

import pytest
import torch

from reference import assert_matches_eager


def test_out_add_into_input(remove):
    # torch.add(..., out=o) with o an input of the right size writes o.
    def f(a, b, o):
        r = torch.add(a, b, alpha=3, out=o)
        return r, o.sum()

    assert_matches_eager(f, torch.randn(3, 4), torch.randn(3, 4), torch.empty(3, 4), remove=remove)


def test_out_variant_resizes_output(remove):
    # An out= tensor of the wrong size created in f is resized to the result's size.
    def f(a, b):
        o = torch.empty(0)
        torch.add(a, b, out=o)
        return o, o.shape[0]

    assert_matches_eager(f, torch.randn(3, 4), torch.randn(4), remove=remove)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_out_variant_resizes_wrong_sized_intermediate(remove):
    # A wrongly sized (non-empty) out tensor is resized and fully overwritten.
    def f(x):
        o = torch.zeros(7)
        torch.mul(x, 2, out=o)
        return o + 1

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_out_variant_into_empty_input_resizes_input(remove):
    # An empty input used as out= ends with the result's shape and values.
    def f(a, o):
        torch.sin(a, out=o)
        return o * 1

    assert_matches_eager(f, torch.randn(2, 3), torch.empty(0), remove=remove)


def test_out_variant_aliasing_input(remove):
    # out= naming one of the op's own inputs behaves like an in-place op.
    def f(a, b):
        torch.mul(a, b, out=a)
        return a

    assert_matches_eager(f, torch.randn(5), torch.randn(5), remove=remove)


def test_out_variant_wider_dtype(remove):
    # An int64 out tensor receives an int32 result, cast as in eager.
    def f(a, b, o):
        torch.add(a, b, out=o)
        return o

    a = torch.arange(6, dtype=torch.int32)
    assert_matches_eager(f, a, a, torch.empty(6, dtype=torch.int64), remove=remove)


def test_out_variant_into_slice_of_intermediate(remove):
    # out= into a view of an intermediate writes that slice of its base.
    def f(x):
        buf = torch.zeros(4, 3)
        torch.exp(x, out=buf[1:3])
        return buf

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_out_cat(remove):
    # A TensorList op with out= (cat) writes a preallocated output.
    def f(a, b):
        o = torch.empty(5, 2)
        torch.cat([a, b], out=o)
        return o

    assert_matches_eager(f, torch.randn(2, 2), torch.randn(3, 2), remove=remove)


def test_multi_output_aminmax_out(remove):
    # aminmax with out=(min, max) writes both out tensors, one of them an input.
    def f(x, mx):
        mn = torch.empty(0)
        res = torch.aminmax(x, out=(mn, mx))
        return res.min, res.max, mn, mx

    assert_matches_eager(f, torch.randn(4, 3), torch.empty(()), remove=remove)


def test_multi_output_max_dim_out(remove):
    # torch.max(x, dim, out=(values, indices)) writes both outputs, indices as int64.
    def f(x, values, indices):
        torch.max(x, 1, keepdim=True, out=(values, indices))
        return values * 2, indices + 1

    x = torch.randn(3, 5)
    assert_matches_eager(
        f, x, torch.empty(3, 1), torch.empty(3, 1, dtype=torch.int64), remove=remove
    )


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_multi_output_max_dim_out_resized(remove):
    # torch.max with wrongly sized out tensors resizes both.
    def f(x):
        values, indices = torch.empty(1), torch.empty(1, dtype=torch.long)
        torch.max(x, 0, out=(values, indices))
        return values, indices

    assert_matches_eager(f, torch.randn(4, 6), remove=remove)
