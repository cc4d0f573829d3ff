"""Real nn.Module stacks (an MLP and a transformer block with attention) under functionalize, with
their parameters captured by closure (model(x) inside f) and passed as inputs (functional_call),
in both remove modes: eager's outputs, and with remove="mutations_and_views" no view op left in
the graph, including views of the captured parameters (Note [Kernel: views of captured tensors]).
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

import torch_functionalize as tfz
from torch_functionalize.testing._internal.reference import (
    assert_captured_module_step_matches_eager, assert_functional_graph, assert_matches_eager,
    trace,
)


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention and an MLP, with the views real
    models use (view/transpose to split heads, t() inside linear, expand of a causal mask)."""

    def __init__(self, c=16, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.register_buffer("mask", torch.tril(torch.ones(8, 8, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        scores = scores.masked_fill(~self.mask[:t, :t].expand(b, self.heads, t, t), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


MODELS = [
    ("mlp", _mlp, lambda: torch.randn(5, 8)),
    ("transformer_block", Block, lambda: torch.randn(2, 8, 16)),
]


def _without_dead_nodes(gm):
    # make_fx records a detach of some autograd-saved outputs (relu's, softmax's) that nothing
    # uses; plain make_fx(f) records them too. They are dead, and removing dead nodes is what
    # every consumer of a graph does first.
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


@pytest.mark.parametrize("name, make_model, make_input", MODELS, ids=[m[0] for m in MODELS])
def test_module_with_captured_parameters_matches_eager(name, make_model, make_input, remove):
    torch.manual_seed(0)
    model = make_model()

    def f(x):
        return model(x)

    assert_matches_eager(f, make_input(), remove=remove, check_graph=False)
    gm = _without_dead_nodes(trace(f, make_input(), remove=remove))
    assert_functional_graph(gm, remove)


@pytest.mark.parametrize("name, make_model, make_input", MODELS, ids=[m[0] for m in MODELS])
def test_module_with_parameters_as_inputs_matches_eager(name, make_model, make_input, remove):
    torch.manual_seed(0)
    model = make_model()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def f(state, x):
        return functional_call(model, state, (x,))

    assert_matches_eager(f, state, make_input(), remove=remove, check_graph=False)
    gm = _without_dead_nodes(trace(f, state, make_input(), remove=remove))
    assert_functional_graph(gm, remove)


def test_views_of_captured_parameters_become_copies():
    # linear's w.t() on a captured weight: t_copy in the graph, not t.
    model = _mlp()
    gm = trace(lambda x: model(x), torch.randn(5, 8), remove="mutations_and_views")
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.t_copy.default" in targets and "aten.t.default" not in targets, gm.code


def test_write_through_view_of_captured_tensor_without_views():
    # Eager writes into w: run eagerly, so does the write through the lifted view
    # (Note [Kernel: writes into captured tensors]); no graph can write a tensor it does not take,
    # so under a tracer or a capture the write is refused, naming the op.
    w = torch.zeros(3, 3)

    def f(x):
        w.t()[0].add_(1)
        return x + w.sum()

    x = torch.randn(3)
    with pytest.raises(RuntimeError, match=r"aten::add_.*captured from outside the function"):
        tfz.capture(f, x, remove="mutations_and_views")
    assert torch.equal(w, torch.zeros(3, 3))
    out = tfz.functionalize(f, remove="mutations_and_views")(x)
    expected_w = torch.zeros(3, 3)
    expected_w.t()[0].add_(1)
    assert torch.equal(w, expected_w) and torch.equal(out, x + 3)


def test_write_through_view_of_captured_tensor_keeps_eager_semantics_with_views():
    # With views kept the captured tensor's view passes through, and the write reaches it as in
    # eager.
    def f(w, x):
        def g(y):
            w.t()[0].add_(1)
            return y + 1

        return tfz.functionalize(g)(x)

    w, e = torch.zeros(3, 3), torch.zeros(3, 3)
    f(w, torch.randn(3))
    e.t()[0].add_(1)
    assert torch.equal(w, e)


@pytest.mark.parametrize("remove", ["mutations", "mutations_and_views"])
def test_views_of_captured_tensor_see_a_later_write_of_it_by_plain_ops(remove):
    # A view of a captured tensor taken before an op on plain tensors writes that tensor in place
    # reads the new values, as in eager (Note [Alias: captured bases written in place]); a view
    # of a view, and one read before the write, too.
    def f(g, x):
        first = g[:2]
        last = g.view(2, 2)[1]
        read = first * 1
        g.add_(1)
        g.mul_(2)
        return read, first * 1, last + x, first.t() * 2

    expected = f(torch.zeros(4), torch.ones(2))
    g = torch.zeros(4)
    actual = tfz.functionalize(lambda x: f(g, x), remove=remove)(torch.ones(2))
    for a, e in zip(actual, expected):
        assert torch.equal(a, e), (actual, expected)
    assert torch.equal(g, torch.full((4,), 2.))


def _captured_writes_cases():
    torch.manual_seed(0)
    embedding = nn.Embedding(10, 4, max_norm=0.5)
    spectral = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 4))
    instance = nn.Sequential(nn.Conv1d(4, 3, 1), nn.InstanceNorm1d(3, track_running_stats=True))
    normed = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None), nn.ReLU())

    class EmaNormalizer(nn.Module):  # a captured buffer written with f's values
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(4))

        def forward(self, x):
            self.ema.mul_(0.9).add_(x.mean(0), alpha=0.1)
            return x * self.ema

    return {
        "embedding_max_norm": (embedding, lambda: torch.tensor([1, 2, 3, 1]), REMOVES),
        "instance_norm_stats": (instance, lambda: torch.randn(2, 4, 5), REMOVES),
        "spectral_norm": (spectral, lambda: torch.randn(5, 4), ["mutations_and_views"]),
        "batch_norm_cumulative": (normed, lambda: torch.randn(5, 4), REMOVES),
        "ema_buffer": (EmaNormalizer(), lambda: torch.randn(5, 4), REMOVES),
    }


REMOVES = ["mutations", "mutations_and_views"]


@pytest.mark.parametrize("case", ["embedding_max_norm", "instance_norm_stats", "spectral_norm",
                                  "batch_norm_cumulative", "ema_buffer"])
def test_captured_tensors_written_with_values_of_the_function_as_eager(case):
    # Note [Kernel: writes into captured tensors]: run eagerly, the writes reach the captured
    # tensors as in eager; the outputs, the module's state and its gradients are eager's.
    module, make_input, removes = _captured_writes_cases()[case]

    def step(m):
        def f(x):
            out = m(x)
            if out.requires_grad:
                out.pow(2).sum().backward()
            return out.detach()
        return f

    for remove in removes:
        assert_captured_module_step_matches_eager(module, step, (make_input(),), remove,
                                                  atol=1e-6, rtol=1e-5)


def test_captured_tensor_written_with_values_of_the_function_is_refused_in_graphs():
    buffer = torch.zeros(3)

    def f(x):
        buffer.add_(x)
        return x + 1

    with pytest.raises(RuntimeError, match="cannot write functional values into the plain"):
        tfz.capture(f, torch.ones(3))
    assert torch.equal(buffer, torch.zeros(3))
