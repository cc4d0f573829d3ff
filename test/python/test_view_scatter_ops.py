"""The view scatter ops (select_scatter, slice_scatter, diagonal_scatter) applied to a view: eager's
result is a copy of the view's whole storage at the view's geometry, and writes to it, resizes of
it and as_strided on it see that storage as in eager (Note [Alias: writes to a value that is not
its whole storage]); without views, where the value holds the view's own elements only, what
would read other elements is refused by name."""

import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import functionalize


def _strided_slice_of_a_4x4():
    return (torch.arange(16.0).view(4, 4)[1:, ::2],)


def test_growing_a_scatter_result_of_an_empty_view_without_views_is_refused_by_name():
    # Eager's slice_scatter of the empty slice v = x[1:1:2] copies x's storage from v's offset, and
    # v1.resize_((7,)) shows those elements; without views the result holds none of them (it would
    # grow into new memory, silently other values). Refused.
    def f(x):
        v = x[1:1:2]
        v1 = v.slice_scatter(v, 0, 0)
        v1.resize_((7,))
        return v1 * 1

    with pytest.raises(NotImplementedError, match="resize_: the tensor is .* the result of a"):
        functionalize(f, remove="mutations_and_views")(torch.arange(3.0))
    x = torch.arange(3.0)
    assert torch.equal(functionalize(f, remove="mutations")(x.clone())[:2], f(x.clone())[:2])


@pytest.mark.parametrize("write", ["normal_", "index_fill_", "out="])
def test_write_to_a_scatter_result_of_a_view_keeps_its_storage(write):
    # x.select_scatter(..) of a view x is, in eager, a copy of x's whole storage at x's geometry
    # (offset 4 of 16 elements). A write to it keeps that whole storage, not only its 6 elements
    # from offset 0, so a later as_strided reads eager's elements and stays in bounds
    # (Note [Alias: writes to a value that is not its whole storage]).
    def f(x):
        torch.manual_seed(0)
        v = x.select_scatter(torch.zeros(3), 1, 0)
        if write == "normal_":
            v.normal_()
        elif write == "index_fill_":
            v.index_fill_(0, torch.tensor([2]), -1.0)
        else:
            torch.sin(v, out=v)
        v.as_strided_((2,), (3,), 4)  # element (0, 0) of v, then one outside v's elements
        return v, v.as_strided((3,), (5,), 0)

    assert_matches_eager(f, make_inputs=_strided_slice_of_a_4x4)


def test_as_strided_of_a_scatter_result_of_a_view_without_views_is_refused_by_name():
    # Without views the view's value is its own elements, and eager's result holds the whole
    # storage's: as_strided on it read the wrong elements silently.
    def f(x):
        v = x.select_scatter(torch.zeros(3), 1, 0)
        return v.as_strided((2,), (3,), 0) * 1

    with pytest.raises(NotImplementedError, match="copy of the view's whole storage"):
        functionalize(f, remove="mutations_and_views")(*_strided_slice_of_a_4x4())
    # On a tensor that is its whole storage nothing is refused.
    x = torch.arange(8.0).view(2, 4)
    assert_matches_eager(lambda x: x.select_scatter(torch.zeros(4), 0, 0).as_strided((2,), (3,), 1)
                         * 1, x, remove="mutations_and_views")


def test_write_through_a_view_of_a_strided_scatter_result_keeps_its_strides(remove):
    # v = x.slice_scatter(..) of x with strides (1, 2) keeps them in eager, and keeps them after a
    # write through v.adjoint(), not the contiguous strides of the inverse's result
    # (Note [Alias: writes to a value that is not its whole storage]).
    def f(x):
        v = x.slice_scatter(torch.zeros((0, 2)), 0, 1)
        v.adjoint().index_copy_(1, torch.tensor([0]), torch.ones(2, 1))
        return v, v.as_strided((2,), (1,), 0)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=lambda: (torch.arange(3.0).as_strided((1, 2), (1, 2)),))
    else:
        with pytest.raises(NotImplementedError, match="copy of the view's whole storage"):
            functionalize(f, remove=remove)(torch.arange(3.0).as_strided((1, 2), (1, 2)))


def test_scatter_of_a_self_overlapping_view(remove):
    # v = x.as_strided((1, 2, 3), (2, 3, 3)) shares elements between its last two dimensions;
    # eager's v.select_scatter(..) keeps v's strides, so the scattered elements land on others. With
    # views kept ours is eager's; without views the *_copy value has no such layout, so it is
    # refused by name (Note [Alias: writes to a value that is not its whole storage]).
    def f(x):
        v = x.as_strided((1, 2, 3), (2, 3, 3), 0)
        return v * 1, v.select_scatter(torch.ones((1, 2)), 2, 2) * 1

    def make_inputs():
        return (torch.arange(12.0).view(3, 2, 2)[..., ::2],)

    if remove == "mutations":
        # x does not span its storage: make_fx refuses the as_strided by name, capture guards the
        # layout (Note [Inputs: storage coordinates under a tracer]).
        assert_matches_eager(f, make_inputs=make_inputs,
                             make_fx_refusal="does not span its storage")
    else:
        with pytest.raises(NotImplementedError, match="whose elements share memory"):
            functionalize(f, remove=remove)(*make_inputs())
        # A strided view whose elements do not share memory is not refused.
        assert_matches_eager(lambda x: x[:, ::2].select_scatter(torch.zeros(3), 1, 0) * 1,
                             torch.arange(12.0).view(3, 4), remove=remove)


def test_resize_of_a_scatter_result_at_an_offset_with_a_view_alive(remove):
    # v2 = v1.select_scatter(..) of a view at offset 1 keeps that offset in eager (a copy of v1's
    # whole storage); v3 = v2[None] is alive when torch.eye(2, out=v2) resizes v2. Without views we
    # hold only v2's own elements, so graphs would read v3's last element at the wrong storage
    # coordinate (silently): that resize is refused by name.
    def f(x0):
        v1 = x0.tensor_split(2, 1)[1]
        v2 = v1.select_scatter(torch.full((1,), 7.0), 0, 1)
        v3 = v2[None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.eye(2, out=v2)
        return v1, v2, v3

    def make_inputs():
        return (torch.arange(6.0).reshape(3, 2),)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
        return
    for run in (lambda: functionalize(f, remove=remove)(*make_inputs()),
                lambda: make_fx(functionalize(f, remove=remove))(*make_inputs())):
        with pytest.raises(NotImplementedError, match="aten::eye.out: growing a tensor past"):
            run()
