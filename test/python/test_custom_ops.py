"""torch.library custom ops: functional ones pass through; ones that mutate arguments are
functionalized automatically through a generated companion (Note [Kernel: custom mutable ops]);
ones that return aliases of inputs are refused with a clear error."""
from typing import List, Optional

import pytest
import torch

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import (
    assert_matches_eager, call_targets, trace,
)


@torch.library.custom_op("tfz_test_custom::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, k: float) -> None:
    x.mul_(k)


@scale_.register_fake
def _(x, k):
    return None


@torch.library.custom_op("tfz_test_custom::two", mutates_args=("a", "b"))
def two(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    b.mul_(2)
    return a + b


@two.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op("tfz_test_custom::maybe_add_", mutates_args=("x",))
def maybe_add_(x: Optional[torch.Tensor], y: torch.Tensor) -> None:
    if x is not None:
        x.add_(y)


@maybe_add_.register_fake
def _(x, y):
    return None


@torch.library.custom_op("tfz_test_custom::add_all_", mutates_args=("xs",))
def add_all_(xs: List[torch.Tensor], v: float) -> None:
    for t in xs:
        t.add_(v)


@add_all_.register_fake
def _(xs, v):
    return None


def _no_custom_mutation_left(gm):
    targets = call_targets(gm)
    assert not any(t.startswith("tfz_test_custom.") for t in targets), targets


def test_mutating_custom_op_through_a_view_of_an_input(remove):
    # scale_ writes through x.view(-1): the input is updated and the graph shows the companion.
    def f(x):
        scale_(x.view(-1), 3.0)
        return x + 1

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)
    for mode in ("real", "fake"):
        gm = trace(f, torch.randn(2, 3), remove=remove, tracing_mode=mode)
        assert "tfz_functional.tfz_test_custom__scale_.default" in call_targets(gm)
        _no_custom_mutation_left(gm)


def test_custom_op_mutating_two_arguments_and_returning(remove):
    # Several written arguments plus a fresh return.
    assert_matches_eager(lambda a, b: (two(a, b), a * 1), torch.randn(3), torch.randn(3), remove=remove)


def test_same_tensor_passed_twice_as_mutated_argument(remove):
    # two(z, z) mutates one tensor twice, as in eager: (z + 1) * 2.
    def f(x):
        z = x.clone()
        out = two(z, z)
        return z, out

    assert_matches_eager(f, torch.randn(3), remove=remove)


def test_optional_mutated_argument(remove):
    # Tensor(a!)? with a tensor and with None.
    def f(x, y):
        maybe_add_(x, y)
        maybe_add_(None, y)
        return x

    assert_matches_eager(f, torch.randn(3), torch.randn(3), remove=remove)


def test_list_mutated_argument(remove):
    # Tensor(a!)[]: every element, including a view of another input, is written back.
    def f(x, y):
        add_all_([x, y[0]], 2.0)
        return x, y

    assert_matches_eager(f, torch.randn(3), torch.randn(2, 3), remove=remove)


@torch.library.custom_op("tfz_test_custom::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _(x):
    return torch.empty_like(x)


def test_functional_custom_op_passes_through(remove):
    # A custom op with no mutation is called on inner tensors and recorded as itself.
    def f(x):
        y = double(x)
        y.add_(1)
        return y

    assert_matches_eager(f, torch.randn(3), remove=remove)
    assert "tfz_test_custom.double.default" in call_targets(trace(f, torch.randn(3), remove=remove))


def test_custom_op_returning_an_alias_is_refused():
    # A custom view op cannot be replayed or inverted: clear error naming the op.
    lib = torch.library.Library("tfz_test_custom_alias", "DEF")
    lib.define("view_of(Tensor(a) x) -> Tensor(a)")
    lib.impl("view_of", lambda x: x.view(-1), "CompositeExplicitAutograd")

    x = torch.randn(2, 2)
    with pytest.raises(NotImplementedError, match=r"tfz_test_custom_alias::view_of.*alias"):
        tfz.functionalize(lambda t: torch.ops.tfz_test_custom_alias.view_of(t) + 1)(x)


_REDEFINE_SCRIPT = r"""
import gc, torch
from torch_functionalize import functionalize

# One op name, defined four times with different schemas (each Library destroyed before the
# next): kernels cached for the old schema must not be reused.
def add1(x):
    x.add_(1)

def add12(x, y):
    x.add_(1)
    y.add_(2)

def scale(x, k):
    x.mul_(k)

schemas = [
    ("bump(Tensor(a!) x) -> ()", add1),
    ("bump(Tensor(a!) x, Tensor(b!) y) -> ()", add12),
    ("bump(Tensor x) -> Tensor", lambda x: x + 3),
    ("bump(Tensor(a!) x, float k) -> ()", scale),
]
for schema, impl in schemas:
    lib = torch.library.Library("tfz_redefine_test", "DEF")
    lib.define(schema)
    lib.impl("bump", impl, "CompositeExplicitAutograd")
    op = torch.ops.tfz_redefine_test.bump
    n = schema.count("Tensor") - schema.count("-> Tensor")

    def f(x):
        y, z = x.clone(), x.clone()
        if "-> Tensor" in schema:
            return op(y)
        if "float" in schema:
            op(y, 2.5)
            return y
        op(y, z) if n == 2 else op(y)
        return y, z

    x = torch.arange(3.0)
    expected, actual = f(x.clone()), functionalize(f)(x.clone())
    torch.testing.assert_close(actual, expected)
    del lib, op
    gc.collect()
print("ok")
"""


def test_op_redefined_with_another_schema_uses_the_new_schema():
    # A subprocess: the registrations are process-wide, and a regression here was a segfault.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _REDEFINE_SCRIPT], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


VERSIONED_CALLS = {
    "one_write_in_the_body": lambda x, y: scale_(x, 2.0),
    "through_a_view": lambda x, y: scale_(x[1:], 2.0),
    "two_arguments": lambda x, y: two(x, y),
    "same_tensor_twice": lambda x, y: two(x, x),
    "list_with_a_view_of_the_other": lambda x, y: add_all_([x, y[1:]], 1.0),
}


@pytest.mark.parametrize("name", sorted(VERSIONED_CALLS))
def test_custom_op_bumps_version_counters_as_eager(name, remove):
    # Eager bumps a written argument once in the op's ADInplaceOrView kernel and once per in-place
    # op of the body (Note [Kernel: custom mutable ops]).
    call = VERSIONED_CALLS[name]

    def f(x, y):
        call(x, y)
        call(x, y)
        return x._version, y._version

    x, y = torch.randn(3), torch.randn(3)
    ex, ey = x.clone(), y.clone()
    expected = f(ex, ey)
    actual = tfz.functionalize(f, remove=remove)(x, y)
    assert actual == expected
    assert (x._version, y._version) == (ex._version, ey._version)
    assert torch.equal(x, ex) and torch.equal(y, ey)
