"""Random in-place ops and dropout under functionalize: the same random stream as eager, compared
with eager in both remove modes.
"""

import pytest
import torch
import torch.nn.functional as F

from reference import (
    assert_functional_graph,
    assert_matches_eager,
    assert_trees_match,
    call_targets,
    trace,
)
from torch_functionalize import functionalize


# (id, in-place random op on a float32 tensor t). Each case draws from the global generator.
RANDOM_CASES = [
    ("uniform_", lambda t: t.uniform_(-2, 2)),
    ("normal_", lambda t: t.normal_(1.0, 3.0)),
    ("bernoulli_float", lambda t: t.bernoulli_(0.4)),
    ("bernoulli_tensor_p", lambda t: t.bernoulli_(torch.linspace(0, 1, t.shape[-1]))),
    ("exponential_", lambda t: t.exponential_(2.0)),
    ("random_to", lambda t: t.random_(7)),
    ("random_full_range", lambda t: t.random_()),
    ("cauchy_", lambda t: t.cauchy_()),
    ("log_normal_", lambda t: t.log_normal_()),
    ("geometric_", lambda t: t.geometric_(0.3)),
]
RANDOM_IDS = [c[0] for c in RANDOM_CASES]


@pytest.mark.parametrize("name, op", RANDOM_CASES, ids=RANDOM_IDS)
def test_random_inplace_op_on_input_same_values_under_seed(name, op, remove):
    # With torch.manual_seed inside f, the op draws eager's numbers into the input.
    def f(x):
        torch.manual_seed(5)
        op(x)
        return x * 1

    assert_matches_eager(f, torch.randn(4, 5), remove=remove)


@pytest.mark.parametrize("name, op", RANDOM_CASES, ids=RANDOM_IDS)
def test_random_inplace_op_on_view_and_intermediate(name, op, remove):
    # The op fills a row view of the input and a fresh intermediate, in eager's order.
    def f(x):
        torch.manual_seed(9)
        op(x[1])
        fresh = op(torch.empty(2, 5))
        return x, fresh

    assert_matches_eager(f, torch.randn(3, 5), remove=remove)


def test_random_int_range_matches_eager(remove):
    # random_(from, to) on an int64 input. No graph check: torch's FX codegen cannot print the
    # aten.random.from overload (`from` is a Python keyword), with or without functionalize.
    def f(x):
        torch.manual_seed(2)
        x.random_(-3, 10)
        return x + 0

    assert_matches_eager(f, torch.zeros(6, dtype=torch.int64), remove=remove, check_graph=False)


def test_random_inplace_with_explicit_generator(remove):
    # An explicit torch.Generator passed to the ops gives eager's numbers too.
    def f(x):
        gen = torch.Generator().manual_seed(3)
        x.normal_(generator=gen)
        u = torch.empty(3).uniform_(generator=gen)
        b = torch.empty(3).bernoulli_(0.5, generator=gen)
        return u, b

    assert_matches_eager(f, torch.randn(4), remove=remove)


def test_random_ops_seeded_before_each_run_match_eager_and_rng_state(remove):
    # Seeding the global generator before each run (not inside f): same values as eager, and the
    # generator ends in eager's state (the same number of draws was made).
    def f(x):
        x.normal_()
        u = torch.empty(3).uniform_()
        return u, F.dropout(x, 0.5, training=True)

    x = torch.randn(4)
    eager_x, func_x = x.clone(), x.clone()
    torch.manual_seed(11)
    expected = f(eager_x)
    eager_state = torch.get_rng_state()
    torch.manual_seed(11)
    actual = functionalize(f, remove=remove)(func_x)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(func_x, eager_x, "input")
    assert torch.equal(torch.get_rng_state(), eager_state)


def test_random_inplace_graph_uses_functional_variants(remove):
    # uniform_/normal_/bernoulli_ become uniform/normal_functional/bernoulli ops plus a copy_.
    def f(x):
        x.uniform_()
        x.mul_(torch.empty(3).normal_())
        return torch.empty(3).bernoulli_(0.5)

    gm = trace(f, torch.randn(3), remove=remove)
    assert_functional_graph(gm, remove)
    ops = call_targets(gm)
    assert not any(
        op.startswith(("aten.uniform_", "aten.normal_.", "aten.bernoulli_")) for op in ops
    )
    assert "aten.uniform.default" in ops


def test_dropout_functional_training_mode(remove):
    # F.dropout(training=True) on an input gives eager's mask under the same seed.
    def f(x):
        torch.manual_seed(1)
        return F.dropout(x, 0.3, training=True), F.dropout(x, 0.6, training=True)

    assert_matches_eager(f, torch.randn(6, 6), remove=remove)


def test_dropout_module_train_and_eval(remove):
    # nn.Dropout in train mode draws eager's mask; in eval mode it is the identity.
    def f(x):
        torch.manual_seed(1)
        return torch.nn.Dropout(0.5).train()(x), torch.nn.Dropout(0.5).eval()(x)

    assert_matches_eager(f, torch.randn(6, 6), remove=remove)


def test_dropout_inplace_module_on_intermediate_and_view(remove):
    # nn.Dropout(inplace=True) on an intermediate, and F.dropout(inplace=True) on a view of the
    # input; dropout2d and alpha dropout too.
    def f(x):
        torch.manual_seed(4)
        h = x * 2
        torch.nn.Dropout(0.4, inplace=True).train()(h)
        F.dropout(x[1:], 0.5, training=True, inplace=True)
        d2 = F.dropout2d(x.view(1, 2, 2, 4), 0.5, training=True)
        a = F.alpha_dropout(x, 0.2, training=True)
        return h, x, d2, a

    assert_matches_eager(f, torch.randn(4, 4), remove=remove)
