"""torch.cond with operands or closure tensors that require grad, traced (Note [Control flow:
gradients]): make_fx and capture keep the forward cond and a second cond of functional gradient
branches, and the graphs replay eager's values and gradients for inputs taking either branch,
with gradients of gradients, random draws in a branch, branches that write, and nested conds."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from torch_functionalize import capture, functionalize
from torch_functionalize.testing import compare
from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_client_matches_eager, assert_functional_graph, assert_trees_match,
)


def python_if(pred, true_fn, false_fn, operands):
    # What cond means: the oracle where eager's torch.cond refuses the program (writes of
    # operands, pytorch/pytorch#147210; gradients of its gradients).
    return true_fn(*operands) if pred else false_fn(*operands)


def rewrites_intermediates(cond):
    def f(x, w):
        def true_fn(a):
            b = a.clone()
            b.mul_(2)
            b[0] = 0
            return b.sin()

        def false_fn(a):
            b = a * 1
            b.add_(1)
            return b.t().cos().t()

        out = cond((x @ w).sum() > 0, true_fn, false_fn, (x @ w,))
        return out, torch.autograd.grad(out.sum(), w)

    return f


def writes_an_operand(cond):
    def f(x, w, counter):
        def true_fn(a, n):
            n.add_(1)  # an operand without grad: it stays without grad, as eager's
            return a.sin() + n.sum()

        def false_fn(a, n):
            return a.cos()

        out = cond((x @ w).sum() > 0, true_fn, false_fn, (x @ w, counter))
        return out, torch.autograd.grad(out.sum(), w)

    return f


def writes_a_closure_from_a_differentiable_value(cond):
    def f(x, w, buf):
        def true_fn(a):
            buf.add_(a.sum(0))  # buf's new value is computed from w: it requires grad after
            return a.sin()

        def false_fn(a):
            return a.cos()

        out = cond((x @ w).sum() > 0, true_fn, false_fn, (x @ w,))
        loss = out.sum() + (buf * buf).sum()
        return out, torch.autograd.grad(loss, w)

    return f


def gradient_penalty(cond):
    def f(x, w):
        x = x.detach().requires_grad_()
        out = cond(x.sum() > 0, lambda a: (a @ w).tanh(), lambda a: (a @ w).sigmoid(), (x,))
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
        penalty = g.square().sum()
        return penalty.detach(), torch.autograd.grad(penalty, w)

    return f


def nested(cond):
    def f(x, w):
        def true_fn(a):
            return cond(a.mean() > 0.1, torch.exp, torch.abs, (a,)) * 2

        out = cond((x @ w).sum() > 0, true_fn, torch.sin, (x @ w,))
        return out, torch.autograd.grad(out.sum(), w)

    return f


def dropout_in_a_branch(cond):
    # The gradient branch reruns the forward branch: it must draw the same mask.
    def f(x, w):
        out = cond((x @ w).sum() > 0, lambda a: F.dropout(a, 0.5), lambda a: a * 2, (x @ w,))
        return out, torch.autograd.grad(out.sum(), w), torch.rand(2)

    return f


def integer_output(cond):
    def f(x, w):
        def true_fn(a):
            return a.sin(), (a > 0).sum()

        def false_fn(a):
            return a.cos(), (a < 0).sum()

        out, n = cond((x @ w).sum() > 0, true_fn, false_fn, (x @ w,))
        return out, n, torch.autograd.grad(out.sum(), w)

    return f


PROGRAMS = {
    "rewrites_intermediates": (rewrites_intermediates, 2),
    "writes_an_operand": (writes_an_operand, 3),
    "writes_a_closure_from_a_differentiable_value": (
        writes_a_closure_from_a_differentiable_value, 3),
    "gradient_penalty": (gradient_penalty, 2),
    "nested": (nested, 2),
    "dropout_in_a_branch": (dropout_in_a_branch, 2),
    "integer_output": (integer_output, 2),
}


def _inputs(count, sign):
    torch.manual_seed(0)
    inputs = (sign * torch.rand(4, 3), torch.rand(3, 2).requires_grad_(), torch.zeros(2))
    return inputs[:count]


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cond_with_gradients_replays_the_branch_run_eagerly(name, remove):
    program, count = PROGRAMS[name]
    f, oracle = program(torch.cond), program(python_if)

    def run(fn, sign):
        inputs = _inputs(count, sign)
        torch.manual_seed(1)
        return fn(*inputs), inputs

    traced_on = _inputs(count, 1.0)
    torch.manual_seed(1)
    gm = make_fx(functionalize(f, remove=remove))(*traced_on)
    torch.manual_seed(1)
    captured = capture(f, *_inputs(count, 1.0), remove=remove)
    for sub in list(gm.modules()) + list(captured.modules()):
        if isinstance(sub, torch.fx.GraphModule):
            assert_functional_graph(sub, remove)
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    assert len(conds) >= 2, gm.code  # the forward cond and its gradient's
    for sign in (1.0, -1.0):  # inputs taking either branch
        expected, e_in = run(oracle, sign)
        for label, fn in (("eager", functionalize(f, remove=remove)), ("make_fx", gm),
                          ("capture", captured)):
            actual, a_in = run(fn, sign)
            assert_trees_match(pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, actual),
                               expected, f"{label}, sign {sign}: output")
            assert_trees_match([t.detach() for t in a_in], [t.detach() for t in e_in],
                               f"{label}, sign {sign}: inputs")


def test_a_branch_that_draws_nothing_leaves_no_generator_state_in_the_graph():
    gm = make_fx(functionalize(nested(torch.cond)))(*_inputs(2, 1.0))
    assert "rng_state" not in gm.code and "set_state" not in gm.code, gm.code


def test_the_generator_state_is_set_around_the_rerun_only():
    gm = make_fx(functionalize(dropout_in_a_branch(torch.cond)))(*_inputs(2, 1.0))
    assert "get_rng_state" in gm.code, gm.code
    # Reading the state allocates a tensor: that allocation is no node of the graph.
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            assert "empty_strided" not in sub.code, sub.code


class Gated(torch.nn.Module):
    """A model choosing between two blocks with torch.cond: each block's parameters are
    closure tensors of one branch."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = (torch.nn.Linear(4, 4), torch.nn.Linear(4, 4),
                                    torch.nn.Linear(4, 1))

    def forward(self, x):
        h = torch.cond(x.mean() > 0, lambda t: F.relu(self.a(t)), lambda t: torch.tanh(self.b(t)),
                       (x,))
        return self.out(h).squeeze(-1)


def _gated_training(optimizer, **options):
    torch.manual_seed(0)
    model = Gated()

    def f(params, x, y):
        opt = getattr(torch.optim, optimizer)(list(params.values()), lr=0.1, **options)
        losses = []
        for _ in range(2):
            loss = (torch.func.functional_call(model, params, (x,)) - y).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        return losses

    def make_inputs():
        params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
        sign = 1.0 if torch.rand(()) > 0.5 else -1.0
        return params, sign * torch.rand(5, 4), torch.randn(5)

    return f, make_inputs


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("graph", ["make_fx", "capture"])
def test_graphs_give_zero_gradients_to_what_the_other_branch_reads(graph, remove):
    # torch.cond is one autograd node: every closure tensor of either branch gets a gradient,
    # zeros from the branch that does not read it, so weight decay moves it (eager's numbers).
    f, make_inputs = _gated_training("SGD", momentum=0.9, weight_decay=0.1)

    def inputs(seed):
        torch.manual_seed(seed)
        return make_inputs()

    if graph == "make_fx":
        gm = make_fx(functionalize(f, remove=remove))(*inputs(0))
    else:
        gm = capture(f, *inputs(0), remove=remove)
    assert_functional_graph(gm, remove)
    for seed in (0, 1, 2, 3):  # the model takes either branch
        e_in, r_in = inputs(seed), inputs(seed)
        assert_trees_match(gm(*r_in), f(*e_in), f"seed {seed}: losses")
        assert_trees_match({k: v.detach() for k, v in r_in[0].items()},
                           {k: v.detach() for k, v in e_in[0].items()}, f"seed {seed}: parameters")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("optimizer, options, graphs", [
    ("SGD", {}, ("make_fx", "capture")),
    ("SGD", {"momentum": 0.9, "weight_decay": 0.1}, ("make_fx", "capture")),
    # Adam reads its step count out of a tensor (make_fx refuses the read; capture guards it).
    ("Adam", {"weight_decay": 0.1}, ("capture",)),
], ids=["SGD", "SGD_momentum_weight_decay", "Adam"])
def test_training_a_model_with_cond_matches_eager(optimizer, options, graphs, remove):
    # Run eagerly too, tensors only the branch not taken reads get eager's zero gradients (a
    # version bump and a weight-decay step for each), not None.
    f, make_inputs = _gated_training(optimizer, **options)
    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=graphs)


def test_gradients_of_other_loops_are_refused_by_name_under_make_fx():
    from torch._higher_order_ops import while_loop

    def looped(x):
        return while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y.sin()),
                          (torch.tensor(0), x))[1]

    with pytest.raises(NotImplementedError, match="torch.cond, scan and map are traced with"):
        make_fx(functionalize(looped))(torch.randn(4, 3).requires_grad_())


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_inside_torch_func_grad_of_the_functionalized_function(sign, remove):
    # torch.func.grad around the layer: the search for what the other branch reads would meet
    # grad's transform, which has no rule for cond; it is skipped (grad's zeros are its own).
    def loss(w, x, cond=torch.cond):
        return cond(x.sum() > 0, lambda a: (a @ w).sin(), lambda a: (a @ w).cos(), (x,)).sum()

    w, x = torch.randn(3, 2), sign * torch.rand(4, 3)
    expected = torch.func.grad(lambda w, x: loss(w, x, python_if))(w, x)
    assert_trees_match(torch.func.grad(functionalize(loss, remove=remove))(w, x), expected,
                       "gradient")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_eager_calls_give_zero_gradients_to_a_module_s_own_parameters(sign, remove):
    # The model's parameters are tensors of the caller (not inputs of f): torch's cond lifts
    # them as operands too, and the branch not taken reads its block's as zeros.
    torch.manual_seed(0)
    model = Gated()

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    x = sign * torch.rand(5, 4)
    expected = step(x)
    grads = {k: p.grad for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    actual = functionalize(step, remove=remove)(x)
    assert_trees_match(actual, expected, "loss")
    for k, p in model.named_parameters():
        assert_trees_match(p.grad, grads[k], f"{k}.grad")


# scan (Note [Control flow: gradients], scan): the backward is a scan over the reversed steps.
def python_scan(combine, init, xs):
    carry, ys = init, []
    for i in range(xs.shape[0]):
        carry, y = combine(carry, xs[i])
        ys.append(y)
    return carry, torch.stack(ys)


def recurrent(scan_fn):
    def f(x, w, h0):
        def step(h, xt):
            a = xt @ w
            a.mul_(2)  # an intermediate written in the step
            h2 = torch.tanh(a + h)
            return h2, h2 * 2
        last, ys = scan_fn(step, h0, x)
        loss = ys.square().sum() + last.sum()
        return loss.detach(), torch.autograd.grad(loss, (w, h0))

    return f


def recurrent_penalty(scan_fn):
    # A gradient of the gradient through the scan.
    def f(x, w, h0):
        x = x.detach().requires_grad_()
        last, ys = scan_fn(lambda h, xt: (torch.sin(xt @ w + h), h.cos()), h0, x)
        g, = torch.autograd.grad(ys.sum() + last.sum(), x, create_graph=True)
        penalty = g.square().sum()
        return penalty.detach(), torch.autograd.grad(penalty, w)

    return f


SCAN_PROGRAMS = {"recurrent": recurrent, "recurrent_penalty": recurrent_penalty}


def _scan_inputs(seed):
    torch.manual_seed(seed)
    return (torch.randn(5, 2, 3), torch.randn(3, 4).requires_grad_(),
            torch.randn(2, 4).requires_grad_())


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("graph", ["make_fx", "capture"])
@pytest.mark.parametrize("name", sorted(SCAN_PROGRAMS))
def test_scan_with_gradients_replays_the_loop_run_eagerly(name, graph, remove):
    from torch._higher_order_ops import scan

    _assert_loop_replays(SCAN_PROGRAMS[name](scan), SCAN_PROGRAMS[name](python_scan),
                         _scan_inputs, torch.ops.higher_order.scan, graph, remove)


def _assert_loop_replays(f, oracle, make_inputs, operator, graph, remove):
    """f's graph keeps the loop operator twice (forward, gradient) with functional subgraphs, and
    f eagerly and its graph replayed give the oracle's values on two seeds."""
    if graph == "make_fx":
        gm = make_fx(functionalize(f, remove=remove))(*make_inputs(0))
    else:
        gm = capture(f, *make_inputs(0), remove=remove)
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            assert_functional_graph(sub, remove)
    assert sum(n.target is operator for n in gm.graph.nodes) >= 2, gm.code
    for seed in (0, 1):
        expected = oracle(*make_inputs(seed))
        assert_trees_match(functionalize(f, remove=remove)(*make_inputs(seed)), expected,
                           f"eager, seed {seed}")
        # The graph runs the operator's own loop and its gradient, whose float32 sums are ordered
        # otherwise than the oracle's Python loop: a few ulps apart (3e-6 relative, seen on an AMD
        # EPYC CPU in a gradient of a gradient), hence the looser relative tolerance.
        problem = compare(pytree.tree_map_only(torch.Tensor, torch.Tensor.detach,
                                               gm(*make_inputs(seed))),
                          expected, f"{graph}, seed {seed}", rtol=1e-5, atol=1e-5)
        assert problem is None, problem


def test_scan_gradient_of_a_step_that_draws_is_refused_by_name():
    from torch._higher_order_ops import scan

    def f(x, w):
        last, ys = scan(lambda h, xt: (h + F.dropout(xt @ w, 0.5), h.clone()), torch.zeros(2, 4), x)
        return torch.autograd.grad(ys.sum(), w)

    with pytest.raises(NotImplementedError, match="draws random numbers"):
        make_fx(functionalize(f))(torch.randn(5, 2, 3), torch.randn(3, 4).requires_grad_())


# map (Note [Control flow: gradients], map): the backward is a map over the same slices.
def python_map(body, xs, *shared):
    outs = [body(xs[i], *shared) for i in range(xs.shape[0])]
    return tuple(torch.stack(o) for o in zip(*outs))


def mapped_layer(map_fn):
    # Gradients of the slices and of the arguments every step shares, and a gradient of the
    # gradient through the map.
    def f(xs, w, b):
        def body(r, w, b):
            h = r @ w
            h.add_(b)  # an intermediate written in the body
            return h.tanh(), r.sin() * 2

        y1, y2 = map_fn(body, xs, w, b)
        loss = y1.square().sum() + y2.sum()
        gx, gw, gb = torch.autograd.grad(loss, (xs, w, b), create_graph=True)
        return loss.detach(), gx, gw, gb, torch.autograd.grad(gw.sum() + gx.sum(), w)[0]

    return f


def _map_inputs(seed):
    torch.manual_seed(seed)
    return (torch.randn(4, 3).requires_grad_(), torch.randn(3, 2).requires_grad_(),
            torch.randn(2).requires_grad_())


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("graph", ["make_fx", "capture"])
def test_map_with_gradients_replays_the_loop_run_eagerly(graph, remove):
    from torch._higher_order_ops.map import map as hop_map

    _assert_loop_replays(mapped_layer(hop_map), mapped_layer(python_map), _map_inputs,
                         torch.ops.higher_order.map_impl, graph, remove)


def test_map_gradient_of_a_body_that_draws_is_refused_by_name():
    from torch._higher_order_ops.map import map as hop_map

    def f(xs, w):
        return torch.autograd.grad(hop_map(lambda r, w: F.dropout(r @ w, 0.5), xs, w).sum(), w)

    with pytest.raises(NotImplementedError, match="map under make_fx .* draws random numbers"):
        make_fx(functionalize(f))(torch.randn(4, 3), torch.randn(3, 2).requires_grad_())


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_eager_cond_with_a_data_dependent_size_in_a_branch(sign):
    # Looking through the branches on fake operands met nonzero's size, which needs a shape
    # environment: without one every such eager call raised DynamicOutputShapeException.
    w = torch.randn(3, requires_grad=True)

    def step(x):
        out = torch.cond(x.sum() > 0, lambda a: (a[a > 0] * w[0]).sum().reshape(1),
                         lambda a: (a * w[1]).sum().reshape(1), (x,))
        out.sum().backward()
        return out.detach()

    x = sign * torch.rand(3)
    expected = step(x)
    expected_grad, w.grad = w.grad, None
    assert_trees_match(functionalize(step)(x), expected, "output")
    assert_trees_match(w.grad, expected_grad, "w.grad")
