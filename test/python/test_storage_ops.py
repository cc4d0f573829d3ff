"""Ops that change a tensor's storage: resize_ (Note [Kernel: resize_]) and set_ (refused, Note
[Kernel: set_]), compared with eager or checked for their error.
"""

import itertools

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from reference import (
    TEST_DEVICE,
    assert_matches_eager,
)
from torch_functionalize import functionalize


def test_resize_shrink_input(remove):
    # Shrinking an input keeps its leading elements; the epilogue resizes the caller's tensor.
    def f(x):
        x.resize_(2, 3)
        x.mul_(2)
        return x + 1

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


def test_resize_grow_input_then_fill_new_elements(remove):
    # Growing an input keeps the old elements; the new ones are written before being read.
    def f(x):
        x.resize_(4, 4)
        x[2:].fill_(3.0)
        return x * 1

    assert_matches_eager(f, torch.randn(2, 4), remove=remove)


def test_resize_grow_input_then_views_and_mutations(remove):
    # After growing, views of the input (row, column) are written and read like eager.
    def f(x):
        x.resize_(3, 3)
        x[2] = torch.tensor([7.0, 8.0, 9.0])
        x[:, 1].mul_(10)
        return x.sum(0)

    assert_matches_eager(f, torch.randn(6), remove=remove)


def test_resize_input_after_mutation_then_view_write(remove):
    # An input mutated, then shrunk, then written through a flat view.
    def f(x):
        x.mul_(3)
        x.resize_(2, 2)
        x.view(-1)[1:3] = 0
        return x.t() + 0

    assert_matches_eager(f, torch.randn(3, 3), remove=remove)


def test_resize_non_contiguous_input(remove):
    # A column-major (non-view) input: shrinking resets eager's contiguous strides; resizing to
    # the same shape keeps the original strides.
    def shrink(x):
        x.resize_(2, 2)
        return x + 0

    def same(x):
        x.resize_(4, 3)
        return x + 0

    col_major = torch.empty_strided((4, 3), (1, 4)).copy_(torch.randn(4, 3))
    assert_matches_eager(shrink, col_major, remove=remove)
    assert_matches_eager(same, col_major, remove=remove)


def test_resize_intermediates_shrink_and_grow(remove):
    # resize_ on clones of the input: shrink to 5 elements, grow to 3x3 with the tail overwritten.
    def f(x):
        shrunk = x.clone()
        shrunk.resize_(5)
        grown = x.clone()
        grown.resize_(3, 3)
        grown[2:].zero_()
        return shrunk, grown

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_resize_to_zero_elements_and_resize_as(remove):
    # resize_(0) empties an input; resize_as_ reshapes another to a tensor's shape.
    def f(x, y, like):
        x.resize_(0)
        y.resize_as_(like)
        y.copy_(like)
        return x, y

    assert_matches_eager(f, torch.randn(3), torch.randn(3), torch.randn(2, 2), remove=remove)


def test_resize_int_input_grow(remove):
    # Growing an int64 input; the new row is written.
    def f(x):
        x.resize_(2, 5)
        x[1] = torch.arange(5)
        return x

    assert_matches_eager(f, torch.arange(5), remove=remove)


# Fresh values for every test that reads uninitialized-looking memory: a buffer freed by an earlier
# test with the same values could otherwise be handed out again and hide a wrong result.
_SPARE_STORAGE_SEEDS = itertools.count(1000)


def _inputs_with_spare_storage():
    """make_inputs for a 16-element tensor (not a view) whose storage holds 32 elements.

    Eager's resize_ reuses spare storage when growing, so the values past numel are
    deterministic: each call returns a new tensor with the same storage contents.
    """
    values = torch.randn(32, generator=torch.Generator(torch.get_default_device()).manual_seed(next(_SPARE_STORAGE_SEEDS)))

    def make_inputs():
        spare = values.clone()
        spare.resize_(16)
        return (spare,)

    return make_inputs


RESIZE_STORAGE_CASES = [
    ("grow_into_spare_storage", lambda x: x.resize_(32)),
    ("shrink_then_grow", lambda x: x.resize_(4).resize_(32)),
]


@pytest.mark.parametrize("name, op", RESIZE_STORAGE_CASES, ids=[c[0] for c in RESIZE_STORAGE_CASES])
def test_resize_grow_within_storage_keeps_storage_elements(name, op, remove):
    # Eager's resize_ never shrinks or reallocates a storage that is big enough, so growing shows
    # the elements already in the storage.
    def f(x):
        op(x)
        return x + 0

    assert_matches_eager(f, make_inputs=_inputs_with_spare_storage(), remove=remove)


# (id, program, expected message fragment). Each raises NotImplementedError naming aten::resize_.
RESIZE_ERROR_CASES = [
    (
        "input_grown_past_storage_with_live_view",
        lambda x: (x.view(-1), x.resize_(5, 5)),
        "views of it are alive",
    ),
    (
        "intermediate_with_live_view",
        lambda x: (lambda t: (t[0], t.resize_(20)))(x.clone()),
        "views of it are alive",
    ),
]


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x[0].resize_(10),
        lambda x: x[0].resize_(2),
        lambda x: x.view(-1).resize_(12),
        lambda x: x.clone().t().resize_(9),
    ],
    ids=["grow_view_within_storage", "shrink_view", "same_size_flat_view", "view_of_intermediate"],
)
def test_resize_of_view_within_storage_matches_eager(op, remove):
    # A view resized within its storage is a view of the storage, as in eager.
    def f(x):
        y = op(x)
        y.add_(1)
        return x + 0, y + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


def test_resize_within_storage_with_live_view_matches_eager(remove):
    # Shrinking while a view is alive only changes metadata (see Note [Kernel: resize_]): the view
    # keeps its elements, and later writes through either are seen as in eager.
    def f(x):
        flat = x.view(-1)
        x.resize_(2, 2)
        x.add_(1)
        return flat + 0, x + 0

    assert_matches_eager(f, torch.randn(4, 3), remove=remove)


@pytest.mark.parametrize(
    "name, op, message", RESIZE_ERROR_CASES, ids=[c[0] for c in RESIZE_ERROR_CASES]
)
def test_resize_unsupported_raises_not_implemented_naming_op(name, op, message, remove):
    # Unsupported resize_ raises a clear NotImplementedError naming aten::resize_; an earlier
    # mutation of the inputs is not written back.
    def f(x, y):
        y.mul_(2)
        x.add_(1)
        return op(x)

    x, y = torch.randn(3, 4), torch.randn(3)
    x_before, y_before = x.clone(), y.clone()
    with pytest.raises(NotImplementedError, match=rf"aten::resize_: .*{message}"):
        functionalize(f, remove=remove)(x, y)
    assert torch.equal(x, x_before) and x.shape == (3, 4)
    assert torch.equal(y, y_before)


SET_CASES = [
    ("source_tensor", lambda x, y: x.set_(y)),
    ("source_storage", lambda x, y: x.set_(y.untyped_storage())),
    ("source_storage_offset", lambda x, y: x.set_(y.untyped_storage(), 1, (2,), (1,))),
    ("no_source", lambda x, y: x.set_()),
    ("on_intermediate", lambda x, y: x.clone().set_(y)),
]


@pytest.mark.parametrize("name, op", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_set_raises_not_implemented_naming_op(name, op, remove):
    # Every set_ overload raises NotImplementedError naming aten::set_; inputs stay untouched.
    def f(x, y):
        x.add_(1)
        return op(x, y)

    x, y = torch.randn(3), torch.randn(4)
    x_before, y_before = x.clone(), y.clone()
    with pytest.raises(NotImplementedError, match=r"functionalize: aten::set_"):
        functionalize(f, remove=remove)(x, y)
    assert torch.equal(x, x_before) and torch.equal(y, y_before)
    assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()


# cuDNN's RNN path (LSTM/GRU/RNN modules on CUDA) checks for a flat weight buffer with
# `at::empty({0}).set_(weights[0].storage())`.
# See Note [Kernel: set_ onto a storage from outside the function]
# The same calls: a tensor made inside f set_ onto a captured parameter's storage reads that memory
# as eager does; a write through it, a set_ of an input and a set_ under a tracer are refused by
# name, and on the CPU the set_ stays refused. Per device: a CPU run checks the supported case on
# meta tensors (shapes; meta has no values), a CUDA run on CUDA tensors (values).
_SET_DEVICE = "meta" if TEST_DEVICE == "cpu" else TEST_DEVICE


def _read_through_set(parameter):
    def f(x):
        w = torch.empty(0, device=x.device).set_(parameter.untyped_storage())
        return x + w[:3] * 2, w[3:].sum()
    return f


def test_set_onto_a_captured_storage_reads_it_as_eager(remove):
    parameter, x = torch.randn(6, device=_SET_DEVICE), torch.ones(3, device=_SET_DEVICE)
    f = _read_through_set(parameter)
    expected = f(x)
    actual = functionalize(f, remove=remove)(x)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.device == e.device
        if _SET_DEVICE != "meta":
            torch.testing.assert_close(a, e)


def test_set_onto_a_captured_storage_refuses_writes_inputs_tracers_and_the_cpu(remove):
    parameter = torch.randn(6, device=_SET_DEVICE)

    def write(x):
        w = torch.empty(0, device=x.device).set_(parameter.untyped_storage())
        w.add_(1)
        return x

    def set_input(x):
        x.set_(parameter.untyped_storage())
        return x

    x = torch.ones(3, device=_SET_DEVICE)
    with pytest.raises(RuntimeError, match="add_.*does not own"):
        functionalize(write, remove=remove)(x)
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        functionalize(set_input, remove=remove)(x)
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        make_fx(functionalize(_read_through_set(parameter), remove=remove))(x)
    cpu_parameter = torch.randn(6, device="cpu")
    with pytest.raises(NotImplementedError, match="set_.source_Storage: set_ swaps"):
        functionalize(_read_through_set(cpu_parameter), remove=remove)(torch.ones(3, device="cpu"))
