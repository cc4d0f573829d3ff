"""Higher-order control-flow operators inside the functionalized function (Note [Control flow:
higher-order operators]): torch.cond, while_loop, scan, map and associative_scan run eagerly on
the wrappers, whatever their branches mutate; under a tracer they are refused by name."""
import pytest
import torch
from torch._higher_order_ops import associative_scan, scan, while_loop
from torch._higher_order_ops.map import map as hop_map
from torch.fx.experimental.proxy_tensor import make_fx

from reference import REMOVE_MODES, assert_trees_match
from torch_functionalize import capture, functionalize


def cond_writing_intermediates_closures_and_operands(x, y):
    buf = torch.zeros(3)

    def true_fn(a, b):
        buf.add_(a)          # a closure tensor
        c = a.clone()
        c.mul_(2)            # an intermediate
        b.add_(1)            # the operator's own operand (torch refuses this one)
        return c + b

    def false_fn(a, b):
        return a - b

    return torch.cond(x.sum() > 0, true_fn, false_fn, (x, y)), buf


def reference_branch(x, y):
    # What cond means, with a Python if: the oracle where eager's torch.cond refuses the program.
    buf = torch.zeros(3)
    if x.sum() > 0:
        buf.add_(x)
        c = x.clone()
        c.mul_(2)
        y.add_(1)
        return c + y, buf
    return x - y, buf


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_branches_that_write_match_the_branch_run_eagerly(sign, remove):
    make = lambda: (sign * torch.ones(3), torch.arange(3.0))  # noqa: E731
    e_in, a_in = make(), make()
    expected = reference_branch(*e_in)
    actual = functionalize(cond_writing_intermediates_closures_and_operands, remove=remove)(*a_in)
    assert_trees_match(actual, expected, "output")
    assert_trees_match(a_in, e_in, "inputs")


def cond_with_functional_branches(x, w):
    h = x @ w
    out = torch.cond(h.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (h,))
    return out, torch.autograd.grad(out.sum(), w)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_cond_of_functional_branches_matches_eager_with_gradients(remove):
    make = lambda: (torch.randn(4, 3), torch.randn(3, 2).requires_grad_())  # noqa: E731
    torch.manual_seed(0)
    e_in = make()
    torch.manual_seed(0)
    a_in = make()
    assert_trees_match(functionalize(cond_with_functional_branches, remove=remove)(*a_in),
                       cond_with_functional_branches(*e_in), "output")


def loop(x):
    def cond_fn(i, a):
        return i < 3

    def body_fn(i, a):
        b = a.clone()
        b.add_(i)            # an intermediate written in the body
        return i + 1, b

    return while_loop(cond_fn, body_fn, (torch.tensor(0), x))


def cumulative(xs):
    def combine(carry, x):
        nxt = carry + x
        out = nxt.clone()
        out.mul_(2)
        return nxt, out

    return scan(combine, torch.zeros(3), xs)


def mapped(xs, y):
    def body(x, y):
        z = x.clone()
        z.add_(y)
        return z

    return hop_map(body, xs, y)


def prefix_sums(xs):
    return associative_scan(lambda a, b: a + b, xs, dim=0, combine_mode="generic")


EAGER_PROGRAMS = {
    "while_loop": (loop, lambda: (torch.ones(3),)),
    "scan": (cumulative, lambda: (torch.randn(4, 3),)),
    "map": (mapped, lambda: (torch.randn(4, 3), torch.randn(3))),
    "associative_scan": (prefix_sums, lambda: (torch.randn(5, 3),)),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(EAGER_PROGRAMS))
def test_loop_operators_match_eager(name, remove):
    f, make = EAGER_PROGRAMS[name]
    torch.manual_seed(0)
    e_in = make()
    torch.manual_seed(0)
    a_in = make()
    assert_trees_match(functionalize(f, remove=remove)(*a_in), f(*e_in), "output")
    assert_trees_match(a_in, e_in, "inputs")


@pytest.mark.parametrize("tracer", ["make_fx", "capture"])
def test_control_flow_under_a_tracer_is_refused_by_name(tracer):
    # A graph that inlined the taken branch would be wrong for inputs that take the other.
    f = cond_with_functional_branches
    args = (torch.randn(4, 3), torch.randn(3, 2).requires_grad_())
    with pytest.raises(NotImplementedError, match="cond .*higher-order operator.* under a tracer"):
        if tracer == "make_fx":
            make_fx(functionalize(f))(*args)
        else:
            capture(f, *args)


def test_torch_cond_outside_functionalize_is_torch_s_own():
    # The eager entry is ours only while a layer runs user code on the thread.
    out = torch.cond(torch.tensor(True), lambda a: a + 1, lambda a: a - 1, (torch.ones(2),))
    assert_trees_match(out, torch.full((2,), 2.0), "output")
