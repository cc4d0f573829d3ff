"""Custom torch.autograd.Function subclasses called inside the functionalized function
(Note [Autograd: custom Functions]): forwards that write their arguments in place (mark_dirty,
or a buffer they do not mark), that return views, that use setup_context, kwargs,
mark_non_differentiable or set_materialize_grads; reentrant checkpointing of a closure. Each
against eager in both remove modes (values, inputs, gradients), and as make_fx and capture graphs
that hold no mutation (and no view without views) and replay on other inputs."""
import pytest
import torch
from torch.autograd.function import once_differentiable
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize import functionalize
from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, TEST_DEVICE, assert_client_matches_eager, assert_functional_graph,
    assert_trees_match,
)


class InplaceRelu(torch.autograd.Function):
    """An in-place activation as memory-saving code writes it: clamp_ and mark_dirty."""

    @staticmethod
    def forward(ctx, x):
        x.clamp_(min=0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (y > 0)


class GradReverse(torch.autograd.Function):
    """Domain-adversarial training's gradient reversal: a view forward, a negated backward."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.scale * g, None


class TrackedScale(torch.autograd.Function):
    """Writes a running statistic into a buffer argument it does not mark dirty (as hand-written
    normalization Functions do), and returns a non-differentiable count beside its result."""

    @staticmethod
    def forward(ctx, x, running, momentum=0.1):
        running.mul_(1 - momentum).add_(x.detach().mean(0), alpha=momentum)
        ctx.save_for_backward(running)
        count = torch.ones((), dtype=torch.int64, device=x.device) * x.shape[0]
        ctx.mark_non_differentiable(count)
        return x * running, count

    @staticmethod
    @once_differentiable
    def backward(ctx, g, _):
        (running,) = ctx.saved_tensors
        return g * running, None, None


class SquareWithSetupContext(torch.autograd.Function):
    """The torch.func style: forward without ctx, setup_context, materialize_grads off."""

    @staticmethod
    def forward(x, power=2):
        return x ** power

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, power = inputs
        ctx.save_for_backward(x)
        ctx.power = power
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (None if g is None else ctx.power * x ** (ctx.power - 1) * g), None


def _apply_binds_keywords():
    """Eager's answer: torch 2.11's Function.apply refuses keyword arguments, later ones bind
    them to the forward's parameters."""
    try:
        SquareWithSetupContext.apply(torch.ones(1), power=2)
    except TypeError:
        return False
    return True


_KEYWORDS = _apply_binds_keywords()


def make_inputs():
    return (torch.randn(4, 3, device=TEST_DEVICE).requires_grad_(),
            torch.randn(5, 4, device=TEST_DEVICE), torch.zeros(3, device=TEST_DEVICE))


def dirty_view_of_an_intermediate(w, x, buf):
    # A mark_dirty write through a view of an intermediate: the base sees it, as in eager.
    h = x @ w
    InplaceRelu.apply(h[1:3])
    loss = (h ** 2).sum()
    (g,) = torch.autograd.grad(loss, w)
    return h.detach(), g


def dirty_input(w, x, buf):
    # A mark_dirty write of f's own input: the caller's tensor changes, one version bump more.
    y = InplaceRelu.apply(x)
    return y is x, (y @ w).sum()


def training_steps(w, x, buf):
    opt = torch.optim.SGD([w], lr=0.1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        h = InplaceRelu.apply(x @ w)
        r = GradReverse.apply(h, 0.5)
        out, count = TrackedScale.apply(r, buf)
        square = (SquareWithSetupContext.apply(out, power=2) if _KEYWORDS
                  else SquareWithSetupContext.apply(out, 2))
        loss = square.mean()
        loss.backward()
        opt.step()
        losses += [loss.detach(), count]
    return losses


def attributes_read_from_the_node(w, x, buf):
    # What setup_context puts on ctx is read through the output's grad_fn, as torch 2.11's
    # checkpoint reads ctx.get_args from its _NoopSaveInputs node (before: AttributeError on the
    # bridge's node).
    y = SquareWithSetupContext.apply(x @ w, 3)
    node = y.grad_fn
    (saved,) = node.saved_tensors
    (g,) = torch.autograd.grad(y.sum(), w)
    return node.power * y.detach(), saved.detach(), g


CASES = {
    "attributes_read_from_the_node": attributes_read_from_the_node,
    "dirty_view_of_an_intermediate": dirty_view_of_an_intermediate,
    "dirty_input": dirty_input,
    "training_steps": training_steps,
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_custom_function_matches_eager(name, remove):
    assert_client_matches_eager(CASES[name], make_inputs, remove=remove)


class PassThrough(torch.autograd.Function):
    """Returns its argument as is (torch's BackwardHookFunction does, for module hooks)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_outputs_grad_fn_is_named_after_the_function_and_a_passed_argument_is_no_view(remove):
    # torch.nn.Module's full backward hooks find their node by its name; without views an
    # argument returned as is was autograd's view_as of it, left in the graph.
    def f(w, x):
        h = PassThrough.apply(x @ w)
        return type(h.grad_fn).__name__, torch.autograd.grad(h.sum(), w)[0]

    w, x = torch.randn(4, 3, requires_grad=True), torch.randn(5, 4)
    name, grad = functionalize(f, remove=remove)(w, x)
    assert name == f(w, x)[0] == "PassThroughBackward"
    assert_trees_match(grad, f(w, x)[1], "gradient")
    gm = make_fx(lambda w, x: functionalize(f, remove=remove)(w, x)[1])(w, x)
    assert_functional_graph(gm, remove)
    w2, x2 = torch.randn(4, 3, requires_grad=True), torch.randn(5, 4)
    assert_trees_match(gm(w2, x2), f(w2, x2)[1], "replay on other inputs")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_gradient_reversal_leaves_no_view_and_reverses(remove):
    def f(w, x):
        h = GradReverse.apply(x @ w, 1.0)
        return torch.autograd.grad(h.sum(), w)[0]

    w, x = torch.randn(4, 3, requires_grad=True), torch.randn(5, 4)
    assert_trees_match(functionalize(f, remove=remove)(w, x), f(w, x), "gradient")
    gm = make_fx(functionalize(f, remove=remove))(w, x)
    assert_functional_graph(gm, remove)
    w2, x2 = torch.randn(4, 3, requires_grad=True), torch.randn(5, 4)
    assert_trees_match(gm(w2, x2), f(w2, x2), "replay on other inputs")


def test_reentrant_checkpoint_of_a_closure_matches_eager():
    # torch.utils.checkpoint(use_reentrant=True) reruns its closure (over f's parameters) in
    # the backward; the Function's forward runs at the layer, so the closure is functionalized
    # there too (before: refused by name).
    lin = torch.nn.Linear(4, 3)

    def f(w, b, x, y):
        out = torch.utils.checkpoint.checkpoint(
            lambda a: torch.nn.functional.linear(a, w, b).relu(), x, use_reentrant=True)
        loss = ((out - y) ** 2).mean()
        loss.backward()
        return loss.detach()

    def make():
        return (lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone()
                .requires_grad_(), torch.randn(5, 4).requires_grad_(), torch.randn(5, 3))

    for remove in REMOVE_MODES:
        assert_client_matches_eager(f, make, remove=remove)


def test_save_for_forward_is_refused_by_name():
    class Jvp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_forward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    with pytest.raises(NotImplementedError, match="save_for_forward"):
        functionalize(lambda x: Jvp.apply(x))(torch.randn(3, requires_grad=True))
