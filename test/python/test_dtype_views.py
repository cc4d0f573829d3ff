"""Views that reinterpret a tensor's bytes as another dtype (x.view(dtype), bool views of other
bytes), compared with eager: writes through them change only the bytes eager changes, reads give
eager's bytes, and what a graph or a run without views cannot express is refused by name. See
Note [Kernel: bool views of other bytes], case "write to v" and
Note [Kernel: bool views of other bytes], case "v without views"."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import REMOVE_MODES, assert_matches_eager
from torch_functionalize import functionalize


def test_resize_of_a_dtype_reinterpreting_alias_is_refused(remove):
    # x1 = b.view(torch.int32) shares its bytes with the float input x0: resizing a view of it is
    # refused by name (the resized value would be the shared byte storage, uint8).
    def f(x0, x1):
        v0 = x1.unsqueeze(0)
        v0.resize_((2,))
        return v0

    b = torch.randn(2)
    with pytest.raises(NotImplementedError, match=r"aten::resize_: resizing a Int tensor that shares memory"):
        functionalize(f, remove=remove)(b, b.view(torch.int32))


def test_view_dtype_of_an_overlapping_view(remove):
    # Without views the value of v = y.unfold(1, 4, 1) keeps eager's stride order: among eager's
    # tied strides (6, 1, 1) the last dimension stays innermost (infer_dense_strides' order would
    # move it outward), so v.view(torch.float16) works where eager's last stride is 1. See
    # Note [Strides: what eager gives], case "value order".
    def f(x):
        v = (x * 2).unfold(1, 4, 1)
        return v, v.view(torch.float16)

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(24.0).view(4, 6) * (1 + 1j),),
                         remove=remove)


def test_write_through_a_bool_view_of_a_complex_input(remove):
    # x.view(torch.bool) shows each byte of x; a write through an as_strided of it must not be
    # scattered into a bool copy, whose conversion turns every byte of x into 0 or 1
    # (Note [Kernel: bool views of other bytes], case "write through a view of v").
    def f(x):
        v = x.view(torch.bool)[3:30]
        v[::7] = torch.tensor([True, False, True, False])
        return x * 1

    def make_inputs():
        return (torch.tensor([1 + 2j, 3 + 4j, 5 + 6j, 7 + 8j], dtype=torch.complex64),)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs)
    else:
        with pytest.raises(NotImplementedError, match="bool view of a ComplexFloat tensor"):
            functionalize(f, remove=remove)(*make_inputs())
    # A uint8 mask seen as bool (bytes 0 and 1) stays supported in both modes.
    def g(m):
        m.view(torch.bool)[1:].fill_(True)
        return m * 1

    assert_matches_eager(g, make_inputs=lambda: (torch.tensor([0, 1, 0, 0], dtype=torch.uint8),),
                         remove=remove)


# `v[idx] = True` with an index tensor is index_put_ up to torch 2.14 and index_fill_ from 2.15
# (torch's indexing picks the op; both are refused by name in graphs and without views).
_INDEXED_BOOL_WRITE = r"aten::index_(put|fill)_\S* of a bool view of a Float"


def test_partial_write_to_a_bool_view_of_float_bytes(remove):
    # v = x.view(torch.bool); v[idx] = True (index_put_) writes some bytes of x and leaves the
    # others as they are; a functional form that starts from a bool copy of v would turn them into 0
    # or 1 (x's first row would read as tiny floats). See
    # Note [Kernel: bool views of other bytes], case "write to v".
    def f(x):
        v = x.reshape_as(x).view(torch.bool)
        v[torch.tensor([2, 2])] = True
        v.masked_fill_(torch.arange(12) == 5, True)
        return x * 1

    def make_inputs():
        return (torch.arange(1.0, 10.0).reshape(3, 3),)

    if remove == "mutations":
        assert_matches_eager(f, make_inputs=make_inputs, check_graph=False)
        # Checked bit for bit (assert_matches_eager compares floats).
        expected, x_e = f(*make_inputs()), make_inputs()[0]
        f(x_e)
        x = make_inputs()[0]
        got = functionalize(f)(x)
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
        assert torch.equal(x.view(torch.int32), x_e.view(torch.int32))
        # A graph has no functional op that keeps the other bytes: refused by name.
        with pytest.raises(NotImplementedError, match=_INDEXED_BOOL_WRITE):
            make_fx(functionalize(f))(*make_inputs())
    else:
        with pytest.raises(NotImplementedError, match=_INDEXED_BOOL_WRITE):
            functionalize(f, remove=remove)(*make_inputs())

    # nan_to_num_ is a no-op on bool (eager writes nothing); without views the value is a bool copy
    # already, so it is refused there too.
    def n(x):
        x.view(torch.bool).nan_to_num_()
        return x * 1

    if remove == "mutations":
        assert_matches_eager(n, make_inputs=make_inputs, check_graph=False)
    else:
        with pytest.raises(NotImplementedError, match="nan_to_num_ of a bool view of a Float"):
            functionalize(n, remove=remove)(*make_inputs())

    # An op that overwrites every element of the view loses nothing, traced too (views kept).
    def g(x):
        x.view(torch.bool)[2].fill_(True)
        return x * 1

    if remove == "mutations":
        assert_matches_eager(g, make_inputs=make_inputs)


def test_copy_into_a_wider_view_of_partial_elements(remove):
    # x1 = b[:2] of 3 int32 (12 bytes), seen as one int64. Torch's functional copy clones its target
    # with clone_preserve_strides, which asserts a whole number of elements; with views kept the
    # write is refused by name before any change. See
    # Note [Kernel: functional variants that clone a storage of partial elements]. (A copy of v onto
    # itself is skipped, as eager's copy_ skips it: test_memory_overlap.py,
    # test_copy_between_two_views_of_the_same_elements_is_a_no_op; here the source differs.)
    def f(x1):
        v = x1.view(torch.int64)
        v.tensor_split(1)[0][0:] = v + 1
        return v

    def make_inputs():
        return (torch.arange(3, dtype=torch.int32)[:2],)

    if remove == "mutations":
        x = make_inputs()[0]
        before = x.clone()
        with pytest.raises(NotImplementedError, match=r"aten::copy_: the written tensor is a Long "
                                                      r"view of a storage of 12 bytes"):
            functionalize(f, remove=remove)(x)
        assert torch.equal(x, before)
    else:
        assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


def test_view_dtype_of_an_empty_narrow(remove):
    # Eager's x.narrow(2, 4, 0) keeps x's strides (8, 4, 1), so its view(torch.float64) works;
    # without views the narrow's *_copy is a fresh empty tensor with strides (2, 1, 1), and its
    # view(dtype) works all the same, where view_copy raises "self.stride(1) must be divisible by 2"
    # (Note [Strides: what eager gives], case "empty views").
    def f(x):
        v = x.narrow(2, 4, 0).view(torch.float64)
        x.add_(1)
        return v

    def make_inputs():
        torch.manual_seed(0)
        return (torch.randn(2, 2, 4)[:1],)

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


def _bool_view_bytes(x):
    return x.view(torch.bool).view(torch.uint8) + 0


def _int64_bytes():
    return (torch.tensor([-1, -4, 3, 258], dtype=torch.int64),)


def test_bool_view_of_other_bytes_reads_them_back(remove):
    # Eager's x.view(torch.bool).view(torch.uint8) reads x's bytes as they are (255 for -1); without
    # views the bool view's value is not view_copy's clone, which turns every byte into 0 or 1
    # (torch.func gives 1). Untraced the value keeps the bytes
    # (Note [Kernel: bool views of other bytes], case "v without views"); a graph without views
    # refuses the read (the next test).
    assert_matches_eager(_bool_view_bytes, make_inputs=_int64_bytes, remove=remove,
                         check_graph=remove == "mutations")


def test_bool_view_of_other_bytes_read_back_is_refused_in_a_graph_without_views():
    # A graph without views holds view_copy's 0 and 1 for the bool view (no functional op
    # reinterprets bytes as bool), so reading them back as uint8 would give 1 where eager gives
    # 255: refused by name (torch.func's graph gives 1). A bool view alone still traces.
    with pytest.raises(NotImplementedError, match="viewing a bool view of a tensor of another"):
        make_fx(functionalize(_bool_view_bytes, remove="mutations_and_views"))(*_int64_bytes())
    gm = make_fx(functionalize(lambda x: x.view(torch.bool) & True,
                               remove="mutations_and_views"))(*_int64_bytes())
    assert torch.equal(gm(*_int64_bytes()), _int64_bytes()[0].view(torch.bool) & True)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_write_through_a_transposed_view_as_real_reaches_the_complex_input(remove):
    # Fuzzer program 482: the write came back through view_as_complex of a value whose last
    # dimension had stride != 1 ("Tensor must have a last dimension with stride 1").
    def f(x0):
        v0 = torch.view_as_real(x0)
        v0.t_()
        v0.unsqueeze_(2)
        v0.scatter_add_(1, torch.tensor([[[0], [3]], [[3], [0]]]), torch.ones(5, 3, 3))
        return v0

    assert_matches_eager(f, torch.randn(4, dtype=torch.complex64), remove=remove)
