"""Library code beyond optimizers and modules inside the functionalized function: probability
distributions, signal transforms, losses, learning-rate schedulers that read the loss, sequential
checkpointing, forward hooks that write buffers, loops whose trip count or writes depend on values
read out of tensors (`int(...)`, `tolist()`, `masked_select`, `unique`), quantization observers
and learnable fake quantization, LBFGS with its closure, and in-place idioms of model code (rotary
embeddings, complex values written through real views, a KV-cache loop), and model pieces
(a whole nn.Transformer step, attention with a padding mask, graph message passing by index,
grid sampling, an EMA with _foreach_lerp_, chained LR schedulers, GaussianNLLLoss, orthogonal
parametrization). Each against eager
(reference.assert_client_matches_eager) in both remove modes, eagerly and replayed as graphs; a
program that reads values is replayed as a capture only (make_fx refuses the read, as for
torch.func's functionalize), and on inputs that give other values its capture must raise the
guard's error (Note [Capture: guards on values read])."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint_sequential

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, assert_client_matches_eager,
)

torch.manual_seed(5)
LINEAR = nn.Linear(4, 4)
STACK = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh())
HOOKED = nn.Linear(3, 3)
HOOKED.register_buffer("seen", torch.zeros(3))
HOOKED.register_forward_hook(lambda mod, args, out: mod.seen.add_(out.detach().mean(0)))
ONE_OUT = nn.Linear(3, 1)


def leaves_of(module):
    return {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}


def regression_inputs():
    return leaves_of(ONE_OUT), torch.randn(5, 3), torch.randn(5, 1)


def reparametrized_normal(p, x):
    # Normal validates its scale with a value read (`.all()`), rsample draws noise.
    mu, log_scale = functional_call(LINEAR, p, (x,)).chunk(2, -1)
    d = torch.distributions.Normal(mu, log_scale.exp())
    z = d.rsample()
    log_prob = d.log_prob(z).sum()
    kl = torch.distributions.kl_divergence(d, torch.distributions.Normal(0.0, 1.0)).sum()
    (log_prob + kl).backward()
    return z, log_prob, kl


def ctc(log_probs, targets):
    loss = F.ctc_loss(log_probs.log_softmax(-1), targets, torch.tensor([6, 6]),
                      torch.tensor([3, 2]))
    loss.backward()
    return loss


def stft_round_trip(x):
    # istft checks its window's overlap-add with a value read.
    window = torch.hann_window(16)
    spec = torch.stft(x, 16, hop_length=4, window=window, return_complex=True)
    spec.mul_(0.5)
    x.add_(torch.istft(spec, 16, hop_length=4, window=window, length=x.shape[-1]))
    return spec.abs()


def scheduled_steps(p, x, y, opt, schedule_step):
    """Three regression steps of `opt`, each followed by `schedule_step(loss)`."""
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = ((functional_call(ONE_OUT, p, (x,)) - y) ** 2).mean()
        loss.backward()
        opt.step()
        schedule_step(loss)
        losses.append(loss.detach())
    return losses, torch.tensor(opt.param_groups[0]["lr"])


def plateau_schedule(p, x, y):
    # Reads the loss it is given (a plateau of 1.0: every step halves the rate).
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    schedule = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    return scheduled_steps(p, x, y, opt, lambda loss: schedule.step(torch.tensor(1.0)))


def one_cycle_schedule(p, x, y):
    opt = torch.optim.AdamW(list(p.values()), lr=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=5)
    return scheduled_steps(p, x, y, opt, lambda loss: schedule.step())


def swa_schedule(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    schedule = torch.optim.swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=2)
    return scheduled_steps(p, x, y, opt, lambda loss: schedule.step())


def sequential_checkpoint(p, x):
    with torch.nn.utils.stateless._reparametrize_module(STACK, p):
        y = checkpoint_sequential(STACK, 2, x, use_reentrant=False)
    y.sum().backward()
    return y


def hook_writes_a_buffer(state, x):
    return functional_call(HOOKED, state, (functional_call(HOOKED, state, (x,)),))


def hooked_state():
    params = {k: v.detach().clone() for k, v in HOOKED.named_parameters()}
    return {**params, "seen": torch.zeros(3)}, torch.randn(2, 3)


def accumulate_while_positive(x, acc):
    # `acc[i] += v` ends in a copy_ of acc[i] onto itself: a second version bump in eager
    # (Note [Kernel: copy_ onto itself]).
    for i in range(int((x > 0).sum())):
        acc[i % acc.shape[0]] += x[i]
    return acc * 2


def scale_rows_by_list(x, y):
    for i, v in enumerate(x.tolist()):
        if v > 0:
            y[i].mul_(v)
    return y.clone()


def masked_round_trip(x, mask):
    values = x.masked_select(mask)
    x.masked_scatter_(mask, values * 2)
    return values.sum()


def unique_counts(x, totals):
    values, counts = torch.unique(x, return_counts=True)
    totals.index_add_(0, values, counts.float())
    return values


def index_reductions(x, index, src):
    x.index_reduce_(0, index, src, "amax", include_self=False)
    x.scatter_reduce_(1, index.view(-1, 1).expand(-1, 3).remainder(3), src, "mean")
    return x.sum()


def observers_then_fake_quantize(x):
    from torch.ao.quantization import MovingAverageMinMaxObserver, PerChannelMinMaxObserver

    moving = MovingAverageMinMaxObserver(averaging_constant=0.1)
    per_channel = PerChannelMinMaxObserver(ch_axis=1)
    for i in range(3):
        moving(x * (i + 1))
        per_channel(x + i)
    scale, zero = moving.calculate_qparams()
    channel_scales, channel_zeros = per_channel.calculate_qparams()
    return (torch.fake_quantize_per_tensor_affine(x, scale.item(), int(zero.item()), 0, 255),
            channel_scales, channel_zeros)


def learnable_fake_quantize(x, scale, zero):
    y = torch._fake_quantize_learnable_per_tensor_affine(x, scale, zero, 0, 255, 1.0)
    y.sum().backward()
    return y


def lbfgs_with_a_closure(p, x, y):
    opt = torch.optim.LBFGS(list(p.values()), lr=0.5, max_iter=3)

    def closure():
        opt.zero_grad()
        loss = ((functional_call(ONE_OUT, p, (x,)) - y) ** 2).mean()
        loss.backward()
        return loss

    return opt.step(closure)


def state_dict_loaded_inside(w, b, x):
    m = nn.Linear(3, 2)
    m.load_state_dict({"weight": w, "bias": b})
    y = m(x)
    y.sum().backward()
    with torch.no_grad():
        m.weight -= 0.1 * m.weight.grad
    return y, m.weight.detach().clone()


def rotary_in_place(q, cos, sin):
    q1, q2 = q.chunk(2, -1)
    q.mul_(cos).add_(torch.cat((-q2, q1), -1) * sin)
    return q.sum(-1)


def complex_writes_through_real_views(x):
    c = torch.view_as_complex(x)
    c.mul_(1j)
    torch.view_as_real(c)[..., 0].add_(1)
    return c.abs()


def kv_cache_loop(cache, ks):
    for t in range(ks.shape[1]):
        cache.index_copy_(1, torch.tensor([t]), ks[:, t:t + 1])
    return cache[:, :ks.shape[1]].sum()


GAUSSIAN_HEAD = nn.Linear(3, 2)
TRANSFORMER = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                             dim_feedforward=16, dropout=0.1)
ATTENTION = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.1)
MESSAGE = nn.Linear(4, 4)
CONV = nn.Conv2d(2, 2, 3, padding=1)


def gaussian_nll(p, x, y):
    # GaussianNLLLoss clamps a clone of the variance under no_grad and checks it (a value read).
    mu, v = functional_call(GAUSSIAN_HEAD, p, (x,)).unbind(-1)
    loss = nn.GaussianNLLLoss()(mu, y, v.abs() * 1e-3)
    loss.backward()
    return loss


def orthogonal_training(x):
    # parametrizations.orthogonal checks its initial weight with allclose (a value read).
    lin = nn.Linear(3, 3)
    nn.utils.parametrizations.orthogonal(lin)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        lin(x).sum().backward()
        opt.step()
    return lin.weight.detach()


def ema_with_foreach_lerp(p, ema, x):
    for _ in range(2):
        loss = functional_call(LINEAR, p, (x,)).square().mean()
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            torch._foreach_add_(list(p.values()), grads, alpha=-0.1)
            torch._foreach_lerp_(ema, list(p.values()), 0.1)
    return loss.detach()


def chained_schedulers(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2)
    restarts = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2)
    schedule = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, restarts], milestones=[2])
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = ((functional_call(ONE_OUT, p, (x,)) - y) ** 2).mean()
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.detach())
    return losses


def transformer_step(p, src, tgt):
    mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[0])
    out = functional_call(TRANSFORMER, p, (src, tgt), {"tgt_mask": mask, "tgt_is_causal": True})
    out.sum().backward()
    return out


def attention_with_padding(p, q, padding):
    out, weights = functional_call(ATTENTION, p, (q, q, q), {
        "key_padding_mask": padding, "need_weights": True, "average_attn_weights": False})
    out.sum().backward()
    return out, weights


def message_passing(p, x, edges):
    # A graph network layer: messages summed and maxed into nodes by index.
    msg = functional_call(MESSAGE, p, (x[edges[0]],))
    summed = torch.zeros_like(x).index_add_(0, edges[1], msg)
    degree = torch.zeros(x.shape[0]).scatter_add_(0, edges[1], torch.ones(edges.shape[1]))
    summed.div_(degree.clamp_(min=1).unsqueeze(-1))
    index = edges[1].unsqueeze(-1).expand_as(msg)
    maxed = torch.zeros_like(x).scatter_reduce_(0, index, msg, "amax", include_self=False)
    (summed + maxed).sum().backward()
    return summed, maxed


def sampled_grid(p, x, theta):
    grid = F.affine_grid(theta, x.shape, align_corners=False)
    y = F.grid_sample(functional_call(CONV, p, (x,)), grid, align_corners=False)
    y.relu_()
    y.sum().backward()
    return y



CASES = {
    "reparametrized_normal": (reparametrized_normal, lambda: (leaves_of(LINEAR),
                                                              torch.randn(3, 4))),
    "ctc": (ctc, lambda: (torch.randn(6, 2, 5).requires_grad_(),
                          torch.tensor([[1, 2, 3], [2, 4, 0]]))),
    "stft_round_trip": (stft_round_trip, lambda: (torch.randn(2, 64),)),
    "plateau_schedule": (plateau_schedule, regression_inputs),
    "one_cycle_schedule": (one_cycle_schedule, regression_inputs),
    "swa_schedule": (swa_schedule, regression_inputs),
    "sequential_checkpoint": (sequential_checkpoint, lambda: (
        leaves_of(STACK), torch.randn(3, 4, requires_grad=True))),
    "hook_writes_a_buffer": (hook_writes_a_buffer, hooked_state),
    "accumulate_while_positive": (accumulate_while_positive, lambda: (torch.randn(6),
                                                                      torch.zeros(3))),
    "scale_rows_by_list": (scale_rows_by_list, lambda: (torch.randn(4), torch.randn(4, 2))),
    "masked_round_trip": (masked_round_trip, lambda: (torch.randn(4, 4),
                                                      torch.randn(4, 4) > 0)),
    "unique_counts": (unique_counts, lambda: (torch.randint(0, 5, (10,)), torch.zeros(5))),
    "index_reductions": (index_reductions, lambda: (
        torch.randn(4, 3), torch.tensor([0, 2, 2, 1]), torch.randn(4, 3))),
    "observers_then_fake_quantize": (observers_then_fake_quantize, lambda: (torch.randn(4, 3),)),
    "learnable_fake_quantize": (learnable_fake_quantize, lambda: (
        torch.randn(5, requires_grad=True), torch.tensor([0.05], requires_grad=True),
        torch.tensor([128.0], requires_grad=True))),
    "lbfgs_with_a_closure": (lbfgs_with_a_closure, lambda: (
        leaves_of(ONE_OUT), torch.randn(6, 3), torch.randn(6, 1))),
    "state_dict_loaded_inside": (state_dict_loaded_inside, lambda: (
        torch.randn(2, 3), torch.randn(2), torch.randn(4, 3))),
    "rotary_in_place": (rotary_in_place, lambda: (torch.randn(2, 4, 8), torch.randn(4, 8),
                                                  torch.randn(4, 8))),
    "complex_writes_through_real_views": (complex_writes_through_real_views,
                                          lambda: (torch.randn(4, 2),)),
    "kv_cache_loop": (kv_cache_loop, lambda: (torch.zeros(2, 8, 4), torch.randn(2, 3, 4))),
    "gaussian_nll": (gaussian_nll, lambda: (leaves_of(GAUSSIAN_HEAD), torch.randn(5, 3),
                                            torch.randn(5))),
    "orthogonal_training": (orthogonal_training, lambda: (torch.randn(4, 3),)),
    "ema_with_foreach_lerp": (ema_with_foreach_lerp, lambda: (
        leaves_of(LINEAR), [t.detach().clone() for t in LINEAR.parameters()], torch.randn(4, 4))),
    "chained_schedulers": (chained_schedulers, regression_inputs),
    "transformer_step": (transformer_step, lambda: (
        leaves_of(TRANSFORMER), torch.randn(5, 2, 8), torch.randn(4, 2, 8))),
    "attention_with_padding": (attention_with_padding, lambda: (
        leaves_of(ATTENTION), torch.randn(2, 4, 8),
        torch.tensor([[False, False, True, True], [False, False, False, True]]))),
    "message_passing": (message_passing, lambda: (
        leaves_of(MESSAGE), torch.randn(5, 4),
        torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]]))),
    "sampled_grid": (sampled_grid, lambda: (leaves_of(CONV), torch.randn(2, 2, 5, 5),
                                            torch.randn(2, 2, 3, requires_grad=True))),
}
# Programs that read values out of tensors: make_fx refuses them (as torch.func's does).
READS_VALUES = {"reparametrized_normal", "stft_round_trip", "accumulate_while_positive",
                "scale_rows_by_list", "masked_round_trip", "unique_counts",
                "observers_then_fake_quantize", "lbfgs_with_a_closure", "gaussian_nll",
                "orthogonal_training"}


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_library_code_matches_eager(name, remove):
    f, make_inputs = CASES[name]
    graphs = ("capture",) if name in READS_VALUES else ("make_fx", "capture")
    assert_client_matches_eager(f, make_inputs, remove=remove, graphs=graphs)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_copy_onto_itself_counts_a_write(remove):
    from torch_functionalize import functionalize

    def f(x, acc):
        acc[0] += x[0]
        acc.copy_(acc)
        acc[1] = acc[1]
        return acc

    counts = []
    for fn in (f, functionalize(f, remove=remove)):
        acc = torch.zeros(3)
        fn(torch.randn(3), acc)
        counts.append(acc._version)
    assert counts[1] == counts[0] == 4


# A write to a value autograd saved, then a backward through it: eager refuses ("modified by an
# inplace operation"). Inside f autograd saved the functional value before the write, so the
# backward runs and differentiates through that value. Bumping the saved inner values' counters
# before each write (tried: the refusal then matched eager here) broke 87 suite tests: autograd
# regenerates the grad_fn of inner views whose base's counter moved (refused for views made under
# no_grad and for split's outputs), and mark_dirty's write-back bumped what the Function had
# just saved. See docs/behaviour.md, "Limits".
SAVED_THEN_WRITTEN = {
    "saved_output": lambda x: x.sigmoid().mul_(2),
    "saved_input": lambda x: (lambda h: (h.pow(2), h.add_(1))[0])(x * 1),
}


@pytest.mark.xfail(strict=True, reason="a backward through a value saved before an in-place "
                   "write inside f does not raise eager's 'modified by an inplace operation'")
@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", sorted(SAVED_THEN_WRITTEN))
def test_backward_through_a_value_written_after_it_was_saved_raises_as_eager(name, remove):
    from torch_functionalize import functionalize

    def f(x):
        y = SAVED_THEN_WRITTEN[name](x)
        y.sum().backward()
        return y

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        f(torch.randn(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        functionalize(f, remove=remove)(torch.randn(3, requires_grad=True))
