"""Modules and utilities that write state eager's user never sees written, called inside the
functionalized function as client code calls them: norms with running statistics (cumulative
averages included), Embedding(max_norm=), spectral norm in both forms, quantization observers and
FakeQuantize (QAT's fused form included), in-place activations and dropout, RReLU in training,
recurrent and attention modules (GRU, MultiheadAttention, attention dropout, a decoder layer),
orthogonal and weight-norm parametrizations, pruning, EmbeddingBag(max_norm=), clip_grad_norm_,
nn.init fills with eager's random draws, a torch.export-ed module called through functional_call,
and a Hugging Face GPT-2 trained two steps. Each against eager (reference.assert_client_matches_eager): outputs, written inputs and
their autograd state, and make_fx / capture graphs replayed."""
import pytest
import torch
import torch.nn as nn
from torch.func import functional_call

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_client_matches_eager,
)


def _state(module):
    """The module's parameters (leaves that require grad) and buffers, as fresh tensors."""
    return {k: v.detach().clone().requires_grad_(v.requires_grad)
            for k, v in {**dict(module.named_parameters()), **dict(module.named_buffers())}.items()}


def module_step(make_module, make_x, train=True, backward=True):
    """f(state, x): functional_call of the module (training mode), a backward through the output
    that leaves .grad on the parameters, and the output. The state dict's buffers are written by
    the module as in eager."""
    torch.manual_seed(0)
    module = make_module()
    module.train(train)

    def make_inputs():
        return (_state(module), make_x())

    def f(state, x):
        out = functional_call(module, state, (x,))
        if backward:
            out.float().square().sum().backward()
        return out.detach()

    return f, make_inputs


def bn_cumulative():
    return nn.BatchNorm1d(4, momentum=None)


def spectral_parametrized():
    return nn.utils.parametrizations.spectral_norm(nn.Linear(4, 3))


def spectral_hook():
    return nn.utils.spectral_norm(nn.Linear(4, 3))


def embedding_max_norm():
    return nn.Embedding(10, 4, max_norm=1.0)


def inplace_activations():
    # Each in-place activation after a Linear: two in a row can be refused by eager's own
    # autograd (LeakyReLU then SiLU in place modifies what LeakyReLU's backward saved).
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3, inplace=True), nn.ReLU(inplace=True),
                         nn.Linear(4, 4), nn.Hardtanh(inplace=True), nn.Linear(4, 4),
                         nn.SiLU(inplace=True), nn.Linear(4, 4), nn.LeakyReLU(inplace=True),
                         nn.Linear(4, 4), nn.ELU(inplace=True))


def fake_quant():
    return nn.Sequential(nn.Linear(4, 4), torch.ao.quantization.FakeQuantize())


def observers():
    from torch.ao.quantization import HistogramObserver, MinMaxObserver, \
        MovingAverageMinMaxObserver, PerChannelMinMaxObserver
    return nn.Sequential(MinMaxObserver(), MovingAverageMinMaxObserver(),
                         PerChannelMinMaxObserver(ch_axis=1), HistogramObserver(bins=16))


def qat_prepared():
    # QAT's default qconfig: FusedMovingAvgObsFakeQuantize, whose per-channel weight observer
    # starts with empty running min/max that its fused op resizes
    # (Note [Schema: in-place arguments an op resizes]).
    model = nn.Sequential(torch.ao.quantization.QuantStub(), nn.Linear(4, 4), nn.ReLU(),
                          nn.Linear(4, 2), torch.ao.quantization.DeQuantStub())
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    return torch.ao.quantization.prepare_qat(model.train())


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=True)[0]


class DropoutAttention(nn.Module):
    """scaled_dot_product_attention with dropout in training (a random op inside a fused one)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
        return out.transpose(1, 2).reshape(2, 5, 8)


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 5, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


class DecoderLayer(nn.Module):
    """A decoder layer attending to its own input as memory."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.1, batch_first=True)

    def forward(self, x):
        return self.layer(x, x)


def pruned():
    import torch.nn.utils.prune as prune

    # torch.nn.utils.prune: a weight_orig parameter, a weight_mask buffer, and a forward
    # pre-hook that writes weight = weight_orig * weight_mask on the module.
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    prune.l1_unstructured(model[0], "weight", amount=0.4)
    return model


MODULES = {
    "batch_norm": (lambda: nn.BatchNorm1d(4), lambda: torch.randn(6, 4)),
    "batch_norm_cumulative_average": (bn_cumulative, lambda: torch.randn(6, 4)),
    "batch_norm_2d": (lambda: nn.BatchNorm2d(3), lambda: torch.randn(2, 3, 4, 4)),
    "instance_norm_running_stats": (lambda: nn.InstanceNorm1d(3, affine=True,
                                                              track_running_stats=True),
                                    lambda: torch.randn(2, 3, 5)),
    "sync_free_group_norm": (lambda: nn.GroupNorm(2, 4), lambda: torch.randn(3, 4, 5)),
    "embedding_max_norm": (embedding_max_norm, lambda: torch.tensor([[1, 2, 2], [7, 1, 9]])),
    "spectral_norm_parametrization": (spectral_parametrized, lambda: torch.randn(5, 4)),
    "spectral_norm_hook": (spectral_hook, lambda: torch.randn(5, 4)),
    "inplace_activations_and_dropout": (inplace_activations, lambda: torch.randn(5, 4)),
    "fake_quantize": (fake_quant, lambda: torch.randn(5, 4)),
    # Its backward multiplies by the noise the forward drew: the functional variant's
    # derivative read the noise before the draw (Note [Kernel: rrelu's noise under autograd]).
    "qat_fused_fake_quantize": (qat_prepared, lambda: torch.randn(6, 4)),
    "gru_two_layers": (GRU, lambda: torch.randn(2, 3, 4)),
    "multihead_attention_dropout": (SelfAttention, lambda: torch.randn(2, 5, 8)),
    "sdpa_dropout": (DropoutAttention, lambda: torch.randn(2, 5, 8)),
    "transformer_decoder_layer": (DecoderLayer, lambda: torch.randn(2, 4, 8)),
    "orthogonal_parametrization": (lambda: nn.utils.parametrizations.orthogonal(nn.Linear(4, 4)),
                                   lambda: torch.randn(3, 4)),
    "weight_norm_parametrization": (
        lambda: nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)), lambda: torch.randn(3, 4)),
    "l1_pruned_linear": (pruned, lambda: torch.randn(5, 4)),
    "embedding_bag_max_norm": (lambda: nn.EmbeddingBag(10, 4, max_norm=0.5, mode="sum"),
                               lambda: torch.tensor([[1, 2, 2], [7, 1, 9]])),
    "rrelu_in_training": (lambda: nn.Sequential(nn.Linear(4, 4), nn.RReLU(), nn.Linear(4, 4),
                                                nn.RReLU(0.05, 0.4, inplace=True)),
                          lambda: torch.randn(6, 4)),
}


# Modules whose forward reads a value out of a tensor (FakeQuantize tests its enable flags with
# `if self.observer_enabled[0] == 1`; BatchNorm with momentum=None divides by
# float(num_batches_tracked)): make_fx refuses the read, capture guards it.
READS_VALUES = {"fake_quantize", "batch_norm_cumulative_average"}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_with_hidden_state_matches_eager(name, remove):
    make_module, make_x = MODULES[name]
    f, make_inputs = module_step(make_module, make_x)
    graphs = ("capture",) if name in READS_VALUES else ("make_fx", "capture")
    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=graphs)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_quantization_observers_match_eager(remove):
    # Observers write their min/max (and histogram) buffers; no parameters, no backward.
    f, make_inputs = module_step(observers, lambda: torch.randn(5, 4), backward=False)
    # HistogramObserver reads its min/max with .item() to pick bins: make_fx refuses the read.
    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=("capture",))


def clip_and_init(w1, w2, x):
    loss = (x @ w1 @ w2).square().sum()
    loss.backward()
    norm = nn.utils.clip_grad_norm_([w1, w2], max_norm=0.5)
    nn.utils.clip_grad_value_([w1, w2], clip_value=0.01)
    with torch.no_grad():
        fresh = torch.empty(4, 4)
        nn.init.kaiming_uniform_(fresh, a=5 ** 0.5)
        nn.init.orthogonal_(w2)
        nn.init.trunc_normal_(w1, std=0.02)
        nn.init.zeros_(fresh[0])
    return norm, fresh


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_clip_grad_norm_and_init_fills_match_eager(remove):
    make = lambda: (torch.randn(3, 4).requires_grad_(), torch.randn(4, 4).requires_grad_(),  # noqa: E731
                    torch.randn(5, 3))
    # trunc_normal_ resamples until no draw lies outside its bounds (`if not mask.any()`): a
    # read of a value, which make_fx refuses and capture guards.
    assert_client_matches_eager(clip_and_init, make, remove=remove, graphs=("capture",))


class Cache(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 8, 4))
        self.proj = nn.Linear(4, 4)

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, self.proj(x))
        return self.cache.sum(1)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_exported_module_through_functional_call_matches_eager(remove):
    # torch.export's module of a KV-cache write, called with its state as functional_call inputs.
    torch.manual_seed(0)
    ep = torch.export.export(Cache(), (torch.randn(2, 1, 4), torch.tensor([3])))
    exported = ep.module()

    def make_inputs():
        state = {k: v.detach().clone() for k, v in
                 {**dict(exported.named_parameters()), **dict(exported.named_buffers())}.items()}
        return state, torch.randn(2, 1, 4), torch.tensor([5])

    def f(state, x, pos):
        return functional_call(exported, state, (x, pos))

    assert_client_matches_eager(f, make_inputs, remove=remove, check_version=False)


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_gpt2_two_training_steps_with_adamw_match_eager(remove):
    # The program: functional_call, loss.backward(), AdamW(foreach=True).step(), twice.
    model = _gpt2()
    names = [n for n, _ in model.named_parameters()]

    def make_inputs():
        params = [p.detach().clone().requires_grad_() for p in model.parameters()]
        return params, torch.randint(0, 50, (2, 8))

    def f(params, ids):
        # eps above rounding noise: the key bias's gradient is zero up to rounding (softmax
        # ignores a shift of every score), and with the default eps Adam turns rounding
        # differences between layouts into steps of lr: on CUDA a views-removed graph's GEMMs
        # on contiguous copies gave 1e-5 on 2 of its 48 elements (first GPU run of this test).
        opt = torch.optim.AdamW(params, lr=1e-2, eps=1e-4, foreach=True)
        losses = []
        for _ in range(2):
            opt.zero_grad()
            out = functional_call(model, dict(zip(names, params)), (ids,), {"labels": ids})
            out.loss.backward()
            opt.step()
            losses.append(out.loss.detach())
        return losses

    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=("capture",))


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU])
def test_recurrent_module_over_a_packed_sequence_matches_eager(rnn, backward, remove):
    # pack_padded_sequence / pad_packed_sequence around an LSTM or GRU: the recurrent op and the
    # unpacking read the batch sizes from their data (Note [Kernel: composites intercepted whole]).
    # Packing reads the lengths, which make_fx refuses and capture guards. A backward through the
    # recurrent op is refused by capture (Note [Capture: composites taken whole under autograd];
    # test_composites), so that case is checked eagerly only.
    torch.manual_seed(0)
    module = rnn(3, 4, batch_first=True)

    def make_inputs():
        return (_state(module), torch.randn(3, 5, 3))

    def f(state, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2], device="cpu"),
                                                    batch_first=True)
        out, _ = functional_call(module, state, (packed,))
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        if backward:
            padded.square().sum().backward()
        return padded.detach()

    assert_client_matches_eager(f, make_inputs, remove=remove,
                                graphs=() if backward else ("capture",))


# Losses and loops over modules as client code writes them: CTC, an LSTMCell stepped into a
# preallocated output, AdaptiveLogSoftmaxWithLoss, and REINFORCE over a Categorical (its
# sampling reads values: make_fx refuses as plain make_fx does, capture guards them).
def _leaves(module):
    return {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}


def _ctc():
    lin = nn.Linear(4, 5)

    def f(p, x, targets):
        log_probs = functional_call(lin, p, (x,)).log_softmax(-1)
        loss = nn.CTCLoss()(log_probs, targets, torch.tensor([6, 6]), torch.tensor([3, 2]))
        loss.backward()
        return loss

    return f, lambda: (_leaves(lin), torch.randn(6, 2, 4), torch.tensor([[1, 2, 3], [2, 4, 0]]))


def _lstm_cell_into_a_buffer():
    cell = nn.LSTMCell(3, 4)

    def f(p, x):
        h, c = torch.zeros(2, 4), torch.zeros(2, 4)
        out = torch.empty(5, 2, 4)
        for t in range(5):
            h, c = functional_call(cell, p, (x[t], (h, c)))
            out[t] = h
        out.sum().backward()
        return out

    return f, lambda: (_leaves(cell), torch.randn(5, 2, 3))


def _adaptive_log_softmax():
    m = nn.AdaptiveLogSoftmaxWithLoss(8, 10, cutoffs=[4, 8])

    def f(p, x, target):
        out = functional_call(m, p, (x, target))
        out.loss.backward()
        return out.output, out.loss

    return f, lambda: (_leaves(m), torch.randn(6, 8), torch.tensor([0, 3, 5, 9, 7, 1]))


def _reinforce():
    lin = nn.Linear(3, 4)

    def f(p, x):
        d = torch.distributions.Categorical(logits=functional_call(lin, p, (x,)))
        a = d.sample()
        loss = -(d.log_prob(a) * a.float()).mean() - 0.01 * d.entropy().mean()
        loss.backward()
        return a, loss

    return f, lambda: (_leaves(lin), torch.randn(5, 3))


LOSSES_AND_LOOPS = {"ctc": (_ctc, ("make_fx", "capture")),
                    "lstm_cell_into_a_buffer": (_lstm_cell_into_a_buffer, ("make_fx", "capture")),
                    "adaptive_log_softmax": (_adaptive_log_softmax, ("make_fx", "capture")),
                    "reinforce": (_reinforce, ("capture",))}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(LOSSES_AND_LOOPS))
def test_loss_or_loop_matches_eager(name, remove):
    make, graphs = LOSSES_AND_LOOPS[name]
    torch.manual_seed(0)
    f, make_inputs = make()
    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=graphs)


def _lazy_model(train):
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyConv1d(4, 3), nn.LazyBatchNorm1d(), nn.ReLU(), nn.Flatten(),
                          nn.LazyLinear(2))
    return model.train(train)


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("how", ["functionalize", "make_fx", "capture"])
def test_lazy_modules_first_called_inside_f_initialize_once_as_eager(how, remove):
    # Note [API: lazy modules initialized inside the function]: the first call initializes the
    # parameters with eager's draws; a second call (a replay) initializes nothing. Traced graphs
    # take eval mode (running stats are the module's own, which graphs do not write).
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_functionalize import capture, functionalize
    from torch_functionalize.testing._internal.reference import assert_trees_match

    train = how == "functionalize"
    x1, x2 = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    eager = _lazy_model(train)
    torch.manual_seed(1)
    e1 = eager(x1)
    eager_state_after_init = torch.get_rng_state()
    eager_module_state = {k: v.clone() for k, v in eager.state_dict().items()}
    e2 = eager(x2)

    ours = _lazy_model(train)
    torch.manual_seed(1)
    if how == "functionalize":
        run = functionalize(lambda x: ours(x), remove=remove)
        assert_trees_match(run(x1), e1, "first call")
    elif how == "make_fx":
        run = make_fx(functionalize(lambda x: ours(x), remove=remove))(x1)
    else:
        run = capture(lambda x: ours(x), x1, remove=remove)
    assert torch.equal(torch.get_rng_state(), eager_state_after_init)
    assert [type(m) for m in ours] == [type(m) for m in eager]
    assert_trees_match(dict(ours.state_dict()), eager_module_state, "initialized state")
    assert_trees_match(run(x2), e2, "second call")
    assert_trees_match(dict(ours.state_dict()), dict(eager.state_dict()), "state after two calls")
    assert all(p.requires_grad for p in ours.parameters())


def test_lazy_module_made_before_the_import_is_refused_by_name_when_traced():
    # Its hook is torch's own bound method (made when the module was): simulated here.
    import types

    import torch.nn.modules.lazy as lazy
    from torch_functionalize import capture, functionalize, lazy_modules

    def old_module():
        m = nn.LazyLinear(2)
        m._initialize_hook.remove()
        hook = types.MethodType(lazy_modules._original_infer, m)
        m._initialize_hook = m.register_forward_pre_hook(hook, with_kwargs=True)
        assert lazy.LazyModuleMixin._infer_parameters is not lazy_modules._original_infer
        return m

    m = old_module()
    with pytest.raises(NotImplementedError, match="created before torch_functionalize"):
        capture(lambda x: m(x), torch.ones(3, 4))
    m, eager = old_module(), old_module()  # eagerly its materialize is served
    torch.manual_seed(2)
    expected = eager(torch.ones(3, 4))
    torch.manual_seed(2)
    torch.testing.assert_close(functionalize(lambda x: m(x))(torch.ones(3, 4)), expected)
