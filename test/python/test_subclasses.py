"""Traceable wrapper subclasses (``__tensor_flatten__`` / ``__tensor_unflatten__`` /
``__torch_dispatch__``) passed to functionalize(f): they stay their subclass inside f, outputs are
the subclass, values and input mutations match eager, and a traced graph is the functional
program on the inner tensors. See Note [API: wrapper subclasses]. DTensor on real ranks:
test_dtensor.py.
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from torch_functionalize import functionalize, is_functional

MODES = ["mutations", "mutations_and_views"]


class Pair(torch.Tensor):
    """Two inner tensors of one shape; every op runs on both (like torch's TwoTensor test class).
    The outer tensor records a tag (its context) that outputs inherit."""

    @staticmethod
    def __new__(cls, a, b, tag="pair"):
        out = torch.Tensor._make_wrapper_subclass(
            cls, a.shape, strides=a.stride(), storage_offset=a.storage_offset(), dtype=a.dtype,
            device=a.device, requires_grad=False)
        return out

    def __init__(self, a, b, tag="pair"):
        self.a, self.b, self.tag = a, b, tag

    def __tensor_flatten__(self):
        return ["a", "b"], self.tag

    @staticmethod
    def __tensor_unflatten__(inner, tag, outer_size, outer_stride):
        return Pair(inner["a"], inner["b"], tag)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tags = [x.tag for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, Pair)]
        out_a = func(*pytree.tree_map_only(Pair, lambda x: x.a, args),
                     **pytree.tree_map_only(Pair, lambda x: x.a, kwargs))
        out_b = func(*pytree.tree_map_only(Pair, lambda x: x.b, args),
                     **pytree.tree_map_only(Pair, lambda x: x.b, kwargs))
        if func._schema.is_mutable:
            return args[0]  # in-place: the written Pair itself
        return _pair_up(out_a, out_b, tags[0])

    def sum_parts(self):
        """A method of the subclass that f calls: works only if f sees a Pair."""
        return self.a.sum() + self.b.sum()


def _pair_up(out_a, out_b, tag):
    if isinstance(out_a, torch.Tensor):
        return Pair(out_a, out_b, tag)
    if isinstance(out_a, (tuple, list)):
        return type(out_a)(_pair_up(x, y, tag) for x, y in zip(out_a, out_b))
    return out_a


def make_pair(tag="pair"):
    return Pair(torch.arange(6.0).reshape(2, 3), -torch.arange(6.0).reshape(2, 3) - 1, tag)


def clone_pair(p):
    return Pair(p.a.clone(), p.b.clone(), p.tag)


def assert_pair_equal(actual, expected):
    assert type(actual) is Pair, type(actual)
    assert actual.tag == expected.tag
    torch.testing.assert_close(actual.a, expected.a, rtol=0, atol=0)
    torch.testing.assert_close(actual.b, expected.b, rtol=0, atol=0)
    assert not is_functional(actual.a) and not is_functional(actual.b)


def pointwise(x):
    assert type(x) is Pair and x.tag == "pair"
    return (x * 2 + 1).sin()


def method_call(x):
    return x.sum_parts() * x.tag.count("p") + x.sum()


def mutate_input(x):
    x.add_(1)
    x[0].mul_(3)  # through a view of the input
    return x.exp()


def mutate_intermediate(x):
    y = x.clone()
    v = y.view(3, 2)
    v.add_(10)  # reaches y through the view
    return y, v.t()


def inner_mutation_seen(x):
    # mutating the inner tensors of the (rebuilt) subclass in f is also written back
    x.a.mul_(2)
    return x + 0


CASES = [pointwise, method_call, mutate_input, mutate_intermediate, inner_mutation_seen]


@pytest.mark.parametrize("remove", MODES)
@pytest.mark.parametrize("f", CASES, ids=lambda f: f.__name__)
def test_subclass_matches_eager(f, remove):
    x_eager, x_ours = make_pair(), make_pair()
    expected = f(x_eager)
    seen = []

    def g(x):
        seen.append(type(x))
        return f(x)

    actual = functionalize(g, remove=remove)(x_ours)
    assert seen == [Pair]
    flat_e, spec_e = pytree.tree_flatten(expected)
    flat_a, spec_a = pytree.tree_flatten(actual)
    assert spec_e == spec_a
    for e, a in zip(flat_e, flat_a):
        if isinstance(e, Pair):
            assert_pair_equal(a, e)
        else:
            torch.testing.assert_close(a, e, rtol=0, atol=0)
    assert_pair_equal(x_ours, x_eager)  # input mutations written back


def test_subclass_next_to_plain_tensors_and_kwargs():
    def f(p, w, *, scale):
        p.mul_(w)  # Pair times a plain tensor: runs Pair's dispatch on (wrapper, wrapper)
        w.add_(1)
        return p * scale, w

    args_e = (make_pair(), torch.full((2, 3), 2.0))
    args_o = (make_pair(), torch.full((2, 3), 2.0))
    out_e = f(*args_e, scale=3.0)
    out_o = functionalize(f)(*args_o, scale=3.0)
    assert_pair_equal(out_o[0], out_e[0])
    torch.testing.assert_close(out_o[1], out_e[1])
    assert_pair_equal(args_o[0], args_e[0])
    torch.testing.assert_close(args_o[1], args_e[1])


def test_subclass_of_subclass():
    def f(x):
        x.add_(1)
        return x * 2

    def nested():
        return Pair(make_pair("in1"), make_pair("in2"), "outer")

    x_e, x_o = nested(), nested()
    out_e = f(x_e)
    out_o = functionalize(f)(x_o)
    for e, a in ((out_e, out_o), (x_e, x_o)):
        assert type(a) is Pair and type(a.a) is Pair and a.tag == "outer"
        assert_pair_equal(a.a, e.a)
        assert_pair_equal(a.b, e.b)


def test_subclass_created_inside_f():
    def f(a, b):
        p = Pair(a, b)
        p.mul_(2)
        return p.sum_parts()

    a_e, b_e = torch.ones(3), torch.arange(3.0)
    a_o, b_o = a_e.clone(), b_e.clone()
    out_e = f(a_e, b_e)
    out_o = functionalize(f)(a_o, b_o)
    torch.testing.assert_close(out_o, out_e)
    torch.testing.assert_close(a_o, a_e)
    torch.testing.assert_close(b_o, b_e)


@pytest.mark.parametrize("remove", MODES)
def test_traced_graph_is_functional_inner_program(remove):
    """make_fx over a function of the inner tensors that builds the subclass and calls the
    functionalized function: the graph holds the inner program, functional, and replays as eager."""

    def f(x):
        x.add_(1)
        y = x.view(3, 2)
        y.mul_(2)
        return x.cos()

    def outer(a, b):
        p = Pair(a, b)
        out = functionalize(f, remove=remove)(p)
        return out.a, out.b

    a, b = torch.randn(2, 3), torch.randn(2, 3)
    gm = make_fx(outer)(a.clone(), b.clone())
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets, gm.code
    copies = [t for t in targets if t is torch.ops.aten.copy_.default]
    assert len(copies) == 2, gm.code  # the epilogue writing the input mutation back, per tensor
    for t in targets:
        assert not t._schema.is_mutable or t in copies, gm.code
        if remove == "mutations_and_views":
            assert not t.is_view, gm.code
    assert "Pair" not in gm.code
    pe = Pair(a.clone(), b.clone())
    out_e = f(pe)
    ga, gb = a.clone(), b.clone()
    out_g = gm(ga, gb)
    torch.testing.assert_close(out_g[0], out_e.a)
    torch.testing.assert_close(out_g[1], out_e.b)
    # the graph writes input mutations back like functionalize's epilogue
    torch.testing.assert_close(ga, pe.a)
    torch.testing.assert_close(gb, pe.b)


@pytest.mark.parametrize("remove", MODES)
def test_subclass_itself_as_graph_input(remove):
    """make_fx(functionalize(f))(subclass): the graph reads the input's inner tensors (getattr),
    holds the functional inner program, writes the input's mutations back into them and returns
    the subclass. See Note [API: subclasses as graph inputs]."""

    def f(x):
        x.add_(1)
        return x.view(3, 2).mul(2), x.sum_parts()

    gm = make_fx(functionalize(f, remove=remove))(make_pair())
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None:
            assert not schema.is_mutable or node.target is torch.ops.aten.copy_.default, gm.code
            if remove == "mutations_and_views":
                assert not node.target.is_view, gm.code
    assert "_tensor_constant" not in gm.code, gm.code
    p_graph, p_eager = make_pair(), make_pair()
    for p in (p_graph, p_eager):  # other values than the traced ones
        p.a.mul_(3)
        p.b.add_(5)
    out_graph, out_eager = gm(p_graph), f(p_eager)
    assert_pair_equal(out_graph[0], out_eager[0])
    torch.testing.assert_close(out_graph[1], out_eager[1], rtol=0, atol=0)
    assert_pair_equal(p_graph, p_eager)


