"""In-place `_foreach_*_` ops, including lists that alias each other (Note [Kernel: _foreach_ ops
on aliased lists]), compared with eager in both remove modes.
"""

import pytest
import torch

from torch_functionalize.testing._internal.reference import (
    assert_foreach_on_aliased_lists_matches_eager,
    assert_functional_graph,
    assert_matches_eager,
    call_targets,
    trace,
)


def _three():
    return [torch.randn(3), torch.randn(2, 2), torch.randn(())]


# (id, in-place foreach program on lists xs, ys, zs of three tensors each)
FOREACH_CASES = [
    ("add_list", lambda xs, ys, zs: torch._foreach_add_(xs, ys)),
    ("add_list_alpha", lambda xs, ys, zs: torch._foreach_add_(xs, ys, alpha=-2)),
    ("add_scalar", lambda xs, ys, zs: torch._foreach_add_(xs, 1.5)),
    ("add_scalarlist", lambda xs, ys, zs: torch._foreach_add_(xs, [1.0, 2.0, 3.0])),
    ("sub_list_alpha", lambda xs, ys, zs: torch._foreach_sub_(xs, ys, alpha=2)),
    ("mul_scalar", lambda xs, ys, zs: torch._foreach_mul_(xs, 2.0)),
    ("mul_tensor_scalar", lambda xs, ys, zs: torch._foreach_mul_(xs, torch.tensor(0.5))),
    ("mul_list", lambda xs, ys, zs: torch._foreach_mul_(xs, ys)),
    ("div_list", lambda xs, ys, zs: torch._foreach_div_(xs, [z.abs() + 1 for z in zs])),
    ("addcmul_value", lambda xs, ys, zs: torch._foreach_addcmul_(xs, ys, zs, value=0.5)),
    (
        "addcmul_scalars_tensor",
        # eager takes the scalars tensor on the CPU only, whatever the lists' device
        lambda xs, ys, zs: torch._foreach_addcmul_(
            xs, ys, zs, torch.tensor([0.1, 0.2, 0.3], device="cpu")),
    ),
    (
        "addcdiv_value",
        lambda xs, ys, zs: torch._foreach_addcdiv_(xs, ys, [z.abs() + 1 for z in zs], value=0.3),
    ),
    ("lerp_scalar", lambda xs, ys, zs: torch._foreach_lerp_(xs, ys, 0.3)),
    ("lerp_list", lambda xs, ys, zs: torch._foreach_lerp_(xs, ys, zs)),
    ("zero", lambda xs, ys, zs: torch._foreach_zero_(xs)),
    ("copy", lambda xs, ys, zs: torch._foreach_copy_(xs, ys)),
    ("neg", lambda xs, ys, zs: torch._foreach_neg_(xs)),
    ("exp", lambda xs, ys, zs: torch._foreach_exp_(xs)),
    ("abs_then_sqrt", lambda xs, ys, zs: (torch._foreach_abs_(xs), torch._foreach_sqrt_(xs))),
    ("pow_scalar", lambda xs, ys, zs: torch._foreach_pow_(xs, 2)),
    ("maximum_list", lambda xs, ys, zs: torch._foreach_maximum_(xs, ys)),
    ("clamp_min_scalar", lambda xs, ys, zs: torch._foreach_clamp_min_(xs, 0.1)),
]
FOREACH_IDS = [c[0] for c in FOREACH_CASES]


@pytest.mark.parametrize("name, op", FOREACH_CASES, ids=FOREACH_IDS)
def test_foreach_inplace_on_input_lists_matches_eager(name, op, remove):
    # A _foreach_*_ op on a list of inputs writes every element back like eager.
    def f(xs, ys, zs):
        op(xs, ys, zs)
        return [x * 1 for x in xs]

    assert_matches_eager(f, _three(), _three(), _three(), remove=remove)


@pytest.mark.parametrize("name, op", FOREACH_CASES, ids=FOREACH_IDS)
def test_foreach_inplace_on_intermediates_leaves_inputs(name, op, remove):
    # The same op on fresh intermediates: the results are right and no input changes.
    def f(xs, ys, zs):
        tmp = [x * 2 for x in xs]
        op(tmp, ys, zs)
        return tmp

    assert_matches_eager(f, _three(), _three(), _three(), remove=remove)


def test_foreach_chain_of_optimizer_like_updates(remove):
    # A chain of foreach updates (add_, mul_, addcmul_, lerp_, zero_) across two lists.
    def f(xs, ys):
        torch._foreach_add_(xs, ys)
        torch._foreach_mul_(xs, 2.0)
        torch._foreach_addcmul_(xs, ys, ys, value=0.5)
        torch._foreach_lerp_(xs, ys, 0.3)
        torch._foreach_zero_(ys)
        return torch._foreach_norm(xs)

    assert_matches_eager(f, _three(), _three(), remove=remove)


def test_foreach_inplace_on_disjoint_views_of_one_input(remove):
    # List elements are disjoint views (rows, a strided column) of one input; all writes land.
    def f(x, ys):
        torch._foreach_add_([x[0], x[1, 1:], x[2:, 0]], ys)
        torch._foreach_mul_([x[0], x[1, 1:]], 3.0)
        return x

    ys = [torch.randn(4), torch.randn(3), torch.randn(2)]
    assert_matches_eager(f, torch.randn(4, 4), ys, remove=remove)


def test_foreach_inplace_mixed_dtypes_in_list(remove):
    # Lists mixing float32, float64 and int64 tensors.
    def f(xs, ys):
        torch._foreach_add_(xs, ys)
        return xs

    def lists():
        return [torch.randn(3), torch.randn(2, dtype=torch.float64), torch.arange(3)]

    assert_matches_eager(f, lists(), lists(), remove=remove)


def test_foreach_graph_has_functional_foreach_ops_only(remove):
    # The graph records the out-of-place _foreach_add/_foreach_mul and one copy_ per input element.
    def f(xs, ys):
        torch._foreach_add_(xs, ys)
        torch._foreach_mul_(xs, 2.0)
        return xs[0] + 0

    gm = trace(f, _three(), _three(), remove=remove)
    assert_functional_graph(gm, remove)
    ops = call_targets(gm)
    assert "aten._foreach_add.List" in ops and "aten._foreach_mul.Scalar" in ops
    assert not any(op.startswith(("aten._foreach_add_", "aten._foreach_mul_")) for op in ops)
    assert ops.count("aten.copy_.default") == 3


# Lists that alias each other: eager's CPU kernel applies the elements in order, so a later
# element reads what an earlier one wrote (Note [Kernel: _foreach_ ops on aliased lists]).
_FOREACH_ALIASED = {
    # x += y, then y += (updated) x
    "operand_is_earlier_self": lambda x, y: torch._foreach_add_([x, y], [y, x]),
    # the same tensor twice in self: written twice
    "self_twice": lambda x, y: torch._foreach_mul_([x, y, x], 2.0),
    # a view of an earlier element later in self
    "self_view_of_earlier": lambda x, y: torch._foreach_add_([x, x[1:]], [y, y[1:]]),
    # a tensor scalar sharing storage with a written element (eager refuses overlapping ones)
    "tensor_scalar_of_self_base": lambda x, y: torch._foreach_mul_([x[:1], y], x[1]),
    # per-element scalars tensor, with aliasing lists
    "addcmul_scalars_tensor": lambda x, y: torch._foreach_addcmul_(
        [x, y], [y, x], [x, y], torch.tensor([0.5, 2.0], device="cpu")
    ),
    "lerp_list": lambda x, y: torch._foreach_lerp_([x, y], [y, x], 0.25),
    "scalar_list": lambda x, y: (
        torch._foreach_add_([x, y, x], [1.0, 2.0, 3.0]) or torch._foreach_sub_([y, x], [x, y])
    ),
}


@pytest.mark.parametrize("name", sorted(_FOREACH_ALIASED))
def test_foreach_inplace_on_aliased_lists_matches_eager(name, remove):
    op = _FOREACH_ALIASED[name]

    def on_inputs(x, y):
        op(x, y)
        return x + 0, y + 0

    def on_intermediates(x, y):
        a, b = x * 1, y * 1
        op(a, b)
        return a, b

    assert_foreach_on_aliased_lists_matches_eager(on_inputs, torch.randn(3), torch.randn(3),
                                                  remove=remove)
    assert_foreach_on_aliased_lists_matches_eager(on_intermediates, torch.randn(3),
                                                  torch.randn(3), remove=remove)


def test_foreach_inplace_on_unaliased_lists_stays_one_op(remove):
    # Splitting is only for aliased lists: the usual optimizer case keeps one foreach node.
    def f(xs, ys):
        torch._foreach_add_(xs, ys)
        return xs[0] + 0

    gm = trace(f, _three(), _three(), remove=remove)
    assert call_targets(gm).count("aten._foreach_add.List") == 1


@pytest.mark.parametrize(
    "program",
    [
        lambda a, b: (lambda x, y: (torch._foreach_add_([x, y], [y, x]), x, y)[1:])(
            a.clone(), b.clone()
        ),
        lambda a, b: (lambda x: (torch._foreach_mul_([x, x], 2.0), x)[1])(a.clone()),
        lambda a, b: (
            lambda x, y: (torch._foreach_addcmul_([x, y], [y, x], [x, y], 0.5), x, y)[1:]
        )(a.clone(), b.clone()),
        lambda a, b: (lambda x, y, v: (torch._foreach_sub_([x, y], 1.0), v.clone())[1])(
            *(lambda x: (x, b.clone(), x[0]))(a.clone())
        ),
    ],
    ids=["cross_aliased", "same_twice", "addcmul_aliased", "live_view"],
)
def test_foreach_on_fresh_values_matches_eager(program, remove):
    # Fresh intermediates take the in-place path (Note [Kernel: in-place on the inner value])
    # unless a view of them is alive; aliased lists must still give eager's sequential answer.
    assert_foreach_on_aliased_lists_matches_eager(program, torch.randn(3), torch.randn(3),
                                                  remove=remove)


def test_foreach_reads_another_position_of_the_written_list(remove):
    # _foreach_add_([a, b], [b, a]): eager updates a, then adds the new a to b; see
    # Note [Kernel: _foreach_ ops on aliased lists]. The same position may alias.
    def f(a, b):
        torch._foreach_add_([a, b], [b, a])
        torch._foreach_mul_([a, b], [a, b])
        return a, b

    assert_foreach_on_aliased_lists_matches_eager(f, torch.randn(3), torch.randn(3), remove=remove)
