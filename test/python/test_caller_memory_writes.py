"""Writes into an input done in the caller's memory with an undo log (Note [Undo: writes into the
caller's memory]): indexed writes and writes through views of inputs give eager's outputs,
inputs and versions; an exception inside the function leaves every input as it was; where a
condition of the Note fails, the functional path runs. Expected values come from eager runs.
"""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import assert_trees_match


def _same_as_eager(f, *args, remove="mutations"):
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ours_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in eager_args]
    expected = f(*eager_args)
    eager_bumps = [a._version - v for a, v in zip(eager_args, versions) if v is not None]
    versions = [a._version if isinstance(a, torch.Tensor) else None for a in ours_args]
    actual = tfz.functionalize(f, remove=remove)(*ours_args)
    our_bumps = [a._version - v for a, v in zip(ours_args, versions) if v is not None]
    assert_trees_match(actual, expected, "outputs")
    assert_trees_match(ours_args, eager_args, "inputs")
    assert our_bumps == eager_bumps
    return ours_args, actual


class _Seen:
    """What a plain alias of the input (held outside the function) shows while it runs: the
    caller's memory, so it tells whether the write went there already."""

    def __init__(self, alias):
        self.alias, self.values = alias, []

    def look(self):
        self.values.append(self.alias.clone())


def kv_step(cache, pos, k):
    cache.index_copy_(2, pos, k)
    return cache.index_select(2, torch.tensor([0, 3])).sum()


def test_index_copy_into_an_input_matches_eager_and_writes_the_caller_memory():
    cache, pos, k = torch.randn(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4)
    _same_as_eager(kv_step, cache, pos, k)
    seen = _Seen(cache)

    def f(cache, pos, k):
        cache.index_copy_(2, pos, k)
        seen.look()
        return cache.sum()

    tfz.functionalize(f)(cache, pos, k)
    assert torch.equal(seen.values[0][:, :, 3:4], k)  # in the caller's tensor before the return


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_with_repeated_indices_matches_eager(accumulate):
    def f(x, idx, v):
        x.index_put_((idx,), v, accumulate=accumulate)
        x[idx] = v * 2
        return x

    ours, out = _same_as_eager(f, torch.randn(10), torch.tensor([1, 1, 3]), torch.arange(3.0))
    assert out is ours[0]


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
def test_writes_through_views_of_an_input_match_eager(remove):
    def f(x, y):
        x[:, 0:4] = y
        x[:, 8:12].mul_(3)
        row, col = x[0], x[:, 0]  # overlapping views: both see each other's writes
        row.add_(1)
        return col.clone(), row.clone(), x[:, 0:10].sum()

    _same_as_eager(f, torch.randn(4, 16), torch.randn(4, 4), remove=remove)


@pytest.mark.parametrize("body", ["index_copy_", "index_put_", "slice", "view of view"])
def test_exception_after_writes_leaves_inputs_untouched(body):
    def f(x, idx, v):
        if body == "index_copy_":
            x.index_copy_(0, idx, v)
        elif body == "index_put_":
            x.index_put_((idx,), v, accumulate=True)
        elif body == "slice":
            x[1:3].mul_(5)
        else:
            x[1:].view(-1, 2)[0].fill_(7)
        x[0:2] = 9
        raise ValueError("inside f")

    x = torch.randn(6, 2)
    before, version = x.clone(), x._version
    with pytest.raises(ValueError, match="inside f"):
        tfz.functionalize(f)(x, torch.tensor([4, 1]), torch.ones(2, 2))
    assert torch.equal(x, before)
    assert x._version >= version  # restored values; the writes' version bumps stay


def test_view_write_is_seen_by_other_views_and_outputs():
    def f(x):
        a = x[0]
        b = x.t()
        a.add_(1)
        b[1].mul_(2)
        return a.clone(), b.clone()

    _same_as_eager(f, torch.randn(3, 3))


def test_graphs_stay_functional():
    def f(cache, pos, k):
        cache.index_copy_(2, pos, k)
        cache[:, :, 0:1] = k
        return cache.sum()

    args = (torch.randn(1, 2, 8, 4), torch.tensor([3]), torch.randn(1, 2, 1, 4))
    for gm in (make_fx(tfz.functionalize(f))(*args), tfz.capture(f, *args)):
        targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        assert torch.ops.aten.index_copy.default in targets
        assert torch.ops.aten.index_copy_.default not in targets


def test_argument_requiring_grad_keeps_the_functional_path_and_its_gradients():
    cache = torch.randn(1, 2, 8, 4)
    k = torch.randn(1, 2, 1, 4, requires_grad=True)

    def f(cache, pos, k):
        cache.index_copy_(2, pos, k * 2)
        return cache.sum()

    eager_cache, ours_cache = cache.clone(), cache.clone()
    f(eager_cache, torch.tensor([3]), k).backward()
    expected = k.grad.clone()
    k.grad = None
    tfz.functionalize(f)(ours_cache, torch.tensor([3]), k).backward()
    assert torch.equal(k.grad, expected) and torch.allclose(ours_cache, eager_cache)


def test_inputs_sharing_memory_match_eager():
    base = torch.randn(8)

    def f(a, b):
        a.index_copy_(0, torch.tensor([1]), torch.ones(1))
        return b.clone()

    eager = base.clone()
    expected = f(eager, eager[0:4])
    ours = base.clone()
    actual = tfz.functionalize(f)(ours, ours[0:4])
    assert torch.equal(actual, expected) and torch.equal(ours, eager)


def test_guard_keeps_writes_for_its_caller():
    # Under enable() the caller writes inputs back itself (propagate_input_mutation): nothing
    # reaches the plain tensor before that.
    x = torch.zeros(4)
    with tfz.enable():
        w = tfz.to_functional(x)
        w.index_copy_(0, torch.tensor([2]), torch.ones(1))
        assert torch.equal(x, torch.zeros(4))
        tfz.sync(w)


def test_nested_calls():
    def inner(x):
        x.index_copy_(0, torch.tensor([0]), torch.full((1,), 5.0))
        x[2:].add_(1)
        return x.sum()

    def outer(x):
        y = x * 1
        s = tfz.functionalize(inner)(y)
        x[1:2] = y[0:1]
        return s, y

    _same_as_eager(outer, torch.randn(5))


def test_successive_view_writes_all_reach_the_caller_memory():
    # The second view is made from a base the first write left stale: it must be synced before
    # the conditions are read, or the write falls back to a functional slice_scatter of the
    # whole input (found by benchmarks/reinplace.py: 128 MiB for two 1 MiB slice writes).
    x = torch.randn(4, 16)
    seen = _Seen(x)

    def f(x):
        x[:, 0:4] = 1
        seen.look()
        x[:, 8:12].mul_(2)
        seen.look()
        return x.sum()

    before = x.clone()
    tfz.functionalize(f)(x)
    assert torch.equal(seen.values[0][:, 0:4], torch.ones(4, 4))
    assert torch.equal(seen.values[1][:, 8:12], before[:, 8:12] * 2)
