"""Strides under functionalize are eager's: a written tensor keeps its strides
(Note [Strides: what eager gives], case "written base"), a base keeps its strides through writes of
its views (Note [Strides: what eager gives], case "inverted base"), and without views results and
outputs report eager's strides, not those of their packed values (Note [Strides: what eager gives],
case "op results", Note [Strides: what eager gives], case "outputs"). Strides of out= tensors:
test_out_arguments.py."""

import warnings

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import functionalize


@pytest.mark.parametrize("write", ["atan_", "out=", "index_fill_"])
def test_writes_keep_the_strides_of_a_non_dense_tensor(write):
    # The functional result of a write into a tensor that is not dense keeps that tensor's strides,
    # it does not come back contiguous (Note [Strides: what eager gives], case "written base").
    # Views are kept only with remove="mutations"; without views the inner values are dense copies.
    def f(x):
        y = x.select_scatter(torch.randn(()), 0, 0)
        if write == "atan_":
            y.atan_()
        elif write == "out=":
            torch.neg(y, out=y)
        else:
            y.index_fill_(0, torch.tensor([1]), 2.0)
        return y

    def make():  # a fresh non-dense input each time (clone() would make it contiguous)
        torch.manual_seed(0)
        return torch.randn(3)[::2]

    expected = f(make())
    got = functionalize(f, remove="mutations")(make())
    assert got.stride() == expected.stride() == (2,)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_write_through_a_transposed_base_keeps_the_base_strides(remove):
    # After x.t_(), mm(out=x) writes x through its transpose; the base keeps its own strides, so the
    # view taken before t_() still replays (a transposed base fails with "view size is not
    # compatible") (Note [Strides: what eager gives], case "inverted base").
    def f(x):
        v1 = x.select_scatter(torch.ones(4), 0, 1)
        v4 = x.view((2, 1, 4, 2))
        x.t_()
        torch.mm(v1, v1, out=x)
        return v1, v4

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(16.0).view(4, 4),), remove=remove)


def test_as_strided_after_a_write_through_a_dtype_view_of_a_transposed_input(remove):
    # x = b.t() written through x.view(int32).diagonal(), then x.as_strided_ reads storage elements
    # from the base, which the inverses leave in its own strides, not row-major
    # (Note [Strides: what eager gives], case "inverted base").
    def f(x):
        v1 = x.view(torch.int32)
        v3 = v1.diagonal(0, 1, 0)
        x.as_strided_((2,), (1,), 3)
        v3[0] = 7
        return v1, v3

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(8.0).view(4, 2).t(),),
                         remove=remove)


def test_written_input_keeps_the_strides_of_its_size_one_dimensions(remove):
    # x = b.t() of a (6, 1) b has strides (1, 1) and keeps them after a write, not (6, 1), so
    # x.adjoint().view(torch.int16) works where eager's last stride is 1
    # (Note [Strides: what eager gives], case "written base").
    def f(x):
        v = x.adjoint()
        x.clamp_max_(0.5)
        return v.view(torch.int16) * 1, x.t()

    assert_matches_eager(f, make_inputs=lambda: (torch.linspace(-1, 1, 6).view(6, 1).t(),),
                         remove=remove)


def test_results_of_views_report_eager_strides_in_graphs_without_views():
    # Traced without views, a result computed from a view's value reports eager's layout, not the
    # value's: v0.view(6) works where eager's v0 is contiguous, and an out= tensor resized to x2 /
    # x0 of two transposed inputs takes eager's strides. See
    # Note [Strides: what eager gives], case "op results".
    def f(x0, x1):
        v0 = x1.diagonal_scatter(torch.full((2,), 7.0))
        v0.t_()
        return v0 * 1, v0.view(6)

    def make_f_inputs():
        b0 = torch.arange(6.0).reshape(3, 2)
        return b0, b0.t()

    def g(x0, x1, x2):
        v1 = x2 / x0
        torch.add(v1, x0, out=x1)  # add's kernel is unboxed, div's too
        return v1 * 1, x1 * 1

    def make_g_inputs():
        b0 = torch.linspace(1.0, 2.0, 20).reshape(4, 5)
        return b0.t(), torch.zeros(3), b0.t()

    assert_matches_eager(f, make_inputs=make_f_inputs, remove="mutations_and_views")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager's own "output was resized"
        assert_matches_eager(g, make_inputs=make_g_inputs, remove="mutations_and_views")


@pytest.mark.parametrize("convert", ["type_as", "to(device, dtype)", "new_empty_strided"])
def test_results_of_ops_with_a_device_argument_report_eager_strides_without_views(convert):
    # type_as(y) is _to_copy(.., device=y.device): its eager strides came from a run on meta
    # twins whose device argument was still the values' (the run failed, and the result kept its
    # value's contiguous layout), so an out= resize of a view at an offset named other elements
    # in the graph (fuzzer program 969396). See Note [Strides: what eager gives], case
    # "op results".
    def f(x0, x1, x2):
        x0.mul_(2)
        if convert == "type_as":
            v0 = x1.type_as(x2)
        elif convert == "to(device, dtype)":
            v0 = x1.to(x1.device, torch.complex64)
        else:
            v0 = x1.new_empty_strided((4, 3), (1, 4), dtype=torch.complex64).copy_(x1)
        torch.add(x2, 0.5, out=v0[1:])
        return v0 * 1

    def make_inputs():
        b0 = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
        return b0, b0.t(), torch.arange(3.0).to(torch.complex64)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager's own "output was resized"
        assert_matches_eager(f, make_inputs=make_inputs, remove="mutations_and_views")


def test_outputs_without_views_keep_eager_strides_with_gaps():
    # Without views `return x1` of an input b[:, 1:] (strides (5, 1)) keeps those strides, it does
    # not come back packed as (4, 1), and neither do overlapping outputs (unfold): an output whose
    # eager strides have gaps, stride-0 dims or overlapping elements is a copy in those strides;
    # outputs never alias inputs without views. See
    # Note [Strides: what eager gives], case "outputs".
    def f(x0, x1):
        x0.add_(x0)
        return (x1.unsqueeze(1), x1, x1[:, ::2], x1.expand(2, 3, 4), x1.diagonal(),
                x0.unfold(1, 2, 1))

    def make_inputs():
        b = torch.arange(15.0).view(3, 5)
        return b.t(), b[:, 1:]

    expected = f(*make_inputs())
    inputs = make_inputs()
    got = functionalize(f, remove="mutations_and_views")(*inputs)
    for g, e in zip(got, expected):
        assert torch.equal(g, e) and g.stride() == e.stride()
        assert g.untyped_storage().data_ptr() != inputs[0].untyped_storage().data_ptr()
    assert_matches_eager(f, make_inputs=make_inputs, remove="mutations_and_views")
