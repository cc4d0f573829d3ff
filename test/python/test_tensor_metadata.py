"""What a wrapper reports about itself inside the function (is_conj, is_neg, dtype, layout,
contiguity per memory format, storage offset, is_inference, efficient zero tensors) equals what
eager reports for the same tensor. See Note [Wrapper: mirrored conjugate and negative bits].
Writes through conjugate and negative views: test_conjugate_views.py.
"""

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import functionalize


def _complex(*shape):
    return torch.randn(*shape, dtype=torch.complex64)


def test_conj_view_reports_is_conj_in_mutations_mode():
    # The conjugate bit is metadata of a view: the wrapper of x.conj() carries it, and
    # resolve_conj() gives a tensor without it, as in eager.
    def f(x):
        y = x.conj()
        return y.is_conj(), y.resolve_conj().is_conj(), y.resolve_conj(), x.is_conj()

    assert_matches_eager(f, _complex(3), remove="mutations")


def test_neg_view_reports_is_neg_in_mutations_mode():
    def f(x):
        y = torch._neg_view(x)
        return y.is_neg(), y.resolve_neg().is_neg(), y.resolve_neg(), x.is_neg()

    assert_matches_eager(f, torch.randn(3), remove="mutations")


def test_conj_and_neg_bits_are_materialized_without_views():
    # remove="mutations_and_views" replaces the view by _conj_copy / _neg_view_copy, which are
    # materialized tensors without the bit: the values are eager's, the flags are the copy's
    # (what the inner tensor reports, as torch.func does).
    def f(x, y):
        c, n = x.conj(), torch._neg_view(y)
        return c.is_conj(), n.is_neg(), c + 0, n + 0

    expected = f(_complex(3), torch.randn(3))
    assert expected[:2] == (True, True)
    x, y = _complex(3), torch.randn(3)
    got = functionalize(f, remove="mutations_and_views")(x, y)
    assert got[:2] == (False, False)
    torch.testing.assert_close(got[2], x.conj())
    torch.testing.assert_close(got[3], -y)


def test_metadata_queries_match_eager(remove):
    def f(x):
        y = x.add(1)
        t = x.transpose(0, 1)
        return (
            y.dtype == x.dtype,
            y.layout,
            x.device.type,
            x.is_contiguous(memory_format=torch.channels_last),
            y.is_contiguous(memory_format=torch.channels_last),
            t.is_contiguous(),
            x[1:].storage_offset() if remove == "mutations" else 0,
            x.is_inference(),
            x.is_complex(),
        )

    assert_matches_eager(
        f,
        torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        remove=remove,
        check_graph=False,
    )


def test_conj_bits_under_inference_mode():
    # Inference mode excludes the autograd keys, so the Conjugate fallback runs on the wrapper
    # before our backend kernel; the result must still be eager's.
    def f(x):
        c = x.conj()
        return c.is_conj(), c * 2, (c @ c.t()).resolve_conj()

    with torch.inference_mode():
        assert_matches_eager(f, _complex(3, 3), remove="mutations", check_graph=False)


def _zero_tensor_ops(x):
    # Forward AD's undefined tangents are such tensors; torch's ZeroTensor kernels broadcast them
    # (expand) and give zero for 0 * inf. See Note [Kernel: efficient zero tensors].
    # torch.set_default_device does not reach _efficientzerotensor: the device is named
    z = torch._efficientzerotensor(x.shape[-1:], dtype=x.dtype, device=x.device)
    inf = torch.full_like(x, float("inf"))
    return (
        z._is_zerotensor(),
        z + x,
        x - z,
        (z * inf)._is_zerotensor(),
        (z * inf).clone(),
        torch.where(x > 0, z, x),
    )


def test_efficient_zero_tensors_match_eager(remove):
    assert_matches_eager(_zero_tensor_ops, torch.randn(3, 4), remove=remove)


def test_write_to_an_efficient_zero_tensor_is_eagers_error(remove):
    def f(x):
        z = torch._efficientzerotensor(x.shape, dtype=x.dtype)
        z.add_(x)
        return z

    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        f(torch.randn(3))
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        functionalize(f, remove=remove)(torch.randn(3))


def _lazy_bits_program(x):
    c = torch.complex(x, x)
    flags = [c.conj().is_conj(), c._neg_view().is_neg(), c.conj().resolve_conj().is_conj()]
    v = c.conj()
    v.mul_(2)  # a write through a conjugate view
    flags += [c.is_conj(), v.is_conj()]
    return c, torch.view_as_real(v.resolve_conj()), c.conj().imag, torch.tensor(flags)


def test_conj_and_neg_bits_mirrored_as_eager():
    # Wrappers report their value's lazy conjugate / negative bits (FunctionalTensorImpl.cpp):
    # is_conj / is_neg read as eager and `imag` of a conjugate view works.
    x = torch.randn(3)
    expected = _lazy_bits_program(x.clone())
    actual = functionalize(_lazy_bits_program)(x.clone())
    for a, e in zip(actual, expected):
        assert torch.equal(a.resolve_conj().resolve_neg(), e.resolve_conj().resolve_neg())


def test_conj_imag_without_views_matches_eager():
    # With views removed, conj() is _conj_copy (a materialized conjugate), as with torch.func.
    x = torch.randn(3)
    f = lambda t: torch.complex(t, t).conj().imag  # noqa: E731
    actual = functionalize(f, remove="mutations_and_views")(x)
    assert torch.equal(actual, f(x))
