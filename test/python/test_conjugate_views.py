"""Conjugate and negative views (x.conj(), x._neg_view(), x.adjoint()) under functionalize: writes
through them reach their bases, and resizes, splits and copies of them keep or resolve the bits as
eager does. See Note [Wrapper: mirrored conjugate and negative bits]. What a wrapper reports about
its bits: test_tensor_metadata.py."""

import pytest
import torch

from reference import assert_matches_eager
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
