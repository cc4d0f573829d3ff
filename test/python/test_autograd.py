"""Autograd inside and around functionalized functions (issue #13, item 2): torch.autograd.grad
inside f, requires_grad / grad_fn / is_leaf as in eager, gradients through outputs, detach in both
remove modes, and make_fx(functionalize(joint)) as one functional joint graph. Eager is the oracle;
torch.func.functionalize's behaviour is recorded where it differs. See Note [Wrapper: autograd
mirrored].
"""


import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_call_and_graphs_match_eager, assert_functional_graph, assert_trees_match,
)
import torch_functionalize
from torch_functionalize import functionalize


def _w():
    return torch.randn(3, generator=torch.Generator(torch.get_default_device()).manual_seed(0)).requires_grad_()


def _both(f, make_inputs, remove):
    """(eager result, functionalized result) of f on fresh inputs."""
    return f(*make_inputs()), functionalize(f, remove=remove)(*make_inputs())


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_autograd_grad_inside_wrt_captured_parameter(remove):
    w = _w()

    def f(x):
        y = x.clone()
        y.mul_(w)
        return torch.autograd.grad(y.sin().sum(), w)[0]

    expected, actual = _both(f, lambda: (torch.linspace(0, 1, 3),), remove)
    assert_trees_match(actual, expected, "gradient")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_autograd_grad_inside_wrt_input(remove):
    def f(x):
        y = x.view(-1)[1:] * 2
        y.add_(1)
        g = torch.autograd.grad(y.pow(2).sum(), x, create_graph=False)[0]
        return g

    make = lambda: (torch.linspace(0, 1, 4).requires_grad_(),)  # noqa: E731
    expected, actual = _both(f, make, remove)
    assert_trees_match(actual, expected, "gradient")


def test_torch_func_functionalize_has_no_graph_for_autograd_grad():
    # Recorded beside ours: torch.func's wrappers drop requires_grad.
    w = _w()

    def f(x):
        return torch.autograd.grad((x * w).sum(), w)[0]

    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.func.functionalize(f)(torch.ones(3))


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_requires_grad_grad_fn_and_is_leaf_inside_match_eager(remove):
    w = _w()

    def f(x, leaf):
        y = x * w
        z = y.detach()
        t = leaf.clone()
        t.add_(1)
        seen = []
        for v in (x, leaf, y, z, t):
            name = type(v.grad_fn).__name__ if v.grad_fn is not None else None
            seen.append((v.requires_grad, v.is_leaf, name))
        return torch.tensor([float(i) for s in seen for i in s[:2]]), [s[2] for s in seen]

    make = lambda: (torch.ones(3), torch.ones(3, requires_grad=True))  # noqa: E731
    expected, actual = _both(f, make, remove)
    assert actual[1][:3] == expected[1][:3]
    assert_trees_match(actual[0], expected[0], "requires_grad / is_leaf")
    # The functional value of an in-place result has the functional op's node (AddBackward0
    # either way here).
    assert actual[1][4] == expected[1][4]


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_outputs_requires_grad_and_gradients_through_them(remove):
    w = _w()

    def f(x):
        y = x.clone()
        y.mul_(w)
        return y.sum(), y

    x = torch.ones(3)
    expected = f(x.clone())
    actual = functionalize(f, remove=remove)(x.clone())
    for a, e in zip(actual, expected):
        assert a.requires_grad == e.requires_grad
        assert type(a.grad_fn).__name__ != "NoneType"
    (g_expected,) = torch.autograd.grad(expected[0], w)
    (g_actual,) = torch.autograd.grad(actual[0], w)
    assert_trees_match(g_actual, g_expected, "gradient through output")


def _grads(tensors):
    return [None if t.grad is None else t.grad.detach().clone() for t in tensors]


# Gradients through inputs that f mutates (Note [Kernel: writes to inputs under autograd]): the
# write's functional op must not save the caller's tensor, which the epilogue overwrites.
MUTATED_INPUT_PROGRAMS = {
    # Each op's backward reads self's old value.
    "mul_": lambda x, w: x.mul_(w),  # unboxed in-place kernel
    "div_": lambda x, w: x.div_(w),  # unboxed
    "atan2_": lambda x, w: x.atan2_(w),  # boxed kernel
    "through_a_view": lambda x, w: x[1:].mul_(w[1:]),
    "twice": lambda x, w: x.mul_(w).mul_(w),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(MUTATED_INPUT_PROGRAMS))
def test_gradient_through_mutated_input(name, remove):
    body = MUTATED_INPUT_PROGRAMS[name]

    def f(x):
        body(x, w)
        return x.exp().sum()

    results = []
    for run in (f, functionalize(f, remove=remove)):
        w = _w()
        x = torch.linspace(0.5, 1.5, 3)
        out = run(x)
        (g_out,) = torch.autograd.grad(out, w, retain_graph=True)
        (g_input,) = torch.autograd.grad(x.pow(2).sum(), w)
        results.append((out.detach(), g_out, g_input, x.detach().clone(), x.requires_grad))
    assert_trees_match(results[1][:4], results[0][:4], "outputs, gradients and mutated input")
    assert results[1][4] == results[0][4]


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_gradient_through_mutated_non_leaf_input(remove):
    # The input has history of its own: gradients reach both its leaf and w.
    def f(x):
        x.mul_(w)

    results = []
    for run in (f, functionalize(f, remove=remove)):
        w = _w()
        a = torch.linspace(0.5, 1.5, 3).requires_grad_()
        x = a * 2
        run(x)
        results.append(torch.autograd.grad(x.sin().sum(), (a, w)))
    assert_trees_match(list(results[1]), list(results[0]), "gradients")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_read_saved_then_mutated_input_fails_backward_as_in_eager(remove):
    # y saved x before x changed: eager's backward refuses it, and so does ours.
    def f(x):
        y = x * w
        x.add_(1)
        return y.sum()

    w = _w()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(f(torch.ones(3)), w)
    out = functionalize(f, remove=remove)(torch.ones(3))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, w)


# .backward() inside f (Note [Autograd: .backward() inside the function]): leaves' .grad as in
# eager after the call, for captured leaves, leaf inputs, captured non-leaf tensors and a .grad
# that already exists.
@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_inside_f_sets_leaf_grads(remove):
    results = []
    for fz in (False, True):
        w = _w()
        v = torch.linspace(-1, 1, 3).requires_grad_()
        v.grad = torch.full((3,), 0.5)
        h = v * 3  # captured, with history outside f
        x = torch.linspace(0, 1, 3).requires_grad_()

        def f(x):
            y = x.clone()
            y.view(3)[1:].mul_(w[1:])
            loss = (y * h).sin().sum()
            loss.backward()
            return loss.detach(), w.grad * 2  # .grad read inside f

        out = functionalize(f, remove=remove)(x) if fz else f(x)
        results.append((list(out), _grads((w, v, x))))
    assert_trees_match(results[1][0], results[0][0], "outputs")
    assert_trees_match(results[1][1], results[0][1], "leaf gradients")
    for t in results[1][1]:
        assert type(t) is torch.Tensor and not torch_functionalize._C._is_functional(t)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_inside_f_twice_accumulates(remove):
    results = []
    for fz in (False, True):
        w = _w()

        def f(x):
            loss = (x * w).sin().sum()
            loss.backward(retain_graph=True)
            loss.backward()
            return loss.detach()

        (functionalize(f, remove=remove) if fz else f)(torch.linspace(0, 1, 3))
        results.append(_grads((w,)))
    assert_trees_match(results[1], results[0], "accumulated gradient")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_inside_f_leaves_no_hook_behind(remove):
    # The hooks live for the call: a later plain backward accumulates plain tensors as eagerly.
    w = _w()

    def f(x):
        (x * w).sum().backward()
        return x + 1

    functionalize(f, remove=remove)(torch.ones(3))
    (w * 2).sum().backward()
    assert_trees_match(w.grad, torch.full((3,), 3.0), "gradient")
    assert not torch_functionalize._C._is_functional(w.grad)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_inside_f_grad_of_leaf_made_inside_f(remove):
    def f(p, x):
        w = p.detach().requires_grad_()
        (x @ w).tanh().sum().backward()
        return w.grad * 2

    def make():
        gen = torch.Generator(torch.get_default_device()).manual_seed(11)
        return torch.randn(3, 2, generator=gen), torch.randn(4, 3, generator=gen)

    assert_trees_match(functionalize(f, remove=remove)(*make()), f(*make()), "gradient")
    gm = make_fx(functionalize(f, remove=remove))(*make())
    p, x = make()
    assert_trees_match(gm(p * 2, x + 1), f(p * 2, x + 1), "replayed gradient")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_backward_inside_f_grad_is_functional_inside_and_keeps_its_tensor(remove):
    # Inside f the accumulated .grad is a functional value; after the call, eager's .grad tensor
    # (the same object, accumulated in place) holds eager's value.
    seen = []
    results = []
    for fz in (False, True):
        w = _w()
        w.grad = torch.full((3,), 0.25)
        grad_before = w.grad

        def f(x):
            (x * w).sin().sum().backward()
            seen.append(torch_functionalize.is_functional(w.grad))
            return w.grad.clone()

        out = (functionalize(f, remove=remove) if fz else f)(torch.linspace(0, 1, 3))
        results.append((out, w.grad.clone()))
        assert w.grad is grad_before
    assert seen == [False, True]
    assert_trees_match(list(results[1]), list(results[0]), "gradient inside and after")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_exception_after_backward_inside_f_leaves_grads_as_they_were(remove):
    w, v = _w(), _w()
    v.grad = torch.full((3,), 0.5)

    def f(x):
        ((x * w).sum() + (x * v).sum()).backward()
        raise ValueError("after backward")

    with pytest.raises(ValueError, match="after backward"):
        functionalize(f, remove=remove)(torch.ones(3))
    assert w.grad is None
    assert_trees_match(v.grad, torch.full((3,), 0.5), "untouched gradient")
    assert not torch_functionalize._C._is_functional(v.grad)


def _autograd_view(t):
    # What a caller sees of a tensor's autograd state, .grad as a plain value.
    return (t.requires_grad, t.is_leaf, type(t.grad_fn).__name__,
            None if t.grad is None else (torch_functionalize._C._is_functional(t.grad), t.grad))


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("assign", ["fresh", "scaled", "then_hidden_write"])
def test_grad_assigned_to_an_input_inside_f_is_plain_after_the_call(assign, remove):
    # `w.grad = t` inside f hands the caller's .grad slot a tensor made inside f, which no
    # AccumulateGrad hook sees: it escaped as a functional tensor.
    # See Note [Autograd: .backward() inside the function]. Eager's assignment replaces the
    # tensor: the old .grad is untouched.
    def f(w):
        if assign == "fresh":
            w.grad = torch.ones(3)
        elif assign == "scaled":
            w.grad = w.grad * 3
        else:
            w.grad = torch.full((3,), 2.0)
            with torch.no_grad():
                w.mul_(2)
        return w * 1

    results = []
    for fn in (f, functionalize(f, remove=remove)):
        w, old = _w(), torch.ones(3)
        w.grad = old
        out = fn(w)
        results.append((out, w.detach(), _autograd_view(w), old))
        assert w.grad is not old
    assert_trees_match(results[1], results[0], "output, input, its autograd state, old .grad")


def test_grad_assigned_inside_f_that_raises_is_put_back():
    w, old = _w(), torch.full((3,), 0.5)
    w.grad = old

    def f(x):
        x.grad = torch.ones(3)
        raise ValueError("after the assignment")

    with pytest.raises(ValueError, match="after the assignment"):
        functionalize(f)(w)
    assert w.grad is old


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("case", ["grad_assigned", "backward_then_hidden_write",
                                  "clone_of_input_with_grad"])
def test_leaf_made_inside_f_is_returned_as_a_leaf_with_its_grad(case, remove):
    # Eager returns the leaf itself, with its .grad. Ours returned a value whose grad_fn was the
    # leaf's AccumulateGrad after a write under no_grad, and dropped or leaked a .grad made inside
    # f (Note [Outputs: leaves made inside the function]).
    def f(x):
        if case == "grad_assigned":
            c = torch.zeros(3).requires_grad_()
            c.grad = torch.ones(3)
        elif case == "backward_then_hidden_write":
            c = x.detach().clone().requires_grad_()
            (c * x).sum().backward()
            with torch.no_grad():
                c.mul_(2)
        else:
            with torch.no_grad():
                c = x.clone()
            c.requires_grad_()
            c.grad = torch.ones_like(c)
            with torch.no_grad():
                c.mul_(2)
        return c

    expected = f(torch.arange(3.0))
    actual = functionalize(f, remove=remove)(torch.arange(3.0))
    assert_trees_match((actual, _autograd_view(actual)), (expected, _autograd_view(expected)),
                       "returned leaf")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_of_backward_inside_f_is_functional(remove):
    w = _w()

    def f(x):
        loss = (x * w).sin().sum()
        loss.backward()
        return loss.detach()

    x = torch.linspace(0, 1, 3)
    gm = make_fx(functionalize(f, remove=remove))(x)
    assert_functional_graph(gm, remove)
    assert_trees_match(gm(x), f(x), "graph output")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_detach_cuts_the_graph_in_both_modes(remove):
    w = _w()

    def f(x):
        y = x * w
        d = y.detach()
        return (y * d).sum()

    x = torch.linspace(1, 2, 3)
    expected = f(x)
    actual = functionalize(f, remove=remove)(x)
    (g_expected,) = torch.autograd.grad(expected, w)
    (g_actual,) = torch.autograd.grad(actual, w)
    assert_trees_match(g_actual, g_expected, "gradient")
    graph = make_fx(functionalize(f, remove=remove))(x)
    assert_functional_graph(graph, remove)


def test_torch_func_functionalize_cannot_differentiate_detach_without_views():
    w = _w()

    def f(x):
        y = x * w
        return (y * y.detach()).sum()

    with pytest.raises(RuntimeError, match="detach_copy"):
        out = torch.func.functionalize(f, remove="mutations_and_views")(torch.ones(3))
        torch.autograd.grad(out, w)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_make_fx_of_joint_function_is_one_functional_graph(remove):
    # The AOTAutograd recipe: functionalize a forward+backward function and trace it once.
    def joint(x, w, buf):
        y = x.clone()
        y.mul_(w)
        buf.add_(1)
        loss = y.sin().sum()
        (g,) = torch.autograd.grad(loss, w)
        return loss.detach(), g

    def make():
        return torch.linspace(0, 1, 3), _w(), torch.zeros(3)

    expected_inputs = make()
    expected = joint(*expected_inputs)
    gm = make_fx(functionalize(joint, remove=remove))(*make())
    assert_functional_graph(gm, remove)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.cos.default" in targets, "the backward is not in the graph"
    inputs = make()
    actual = gm(*inputs)
    assert_trees_match(list(actual), list(expected), "joint outputs")
    assert_trees_match(inputs[2], expected_inputs[2], "mutated buffer")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_sgd_step_on_leaf_parameters_under_no_grad_inside_f(remove):
    # The write-back of a leaf that requires grad, written under no_grad inside f.
    def step(w, x):
        loss = (x * w).sum()
        (g,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w.sub_(0.5 * g)
        return loss.detach()

    make = lambda: (torch.ones(3, requires_grad=True), torch.linspace(0, 1, 3))  # noqa: E731
    e_in, a_in = make(), make()
    expected = step(*e_in)
    actual = functionalize(step, remove=remove)(*a_in)
    assert_trees_match(actual, expected, "loss")
    assert_trees_match(a_in[0].detach(), e_in[0].detach(), "parameter")
    assert a_in[0].is_leaf and a_in[0].requires_grad


# Leaves made inside f (Note [Wrapper: requires_grad_ set on a wrapper]): requires_grad_ on a
# wrapper, e.g. functional_call over fresh leaves and torch.autograd.grad over them.
LEAF_MAKERS = {
    "detach_requires_grad_": lambda p: p.detach().requires_grad_(),
    "clone_detach_requires_grad_": lambda p: p.clone().detach().requires_grad_(True),
    "zeros_like_requires_grad": lambda p: (torch.zeros_like(p, requires_grad=True) + 0).detach()
    .requires_grad_()
    .mul(1),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("maker", sorted(LEAF_MAKERS))
def test_leaves_made_inside_f_are_differentiable(maker, remove):
    make_leaf = LEAF_MAKERS[maker]

    def f(p, x):
        leaf = make_leaf(p)
        # ops whose backward reads outputs: test_joint_graph_of_ops_that_save_outputs_replays_eager
        loss = (x @ leaf).sin().sum()
        (g,) = torch.autograd.grad(loss, leaf)
        with torch.no_grad():
            p.sub_(0.1 * g)
        return loss.detach(), g, leaf.requires_grad, leaf.is_leaf

    def make():
        gen = torch.Generator(torch.get_default_device()).manual_seed(3)
        return torch.randn(4, 2, generator=gen), torch.randn(3, 4, generator=gen)

    e_in, a_in = make(), make()
    expected = f(*e_in)
    actual = functionalize(f, remove=remove)(*a_in)
    assert_trees_match(list(actual[:2]), list(expected[:2]), "loss and gradient")
    assert actual[2:] == expected[2:]
    assert_trees_match(a_in[0], e_in[0], "updated parameter")
    gm = make_fx(functionalize(f, remove=remove))(*make())
    assert_functional_graph(gm, remove)


# A parameter frozen with requires_grad_(False) after an in-place init under no_grad (HF
# Whisper's positional table): its value still required grad, so it received a .grad and a later
# write under no_grad turned requires_grad back on (silently; AdamW trained the frozen table).
def _frozen_after_init(x):
    table = nn.Parameter(torch.zeros(3))
    with torch.no_grad():
        table.copy_(x)  # init
    table.requires_grad_(False)
    scale = nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([table, scale], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (table * scale * x).sum().backward()
        opt.step()
    with torch.no_grad():
        table.mul_(2)  # a later load
    frozen_state = (table.requires_grad, table.grad is None)
    table.requires_grad_(True)  # unfrozen again: trains
    (table * scale).sum().backward()
    return frozen_state, table.detach(), scale.detach(), table.grad


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_parameter_frozen_after_an_in_place_init_stays_frozen(remove):
    x = torch.randn(3)
    assert_trees_match(functionalize(_frozen_after_init, remove=remove)(x), _frozen_after_init(x),
                       "frozen parameter")


# A write through an as_strided or unfold view of a value that requires grad: torch's
# as_strided_scatter derivative for `self` sent the gradient to the written elements only
# (silently wrong). See Note [Alias: as_strided_scatter's gradient].
STRIDED_WRITES = {
    "unfold": lambda y: y.unfold(0, 2, 2).mul_(3),
    "as_strided": lambda y: y.as_strided((3,), (2,)).mul_(3),
    "as_strided_2d": lambda y: y.as_strided((2, 2), (3, 1), 1).mul_(torch.tensor([[2.0, 3.0],
                                                                                 [4.0, 5.0]])),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(STRIDED_WRITES))
def test_gradient_through_a_write_of_a_strided_view_matches_eager(name, remove):
    write = STRIDED_WRITES[name]

    def f(x):
        x = x.clone().requires_grad_()
        y = x * 1
        write(y)
        return y.detach(), torch.autograd.grad(y.pow(2).sum(), x)[0]

    x, other = torch.arange(1.0, 8.0), torch.randn(7)
    assert_trees_match(functionalize(f, remove=remove)(x), f(x), "eager call")
    gm = make_fx(functionalize(f, remove=remove))(x)
    assert_functional_graph(gm, remove)
    assert_trees_match(gm(other), f(other), "make_fx graph on other inputs")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(STRIDED_WRITES))
def test_gradient_through_a_strided_write_of_an_input_at_an_offset(name, remove):
    # The input is rows 1.. of a buffer (storage offset 2) and requires grad: unfold's inverse
    # scattered its windows at the input's storage offset into a tensor of the input's own
    # elements (zeros_like in the gradient's form), past its end (a raw setStorage error).
    write = STRIDED_WRITES[name]

    def f(y):
        write(y)
        return y * 1

    def fresh():
        leaf = torch.arange(1.0, 11.0).requires_grad_()
        return leaf, (leaf * 1)[2:].view(8)[:7]

    eager_leaf, eager_y = fresh()
    expected = f(eager_y)
    expected.pow(2).sum().backward()
    leaf, y = fresh()
    actual = functionalize(f, remove=remove)(y)
    actual.pow(2).sum().backward()
    assert_trees_match(actual, expected, "output")
    assert_trees_match(y, eager_y, "the written input")
    assert_trees_match(leaf.grad, eager_leaf.grad, "gradient")


# `w.data = new` on a leaf made inside f whose requires_grad_() had not reached its value yet
# (torch.zeros(3, requires_grad=True), nn.Parameter(t)): the leaf stopped requiring grad, and a
# later backward raised. Data of another dtype makes the new data the leaf, as eager's reset.
DATA_ASSIGNED = {
    "same_dtype": lambda x: (torch.zeros(3, requires_grad=True), lambda w: w.data + x),
    "parameter_same_dtype": lambda x: (nn.Parameter(x.clone()), lambda w: w.data * 2),
    "parameter_to_double": lambda x: (nn.Parameter(x.clone()), lambda w: w.data.double()),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(DATA_ASSIGNED))
def test_data_assigned_to_a_leaf_made_inside_f_keeps_it_a_leaf(name, remove):
    def f(x):
        w, new_data = DATA_ASSIGNED[name](x)
        w.data = new_data(w)
        (w * w).sum().backward()
        return w.requires_grad, w.is_leaf, w.dtype, w.grad

    x = torch.randn(3)
    assert_trees_match(functionalize(f, remove=remove)(x), f(x), "leaf after .data =")


# The gradient through .conj() of a complex intermediate: with remove="mutations" the graphs gave
# the conjugated gradient (abs's saved conj view was taken for the traced output it shares memory
# with, Note [Autograd: saved outputs under a tracer]); without views torch's _conj_copy has no
# derivative (Note [View: *_copy ops without a derivative]). view_as_complex likewise: Meta-Llama's
# rotary embedding trained without views.
COMPLEX_VIEW_PROGRAMS = {
    "conj_of_an_intermediate": lambda c, _: (c * 1).conj().abs().sum(),
    "conj_then_mul": lambda c, _: ((c * 2).conj() * c).real.sum(),
    "rotary_embedding": lambda c, freqs: torch.view_as_real(
        torch.view_as_complex(torch.view_as_real(c * 1).reshape(2, 3, 2)) * freqs).pow(2).sum(),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(COMPLEX_VIEW_PROGRAMS))
def test_gradient_through_complex_views_of_intermediates_matches_eager(name, remove):
    program = COMPLEX_VIEW_PROGRAMS[name]

    def f(x, freqs):
        c = torch.complex(x, x * 2).requires_grad_()
        program(c, freqs).backward()
        return c.grad

    x, other = torch.tensor([1.0, 2.0, 3.0, 4.0, -1.0, 0.5]), torch.randn(6)
    freqs = torch.polar(torch.ones(2, 3), torch.randn(2, 3))
    assert_call_and_graphs_match_eager(f, (x, freqs), (other, freqs), remove)


# Hooks registered on a leaf made inside f before any op read it: its requires_grad_() had not
# reached its value yet, so the hooks went to the wrapper, where the engine never reads them
# (the gradient came out unhooked, silently). See Note [Autograd: hooks on leaf wrappers].
HOOKED_LEAF_MAKERS = {
    "clone_requires_grad_": lambda w: w.clone().requires_grad_(),
    "zeros_requires_grad_": lambda w: torch.zeros(w.shape).requires_grad_(),
    "randn_requires_grad": lambda w: torch.randn(w.shape, requires_grad=True),
    "parameter": lambda w: torch.nn.Parameter(w * 1),
}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("maker", sorted(HOOKED_LEAF_MAKERS))
def test_hooks_on_a_leaf_made_inside_f_run_as_in_eager(maker, remove):
    make_leaf = HOOKED_LEAF_MAKERS[maker]

    def f(w, x):
        leaf = make_leaf(w)
        calls = []
        leaf.register_hook(lambda g: g * 0.5)
        leaf.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.sum()))
        (x @ leaf.t()).sin().sum().backward()
        return leaf.grad, calls

    def make():
        gen = torch.Generator(torch.get_default_device()).manual_seed(7)
        return torch.randn(3, 4, generator=gen), torch.randn(5, 4, generator=gen)

    torch.manual_seed(0)
    expected = f(*make())
    torch.manual_seed(0)
    assert_trees_match(functionalize(f, remove=remove)(*make()), expected, "eager call")
    traced_on = (make()[0] + 1, make()[1])
    gm = make_fx(lambda w, x: functionalize(f, remove=remove)(w, x)[0])(*traced_on)
    assert_functional_graph(gm, remove)
    torch.manual_seed(0)
    assert_trees_match(gm(*make()), expected[0], "make_fx graph on other inputs")
