"""Writes whose operands share memory with the written tensor, compared with eager: elementwise
ops may read the memory they write, as in eager; other ops, and partial overlaps whose result
depends on the order of eager's loop, are refused by name (Note [Kernel: writes that read their
own memory]); interleaved slices share no element and are not overlaps; and copy_ between the same
elements is a no-op, as eager's copy_ is. Writes through views whose own elements overlap:
test_exotic_views.py."""

import pytest
import torch

from torch_functionalize.testing._internal.reference import assert_matches_eager
from torch_functionalize import functionalize


@pytest.mark.parametrize(
    "name, f, make",
    [
        ("masked_scatter_ from itself", lambda x: x.masked_scatter_(x > 0, x),
         lambda: torch.randn(3, 2, 5).view(-1)),
        ("amax out= its input", lambda x: torch.amax(x, 0, out=x),
         lambda: torch.randint(-4, 5, (), dtype=torch.int64)),
        ("matmul out= an operand", lambda x: torch.matmul(x, torch.ones(1, 3), out=x),
         lambda: torch.randn(5, 1)),
        ("index_add_ of a view of itself", lambda x: x.index_add_(0, torch.tensor([0, 1]), x[1:3]),
         lambda: torch.randn(4, 2)),
        # An empty out= that is its own input, grown by the resize before the reduction reads it
        # (eager reads the memory it has just allocated).
        ("mean out= itself, empty", lambda x: torch.mean(x, 0, keepdim=True, out=x),
         lambda: torch.randn(0)),
        ("mean out= itself, empty complex view", lambda x: torch.mean(x, 0, keepdim=True, out=x),
         lambda: torch.randn(1, 3, dtype=torch.complex64)[1:, ::2]),
    ],
)
def test_write_that_reads_its_own_memory_is_refused(remove, name, f, make):
    # Eager's numbers depend on the kernel's read/write order; before, the functional result was
    # returned silently. See Note [Kernel: writes that read their own memory].
    with pytest.raises(NotImplementedError, match=r"functionalize: aten::\w+.*shares memory with"):
        functionalize(f, remove=remove)(make())


def test_elementwise_writes_may_read_the_written_memory(remove):
    def f(x):
        x.mul_(x)
        x.addcdiv_(x, x + 1, value=0.5)
        x.copy_(x)
        torch.add(x, x, out=x)
        x[1:].masked_fill_(x[1:] > 1, 0.0)
        torch.where(x > 0, x, -x, out=x)
        return x

    assert_matches_eager(f, torch.randn(6), remove=remove)


def test_elementwise_write_with_a_partial_overlap_is_refused(remove):
    # v[0::2] += diagonal reads elements an earlier step of eager's loop wrote (eager's own overlap
    # check cannot decide for strided operands), so the functional numbers would differ from
    # eager's: refused by name.
    def f(x):
        v = x.roll(1)
        v[0::2] += v.diagonal(0, 0, 1)
        return v

    with pytest.raises(NotImplementedError, match=r"aten::add_.Tensor: 'other' shares memory with 'self'"):
        functionalize(f, remove=remove)(torch.randn(3, 2))


def test_interleaved_slices_do_not_share_memory(remove):
    # Disjoint elements inside overlapping byte ranges: allowed for every op, elementwise or not
    # (the check compares elements, not extents).
    def f(x):
        x[0::2].add_(x[1::2])
        torch.mm(x[1::2], torch.ones(3, 3), out=x[0::2])
        torch.amax(x[:, 1::2], 1, keepdim=True, out=x[:, 0:1])
        return x

    assert_matches_eager(f, torch.randn(6, 3), remove=remove)


def test_copy_of_a_tensor_into_itself_changes_nothing(remove):
    # Eager's copy_ returns at once when src is self, and so does ours: a functional copy of a bool
    # view of float bytes (v.view(torch.bool).copy_ of itself) would turn them into 0/1.
    def f(x):
        v = x.view(torch.bool)
        v.copy_(v)
        x.copy_(x)
        return x * 1

    assert_matches_eager(f, make_inputs=lambda: (torch.tensor([-0.5, 1.25, 3.0]),), remove=remove)


def test_copy_between_two_views_of_the_same_elements_is_a_no_op(remove):
    # v3 = v2.transpose(0, 0) views exactly v2's elements, and eager's copy_ returns at once for
    # such a pair (same storage, offset, sizes, strides, dtype and bits), as ours does: running the
    # copy, whose bool conversion turns every byte of the int64 input into 0 or 1, would differ.
    def f(x1):
        v2 = x1.view(torch.bool)
        v3 = v2.transpose(0, 0)
        v3.copy_(v2)
        return x1 + 0

    def make_inputs():
        return (torch.tensor([-1, -4, 3, 258], dtype=torch.int64),)

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


def test_copy_into_a_conj_view_of_its_source_writes(remove):
    # v = x.conj() views x's elements with the conjugate bit, so eager's v.copy_(x) writes conj(x)
    # into x: it is not a copy between the same elements, which is a no-op. Without views the
    # wrappers' bits are their resolved values' (both clear), so the bits come from the chains' bit
    # steps too.
    def f(x0, x1):
        v0 = x0.conj()
        v0.copy_(x0)
        return v0 + 0

    def make_inputs():
        torch.manual_seed(0)
        b = torch.randn(4, 2, dtype=torch.complex64)
        return b.select(0, 1), b.select(0, 1)[1:]

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)
    assert_matches_eager(lambda x: (x.conj().copy_(x), x + 0)[1],
                         torch.randn(3, dtype=torch.complex64), remove=remove)


def test_write_to_an_empty_tensor_with_overlapping_strides_is_allowed(remove):
    # No element, no overlap: eager writes nothing and raises nothing, whatever the strides of the
    # other dimensions say (core/MemoryOverlap.h, may_self_overlap).
    def f(x):
        v = x.as_strided((0, 3, 2), (1, 1, 0))
        v.add_(1)
        return x + 0

    assert_matches_eager(f, torch.arange(6.0), remove=remove)


def test_copy_between_sibling_views_after_a_write_of_one_is_a_copy(remove):
    # v1.tril_(1) leaves v1 reporting its new value's geometry until it syncs; the copy_ row took
    # v1.copy_(v0) of two chunks for a copy onto itself (same offset 0, sizes and strides) and
    # dropped it under make_fx (fuzzer program 766387). The wrappers are synced before comparing.
    def f(x):
        v0, v1 = x.chunk(4, 1)[:2]
        v1.tril_(1)
        v1.copy_(v0)
        return v0 * 1, v1 * 1

    assert_matches_eager(f, make_inputs=lambda: (torch.arange(12.0).view(4, 3)[:, 1:],),
                         remove=remove)
