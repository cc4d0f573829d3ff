"""The public Python API: functionalize's contract, the enable()/to_functional helpers and
functionalize_graph."""

import collections
import functools

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import (
    assert_functional_graph, assert_matches_eager, clone_inputs,
)


def _tensor_leaves(tree):
    return [v for v in pytree.tree_leaves(tree) if isinstance(v, torch.Tensor)]


def test_pytree_inputs_and_outputs_keep_structure(remove):
    # dict/tuple/list arguments with non-tensor leaves reach f intact, and the outputs keep
    # their container types, keys and non-tensor leaves.
    def f(d, pair, items, *, scale, name):
        d["w"].mul_(scale)
        items[1].add_(pair[0])
        return {"name": name, "out": (d["w"] + pair[1], [items[0], None, 3.5]), "k": d["k"]}

    d = {"w": torch.randn(2), "k": "key"}
    pair = (torch.randn(2), torch.randn(2))
    items = [torch.randn(2), torch.randn(2), 7]
    out = assert_matches_eager(f, d, pair, items, scale=3, name="n", remove=remove)
    assert isinstance(out, dict) and isinstance(out["out"], tuple)
    assert isinstance(out["out"][1], list) and out["out"][1][1] is None


@pytest.mark.parametrize(
    "make_out, out_type",
    [
        (lambda a, b: a, torch.Tensor),
        (lambda a, b: (a, b), tuple),
        (lambda a, b: [b, a, a], list),
        (lambda a, b: torch.max(a.view(2, 2), dim=1), torch.return_types.max),
        (lambda a, b: (a, [b]), tuple),
        (lambda a, b: (a, 2), tuple),
        (lambda a, b: (), tuple),
    ],
    ids=["tensor", "tuple", "list", "namedtuple", "nested", "non_tensor_leaf", "empty"],
)
def test_positional_tensor_calls_keep_output_structure(remove, make_out, out_type):
    # Calls with positional tensors only skip pytree on the way in, and tensor / tuple / list
    # results skip it on the way out; every other result shape still goes through pytree.
    def f(x, y):
        a = x.clone()
        a.mul_(2)
        y.add_(1)
        return make_out(a, y)

    out = assert_matches_eager(f, torch.randn(4), torch.randn(4), remove=remove)
    assert type(out) is out_type
    assert not any(tfz.is_functional(t) for t in _tensor_leaves(out))


def test_flat_list_and_tuple_arguments_skip_pytree(remove):
    # Tensors and flat lists / tuples of tensors (an optimizer's call) are read without pytree
    # (Note [API: arguments without a pytree]): f gets lists as lists and tuples as tuples, every
    # tensor in them is functionalized and written back, keyword lists included, and one tensor
    # in two lists is still one tensor.
    seen = []

    def f(params, grads, steps, scale, *, extra):
        assert type(params) is list and type(grads) is tuple and type(extra) is list
        seen.append(tfz.is_functional(params[0]) and tfz.is_functional(extra[0]))
        torch._foreach_add_(params, list(grads), alpha=0.5)
        for s in steps:
            s.add_(1)
        scale.mul_(2)
        extra[0].sub_(scale)
        return params, [s * 2 for s in steps], extra

    params = [torch.randn(3), torch.randn(2, 2)]
    grads = (torch.randn(3), torch.randn(2, 2))
    steps = [torch.tensor(1.0), torch.tensor(2.0)]

    def make_inputs():
        p = [t.clone() for t in params]
        return (p, tuple(g.clone() for g in grads), [s.clone() for s in steps], torch.ones(()))

    other = torch.randn(3)
    for extra_of in (lambda a: [other.clone()], lambda a: [a[0][0]]):
        eager_args, func_args = make_inputs(), make_inputs()
        eager_out = f(*eager_args, extra=extra_of(eager_args))
        out = tfz.functionalize(f, remove=remove)(*func_args, extra=extra_of(func_args))
        torch.testing.assert_close(pytree.tree_leaves(out), pytree.tree_leaves(eager_out))
        torch.testing.assert_close(pytree.tree_leaves(func_args), pytree.tree_leaves(eager_args))
        assert type(out[1]) is list
    assert seen == [False, True, False, True]


def test_namedtuple_and_empty_list_arguments(remove):
    # A namedtuple argument keeps its type (it takes pytree's path); an empty list stays a list.
    Pair = collections.namedtuple("Pair", ["a", "b"])

    def f(pair, empty):
        assert type(pair) is Pair and type(empty) is list and not empty
        pair.a.add_(pair.b)
        return pair.a * 2

    assert_matches_eager(f, Pair(torch.randn(2), torch.randn(2)), [], remove=remove)


def test_kwargs_tensors_are_functionalized(remove):
    # Tensor keyword arguments are mutated and written back like positional ones.
    def f(x, *, y):
        y.add_(x)
        return y.view(-1)

    assert_matches_eager(f, torch.randn(2, 2), y=torch.randn(2, 2), remove=remove)


def test_outputs_are_plain_tensors(remove):
    # Every tensor output, including views of inputs and intermediates, is a plain tensor.
    def f(x):
        a = x.clone()
        a.add_(1)
        return a, a[0], x.t(), [a.view(-1)], {"s": a.sum()}

    outs = tfz.functionalize(f, remove=remove)(torch.randn(2, 3))
    for t in _tensor_leaves(outs):
        assert type(t) is torch.Tensor
        assert not tfz.is_functional(t)


def test_unmutated_input_returned_is_same_object(remove):
    # An input that f returns without mutating it comes back as the very same tensor object.
    def f(x, y):
        return x, y + 1

    x = torch.randn(3)
    out = tfz.functionalize(f, remove=remove)(x, torch.randn(3))
    assert out[0] is x


def test_non_tensor_and_none_outputs(remove):
    # A function returning only non-tensor values (and None) returns them unchanged.
    def f(x, n):
        x.sum()
        return None, n * 2, "s"

    assert tfz.functionalize(f, remove=remove)(torch.randn(2), 4) == (None, 8, "s")


def test_functionalized_callable_is_reusable(remove):
    # One functionalized callable can be called repeatedly, with different shapes and dtypes.
    def f(x):
        x.mul_(2)
        return x[0]

    g = tfz.functionalize(f, remove=remove)
    for x in (torch.randn(3), torch.randn(2, 4), torch.arange(5)):
        expected = x.clone()
        f(expected)
        out = g(x)
        torch.testing.assert_close(x, expected)
        torch.testing.assert_close(out, expected[0])


@pytest.mark.parametrize("remove_mode", ["mutations", "mutations_and_views"])
def test_remove_accepts_both_documented_values(remove_mode):
    # Both documented remove values are accepted, and "mutations" is the default.
    assert callable(tfz.functionalize(torch.sin, remove=remove_mode))
    assert callable(tfz.functionalize(torch.sin))


def test_remove_rejects_unknown_value_listing_allowed_values():
    # A bad remove value raises ValueError whose message lists both allowed values.
    with pytest.raises(ValueError) as info:
        tfz.functionalize(torch.sin, remove="views")
    message = str(info.value)
    assert "'mutations'" in message or '"mutations"' in message, message
    assert "mutations_and_views" in message, message
    assert "views" in message


def test_functools_wraps_keeps_name_and_doc():
    # The returned callable looks like f (functools.wraps): same __name__, __doc__, __wrapped__.
    def my_program(x):
        """Adds one."""
        return x + 1

    g = tfz.functionalize(my_program)
    assert g.__name__ == "my_program"
    assert g.__doc__ == "Adds one."
    assert getattr(g, "__wrapped__", my_program) is my_program


def test_partial_and_module_callables():
    # Any callable works: functools.partial objects and nn.Modules.
    def f(x, k):
        x.add_(k)
        return x * 2

    assert_matches_eager(functools.partial(f, k=3), torch.randn(3))
    lin = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    torch.testing.assert_close(tfz.functionalize(lin)(x), lin(x))


def test_autograd_through_outputs_matches_eager(remove):
    # Outputs of a functionalized program carry grad_fn, and backward gives eager's gradient.
    def f(x, w):
        a = x * w
        a[0].mul_(3)
        a.t()[1].add_(x[1].sum())
        return a.sin().sum()

    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    out = tfz.functionalize(f, remove=remove)(x, w)
    assert out.grad_fn is not None
    gx, gw = torch.autograd.grad(out, (x, w))

    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    eager_gx, eager_gw = torch.autograd.grad(f(ex, ew), (ex, ew))
    torch.testing.assert_close(out, f(ex, ew))
    torch.testing.assert_close(gx, eager_gx)
    torch.testing.assert_close(gw, eager_gw)


def test_autograd_backward_populates_leaf_grads(remove):
    # .backward() on a functionalized output accumulates into the caller's leaf tensors.
    def f(x):
        y = x.clone()
        y.mul_(y)
        return y.sum()

    x = torch.randn(4, requires_grad=True)
    tfz.functionalize(f, remove=remove)(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_enable_to_functional_roundtrip(remove):
    # Under enable(), to_functional wraps, mutations through views stay in the wrapper until
    # sync/from_functional, and the original tensor is untouched.
    x = torch.arange(6.0).view(2, 3)
    original = x.clone()
    with tfz.enable(remove=remove):
        fx = tfz.to_functional(x)
        assert tfz.is_functional(fx)
        assert not tfz.is_functional(x)
        fx.add_(1)
        fx.t()[0].mul_(10)
        tfz.sync(fx)
        out = tfz.from_functional(fx)
    assert not tfz.is_functional(out)
    expected = original + 1
    expected[:, 0] *= 10
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, original)


def test_enable_default_remove_and_views_of_wrappers():
    # enable() defaults to remove="mutations"; a view of a wrapper is functional too and reads
    # its base's later mutation after sync.
    z = torch.zeros(4)
    with tfz.enable():
        fx = tfz.to_functional(z)
        v = fx[1:3]
        assert tfz.is_functional(v)
        fx.fill_(2)
        tfz.sync(v)
        out = tfz.from_functional(v)
    torch.testing.assert_close(out, torch.full((2,), 2.0))


def test_is_functional_on_plain_tensor_outside_enable():
    # is_functional is a pure query: False for plain tensors anywhere.
    assert not tfz.is_functional(torch.randn(2))


def _program_with_input_mutation(x, y):
    z = x.view(-1)
    z.add_(y.view(-1))
    return (x * 2).sum(0)


def test_functionalize_graph_removes_mutations(remove):
    # functionalize_graph turns a traced mutating GraphModule into a functional one that
    # computes the same outputs and input write-back.
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    gm = make_fx(_program_with_input_mutation)(*clone_inputs((x, y)))
    fgm = tfz.functionalize_graph(gm, *clone_inputs((x, y)), remove=remove)
    assert isinstance(fgm, torch.fx.GraphModule)
    assert_functional_graph(fgm, remove)

    eager_args, graph_args = clone_inputs((x, y)), clone_inputs((x, y))
    torch.testing.assert_close(fgm(*graph_args), _program_with_input_mutation(*eager_args))
    torch.testing.assert_close(graph_args, eager_args)


def test_functionalize_graph_of_graph_without_mutation():
    # A graph with no mutation goes through functionalize_graph and still matches eager.
    def f(x):
        return x.t().relu() + 1

    x = torch.randn(3, 2)
    gm = make_fx(f)(x)
    fgm = tfz.functionalize_graph(gm, x)
    assert_functional_graph(fgm, "mutations")
    torch.testing.assert_close(fgm(x), f(x))


def test_functionalize_graph_mutations_and_views_has_no_views():
    # With remove="mutations_and_views" the resulting graph holds no view op.
    def f(x):
        a = x.clone()
        a[0].add_(1)
        return a.view(-1)

    x = torch.randn(2, 2)
    fgm = tfz.functionalize_graph(make_fx(f)(x), x, remove="mutations_and_views")
    assert_functional_graph(fgm, "mutations_and_views")
    torch.testing.assert_close(fgm(x), f(x))


def test_dlpack_export_of_a_wrapper_is_refused_by_name():
    # A DLPack consumer of a wrapper's data pointer crashed the process; outside the function
    # torch's own export is untouched.
    def export(x):
        return torch.from_dlpack(x) + 0

    with pytest.raises(NotImplementedError, match="DLPack export of a tensor inside"):
        tfz.functionalize(export)(torch.ones(3))
    with pytest.raises(NotImplementedError, match="DLPack export of a tensor inside"):
        tfz.functionalize(lambda x: torch.utils.dlpack.to_dlpack(x))(torch.ones(3))
    assert torch.equal(export(torch.ones(3)), torch.ones(3))


def _save_inside(x, w, buf):
    x.add_(1)
    p = torch.nn.Parameter(w * 2)
    torch.save({"x": x, "y": x[1:], "p": p, "t": x.t()}, buf)
    return x * 2


def test_torch_save_inside_f_writes_eager_checkpoint(remove):
    # torch.save of wrappers (a checkpoint saved inside the training function) failed with
    # "Attempted to access the data pointer on an invalid python storage"
    # (Note [API: pickling wrappers]). Loaded after the call: eager's values, strides, types and
    # requires_grad; with views kept, tensors that alias load as aliases, as eager's.
    import io

    x, w = torch.arange(6.0).reshape(2, 3), torch.randn(3)
    eager_buf, our_buf = io.BytesIO(), io.BytesIO()
    expected_x, our_x = x.clone(), x.clone()
    expected = _save_inside(expected_x, w, eager_buf)
    assert torch.equal(tfz.functionalize(_save_inside, remove=remove)(our_x, w, our_buf), expected)
    assert torch.equal(our_x, expected_x)
    eager_buf.seek(0)
    our_buf.seek(0)
    saved, ours = torch.load(eager_buf), torch.load(our_buf)
    for k in saved:
        assert type(ours[k]) is type(saved[k]), k
        assert torch.equal(ours[k], saved[k]) and ours[k].stride() == saved[k].stride(), k
        assert ours[k].requires_grad == saved[k].requires_grad, k
    if remove == "mutations":
        assert ours["y"].untyped_storage().data_ptr() == ours["x"].untyped_storage().data_ptr()
    with pytest.raises(NotImplementedError, match="pickling a tensor"):
        make_fx(tfz.functionalize(_save_inside, remove=remove))(x.clone(), w, io.BytesIO())
