"""Inputs that share storage share one alias storage inside the call (Note [Inputs: aliased
inputs]), and outputs that are inputs or views of inputs alias the caller's tensors when views are
kept (Note [Inputs: outputs that alias inputs]). Where torch.func is known to be wrong, a test says
so, against eager."""
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import assert_matches_eager, call_targets

def _base(*shape):
    # Deterministic values: make_inputs runs once for eager and once for functionalize.
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).view(shape) / 7


def _complex(n):
    return torch.complex(_base(n), _base(n).flip(0))


# (name, make_inputs): each builds a fresh base and returns arguments that alias it.
ALIASED = [
    ("x_and_flat_view", lambda: (lambda b: (b, b.view(-1)))(_base(2, 3))),
    ("x_and_tail_slice", lambda: (lambda b: (b, b[1:]))(_base(3, 2))),
    ("x_and_transpose", lambda: (lambda b: (b, b.t()))(_base(2, 3))),
    ("same_tensor_twice", lambda: (lambda b: (b, b))(_base(4))),
    ("overlapping_slices", lambda: (lambda b: (b[:4], b[2:]))(_base(6))),
    # Different dtypes over one storage share a byte base; bits written as one dtype are read as
    # the other, as in eager.
    ("float_and_int32_view", lambda: (lambda b: (b, b.view(torch.int32)))(_base(2, 3))),
    ("float64_and_float32_slice", lambda: (lambda b: (b, b.view(torch.float32)[1:5]))(
        _base(4).double())),
    ("real_view_and_complex", lambda: (lambda c: (torch.view_as_real(c), c))(_complex(3))),
    # Conjugate and negative views: the members keep their bits over the physical elements.
    ("complex_and_conj_view", lambda: (lambda c: (c, c.conj()))(_complex(3))),
    ("conj_view_and_complex", lambda: (lambda c: (c.conj(), c[1:]))(_complex(3))),
    ("x_and_neg_view", lambda: (lambda b: (b, torch._neg_view(b)))(_base(4))),
]


def write_first_read_second(x, y):
    x.add_(1)
    return y * 2


def write_second_read_first(x, y):
    y.mul_(3)
    return x + 0


@pytest.mark.parametrize("name, make_inputs", ALIASED, ids=[a[0] for a in ALIASED])
@pytest.mark.parametrize("f", [write_first_read_second, write_second_read_first])
def test_write_through_one_aliased_input_is_seen_through_the_other(name, make_inputs, f, remove):
    # Eager semantics for arguments sharing storage: outputs and both inputs (and their base).
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


@pytest.mark.parametrize("name, make_inputs", ALIASED, ids=[a[0] for a in ALIASED])
def test_torch_func_gets_aliased_inputs_wrong(name, make_inputs):
    # The hole this closes: torch.func wraps each argument separately, so y keeps its old value.
    expected = write_first_read_second(*make_inputs())
    theirs = torch.func.functionalize(write_first_read_second)(*make_inputs())
    ours = tfz.functionalize(write_first_read_second)(*make_inputs())
    torch.testing.assert_close(ours, expected)
    assert not torch.equal(theirs, expected)


def test_aliased_group_is_written_back_once_through_the_covering_input(remove):
    # x covers x[1:], so the epilogue writes the storage once, into x.
    def f(x, y):
        y.add_(1)
        x.mul_(2)
        return x.sum()

    b = _base(3, 2)
    gm = make_fx(tfz.functionalize(f, remove=remove))(b, b[1:])  # no cloning: keep the aliasing
    assert call_targets(gm).count("aten.copy_.default") == 1


def test_aliased_inputs_of_different_dtypes_raise_no_warning():
    # They used to be functionalized independently with a warning (torch.func still is); now one
    # byte base serves both.
    def f(x, y):
        x.add_(1)
        return y + 1

    b = torch.randn(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = b.clone()
        out = tfz.functionalize(f)(c, c.view(torch.int32))
    e = b.clone()
    expected = f(e, e.view(torch.int32))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(c, e)


def test_returned_input_is_the_callers_tensor_even_when_mutated():
    # `return x` gives back x itself (torch.func returns a new tensor when x was mutated).
    def f(x):
        x.add_(1)
        return x

    x = torch.zeros(3)
    assert tfz.functionalize(f)(x) is x
    assert torch.equal(x, torch.ones(3))


def test_returned_view_of_mutated_input_aliases_the_input():
    # A view of an input comes back as a real view of the caller's tensor: writes reach it.
    def f(x):
        x.add_(1)
        return x.view(-1), x[0]

    x = torch.zeros(2, 3)
    flat, row = tfz.functionalize(f)(x)
    assert flat._base is x and row._base is x
    flat.add_(5)
    assert torch.equal(x, torch.full((2, 3), 6.0))


def test_returned_views_do_not_alias_when_views_are_removed():
    # With remove="mutations_and_views" outputs are copies, as that mode's contract says.
    def f(x):
        x.add_(1)
        return x.view(-1)

    x = torch.zeros(2, 3)
    flat = tfz.functionalize(f, remove="mutations_and_views")(x)
    assert flat._base is None
    flat.add_(5)
    assert torch.equal(x, torch.ones(2, 3))


def test_returned_view_of_aliased_input_aliases_the_caller_storage():
    # Grouped inputs: a view of the second argument is a view of the caller's second argument.
    def f(x, y):
        x.add_(1)
        return y[1:]

    b = torch.zeros(4)
    out = tfz.functionalize(f)(b, b.view(-1))
    assert out.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert torch.equal(out, torch.ones(3))


@pytest.mark.parametrize(
    "name, f",
    [
        ("swapaxes_ then read", lambda x0, x1, x2: (x1.swapaxes_(1, -2), x0.tril())[1]),
        ("t_ then write", lambda x0, x1, x2: (x1.t_(), x0[0].add_(1), x2.clone())[1:]),
        ("resize_ then read", lambda x0, x1, x2: (x1.resize_(2, 3), x0 * 2)[1]),
        ("squeeze_ twice", lambda x0, x1, x2: (x0.unsqueeze_(0), x1.squeeze_(0), x0.sum(0))[2]),
    ],
)
def test_one_tensor_passed_twice(remove, name, f):
    # f(b, b, b[1:]) passes one tensor object twice; a metadata change through x1 must be seen
    # through x0, which is the same object. torch.func raises on these. See
    # Note [Inputs: one tensor passed twice].
    def make_inputs():
        b = torch.arange(16.0).reshape(4, 4)
        return b, b, b[1:]

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


@pytest.mark.parametrize(
    "name, f",
    [
        ("view, then t_", lambda x: (x.view(-1), x.t_())[0]),
        ("view, write, then swapaxes_", lambda x: (x.add_(1), x.view(-1), x.swapaxes_(0, 1))[1]),
        ("chunk, then an out= resize",
         lambda x: (x.chunk(2, 0)[0], torch.sin(x[0, :2].clone(), out=x))[0]),
        ("diagonal, then resize_ down", lambda x: (x.diagonal(), x.resize_(2))[0]),
        ("view after t_", lambda x: (x.t_(), x[0])[1]),
    ],
)
def test_views_of_an_input_whose_metadata_changed_alias_it(remove, name, f):
    # A view taken before x.t_() or an out= resize of x shares x's storage, as eager's does; it is
    # not a copy (Note [Inputs: outputs that alias inputs]).
    def make_inputs():
        return (torch.arange(12.0).reshape(3, 4),)

    eager_x, ours_x = make_inputs()[0], make_inputs()[0]
    expected = f(eager_x)
    got = tfz.functionalize(f, remove=remove)(ours_x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(ours_x, eager_x, rtol=0, atol=0)
    assert ours_x.stride() == eager_x.stride()
    if remove == "mutations":  # with views removed, outputs are copies by design
        assert got.untyped_storage().data_ptr() == ours_x.untyped_storage().data_ptr()
        assert (got.stride(), got.storage_offset()) == (expected.stride(), expected.storage_offset())
    assert_matches_eager(f, make_inputs=make_inputs, remove=remove)


def test_expanded_inputs_beside_their_whole_storage(remove):
    # x0 = b.expand(3), x1 = b.expand(3)[:2], x2 = b.view(-1): x2 is the whole storage, so after
    # x1.t_() it alone is written back (copy_ into an expanded input raises torch's overlap error).
    def f(x0, x1, x2):
        x1.t_()
        x2.mul_(x2)
        return x0 * 1, x1 * 1

    def make_inputs():
        b = torch.tensor([3.0])
        return b.expand((3,)), b.expand((3,))[:2], b.view(-1)

    assert_matches_eager(f, make_inputs=make_inputs, remove=remove, check_graph=False)
