"""Whole programs under functionalize: factories, helpers, training-style updates, pytrees."""

import pytest
import torch
import torch.nn.functional as F

from torch_functionalize.testing._internal.reference import assert_matches_eager, assert_trees_match
from torch_functionalize import functionalize


def test_program_without_mutation_is_unchanged(remove):
    # A purely functional program with views gives exactly the eager results.
    def f(x, w):
        h = (x @ w).relu().view(2, -1).t()
        return h.softmax(0), torch.where(h > 0, h, -h).sum()

    assert_matches_eager(f, torch.randn(2, 3), torch.randn(3, 4), remove=remove)


def test_helper_mutating_through_dead_view_updates_caller(remove):
    # A helper mutates through a view that dies when it returns; the caller reads the base.
    def scale_first_row(t):
        row = t[0]
        row.mul_(10)

    def add_to_column(t, c):
        t.t()[c].add_(1)

    def f(x):
        a = x.clone()
        scale_first_row(a)
        add_to_column(a, 2)
        scale_first_row(x)
        return a

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


def test_nested_helpers_return_views_then_mutate(remove):
    # Views returned through two helper levels still alias the caller's intermediate.
    def middle(t):
        return t.view(4, 4)[1:3]

    def inner(t):
        return middle(t).diagonal()

    def f(x):
        a = x * 1
        inner(a).fill_(0)
        return a.view(4, 4)

    assert_matches_eager(f, torch.randn(16), remove=remove)


@pytest.mark.parametrize(
    "factory",
    [
        pytest.param(lambda: torch.zeros(2, 3), id="zeros"),
        pytest.param(lambda: torch.ones(2, 3, dtype=torch.float64), id="ones_float64"),
        pytest.param(lambda: torch.empty(2, 3).fill_(2.0), id="empty_then_fill"),
        pytest.param(lambda: torch.full((2, 3), 1.5), id="full"),
        pytest.param(lambda: torch.arange(6.0).view(2, 3), id="arange_view"),
        pytest.param(lambda: torch.linspace(0, 1, 6).reshape(2, 3), id="linspace"),
        pytest.param(lambda: torch.eye(3)[:2], id="eye_slice"),
        pytest.param(lambda: torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), id="tensor_constant"),
        pytest.param(lambda: torch.as_tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.float32), id="as_tensor"),
    ],
)
def test_factory_tensor_mutated_in_place(factory, remove):
    # A tensor created by a factory inside f is mutated in place and combined with an input.
    def f(x):
        t = factory()
        t.add_(x)
        t[0].mul_(2)
        return t

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_random_factory_with_manual_seed_mutated(remove):
    # torch.rand/randn under manual_seed inside f draw the eager values, then get mutated.
    def f(x):
        torch.manual_seed(1234)
        r = torch.rand(3, 4)
        n = torch.randn(4)
        r.mul_(x).add_(n)
        return r

    assert_matches_eager(f, torch.randn(3, 4), remove=remove)


def test_random_inplace_ops_with_manual_seed(remove):
    # In-place random ops (uniform_, normal_, bernoulli_) draw the same numbers as eager.
    def f(x):
        torch.manual_seed(7)
        a = torch.empty(5).uniform_(-1, 1)
        x.normal_(2.0, 0.5)
        m = torch.empty(5).bernoulli_(0.3)
        return a, m

    assert_matches_eager(f, torch.randn(5), remove=remove)


def test_dropout_inplace_with_manual_seed(remove):
    # F.dropout(inplace=True) in training mode on an input, under a fixed seed.
    def f(x):
        torch.manual_seed(3)
        return F.dropout(x, p=0.5, training=True, inplace=True).sum()

    assert_matches_eager(f, torch.randn(4, 4), remove=remove)


def test_like_factories_of_input_mutated(remove):
    # zeros_like / ones_like / new_zeros / new_full of an input, then mutated in place.
    def f(x):
        z = torch.zeros_like(x)
        o = torch.ones_like(x, dtype=torch.int32)
        n = x.new_zeros(2, 3)
        g = x.new_full((3,), 4.0)
        z.add_(x)
        o.mul_(3)
        n[1].fill_(1)
        g.sub_(x[0])
        return z, o, n, g

    assert_matches_eager(f, torch.randn(2, 3), remove=remove)


def test_empty_like_fully_overwritten(remove):
    # empty_like followed by copy_ gives deterministic values.
    def f(x):
        e = torch.empty_like(x)
        e.copy_(x.flip(0))
        return e

    assert_matches_eager(f, torch.randn(3, 2), remove=remove)


def test_tensor_constant_combined_with_input_mutation(remove):
    # A torch.tensor constant is added into an input in place and itself mutated.
    def f(x):
        c = torch.tensor([1.0, -1.0, 0.5])
        x.add_(c)
        c.mul_(x)
        return c

    assert_matches_eager(f, torch.randn(3), remove=remove)


def test_batch_norm_training_updates_running_stats(remove):
    # batch_norm in training mode mutates the running-stat inputs; both are written back.
    def f(x, running_mean, running_var, weight, bias):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.2)

    assert_matches_eager(
        f,
        torch.randn(8, 3, 4, 4),
        torch.zeros(3),
        torch.ones(3),
        torch.randn(3),
        torch.randn(3),
        remove=remove,
    )


def test_batch_norm_module_via_functional_call(remove):
    # A BatchNorm2d module run with functional_call on passed-in params and buffers updates the
    # buffers, including the integer num_batches_tracked.
    bn = torch.nn.BatchNorm2d(3)

    def f(state, x):
        y = torch.func.functional_call(bn, state, (x,))
        return y, state["num_batches_tracked"] + 0

    state = {k: v.detach().clone() for k, v in bn.state_dict().items()}
    state["weight"] = torch.randn(3)
    assert_matches_eager(f, state, torch.randn(4, 3, 2, 2), remove=remove)


def test_sgd_momentum_step_updates_params(remove):
    # Two SGD(momentum, foreach=False) steps inside f update the parameter inputs in place.
    def f(params, grads):
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False)
        for _ in range(2):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
        return [opt.state[p]["momentum_buffer"] for p in params]

    params = [torch.randn(3, 2), torch.randn(2)]
    grads = [torch.randn(3, 2), torch.randn(2)]
    assert_matches_eager(f, params, grads, remove=remove)


def test_kv_cache_update_then_attend(remove):
    # A KV-cache style write into a slice of an input buffer, then a read of the filled prefix.
    def f(cache, new, q, pos):
        cache[:, pos] = new
        keys = cache[:, : pos + 1]
        return (keys @ q.unsqueeze(-1)).squeeze(-1).softmax(-1)

    assert_matches_eager(
        f, torch.zeros(2, 5, 4), torch.randn(2, 4), torch.randn(2, 4), 2, remove=remove
    )


def test_loop_accumulates_into_rows(remove):
    # A Python loop accumulating into rows of a buffer through indexing.
    def f(x):
        acc = torch.zeros(3, x.shape[1])
        for i in range(x.shape[0]):
            acc[i % 3] += x[i]
        return acc

    assert_matches_eager(f, torch.randn(7, 2), remove=remove)


def test_mlp_with_inplace_activation_and_residual(remove):
    # A small MLP with relu_ and a residual add_ into its input.
    def f(x, w1, w2):
        h = x @ w1
        h.relu_()
        x.add_(h @ w2)
        return x.tanh()

    assert_matches_eager(f, torch.randn(4, 3), torch.randn(3, 5), torch.randn(5, 3), remove=remove)


def test_cumulative_out_and_inplace(remove):
    # out= into a fresh buffer, then an in-place op on a slice of that buffer.
    def f(x):
        buf = torch.empty(x.shape)
        torch.cumsum(x, 0, out=buf)
        buf[1:].sub_(buf[:-1].clone())
        return buf

    assert_matches_eager(f, torch.randn(5, 2), remove=remove)


def test_mutation_under_no_grad_inside_f(remove):
    # In-place updates inside a torch.no_grad() block within f.
    def f(x, y):
        with torch.no_grad():
            x.mul_(0.5)
            y.copy_(x)
        return x + y

    assert_matches_eager(f, torch.randn(3), torch.randn(3), remove=remove)


def test_integer_histogram_by_index_put(remove):
    # An int64 histogram built with index_put_(accumulate=True) from an int input.
    def f(idx):
        hist = torch.zeros(5, dtype=torch.int64)
        hist.index_put_((idx,), torch.ones_like(idx), accumulate=True)
        return hist, hist.argmax()

    assert_matches_eager(f, torch.tensor([0, 4, 4, 2, 4, 1]), remove=remove)


def test_bool_mask_program(remove):
    # A bool tensor is built, mutated in place and used to mask an input in place.
    def f(x):
        m = x > 0
        m[0] = True
        m.logical_and_(x < 1)
        x.masked_fill_(m, 0)
        return m

    assert_matches_eager(f, torch.randn(6), remove=remove)


def test_complex_program(remove):
    # Complex arithmetic with in-place updates through real/imag views.
    def f(z):
        w = z * 2
        w.real.add_(1)
        w.imag.mul_(-1)
        z.mul_(w.conj().resolve_conj())
        return w.abs()

    assert_matches_eager(f, torch.randn(4, dtype=torch.cfloat), remove=remove)


def test_kwargs_and_pytree_outputs(remove):
    # Keyword tensor arguments are mutated and written back; dict/list/tuple outputs with
    # non-tensor leaves keep their structure.
    def f(x, *, scale, bias=None, tag="t"):
        x.mul_(scale)
        if bias is not None:
            bias.add_(1)
        return {"x": x + 0, "parts": [x[0], (x.sum(), tag)], "n": 3}

    assert_matches_eager(f, torch.randn(2, 2), scale=2.0, bias=torch.zeros(2), remove=remove)


def test_nested_input_containers_mutated(remove):
    # Tensors nested in dicts and tuples inside the arguments are each written back.
    def f(state):
        state["a"].add_(1)
        state["pair"][1].mul_(2)
        return state["pair"][0] + state["a"]

    state = {"a": torch.randn(3), "pair": (torch.randn(3), torch.randn(3))}
    assert_matches_eager(f, state, remove=remove)


def test_input_mutated_and_returned(remove):
    # Returning a mutated input returns its new value.
    def f(x):
        x.add_(1)
        return x

    assert_matches_eager(f, torch.randn(3), remove=remove)


def test_inference_mode_inside_f(remove):
    # Ops run under torch.inference_mode() inside f on intermediates, then mutated.
    def f(x):
        a = x * 2
        with torch.inference_mode():
            b = torch.ones(3)
            b.add_(5)
        a.add_(b)
        return a

    assert_matches_eager(f, torch.randn(3), remove=remove)


@pytest.mark.parametrize("write", [False, True])
def test_called_under_inference_mode(write, remove):
    # Evaluation under torch.inference_mode() of a function of ordinary tensors (made before):
    # their wrappers were made there, inference tensors without a version counter, which the
    # epilogue read ("Inference tensors do not track version counter").
    def f(x, w):
        if write:
            x.add_(1)
            x.mul_(2)
        return torch.cond(x.sum() > 0, lambda a: (a @ w).sin(), lambda a: (a @ w).cos(), (x,))

    e_in = (torch.randn(4, 3), torch.randn(3, 2))
    a_in = tuple(t.clone() for t in e_in)
    with torch.inference_mode():
        expected = f(*e_in)
        actual = functionalize(f, remove=remove)(*a_in)
    assert actual.is_inference() == expected.is_inference()
    assert_trees_match(actual, expected, "output")
    assert_trees_match(a_in, e_in, "inputs")
    assert a_in[0]._version == e_in[0]._version


def test_new_tensor_on_a_functional_tensor(remove):
    # Tensor.new_tensor derives its backend from the tensor's keys: it failed with "DispatchKey
    # PrivateUse3 doesn't correspond to a device" (Note [API: Tensor.new_tensor on wrappers]).
    def f(x):
        v = x.new_tensor([-0.25, 2.0, -0.25])
        v.add_(x[:3])
        i = x.new_tensor([1, 0], dtype=torch.int64)
        return v, i, x.new_tensor(x[0])

    with pytest.warns(UserWarning):  # torch's own warning for a tensor as data, as in eager
        assert_matches_eager(f, torch.randn(4), remove=remove)


def test_legacy_new_on_a_functional_tensor(remove):
    # The legacy constructor Tensor.new failed like new_tensor did; each of its forms against
    # eager: nothing, sizes, a torch.Size, data, and a tensor of the same type (an alias).
    def f(x):
        empty, sized, from_size = x.new(), x.new(2, 3), x.new(torch.Size([4]))
        data = x.new([1.5, -2.0])
        alias = x.new(x)
        alias.mul_(2)  # an alias: x changes too, as in eager
        return (tuple(empty.shape), tuple(sized.shape), sized.dtype, tuple(from_size.shape), data,
                x.new((1, 2)), tuple(x.new(2, device=x.device).shape))

    assert_matches_eager(f, torch.randn(4, dtype=torch.float64), remove=remove)


def test_legacy_new_of_another_type_or_a_storage_is_a_type_error():
    with pytest.raises(TypeError, match="new\\(\\): expected a tensor of dtype torch.float32"):
        functionalize(lambda x: x.new(torch.zeros(2, dtype=torch.int64)))(torch.randn(2))
    with pytest.raises(TypeError, match="functionalize: Tensor.new"):
        functionalize(lambda x: x.new(x.untyped_storage()))(torch.randn(2))
