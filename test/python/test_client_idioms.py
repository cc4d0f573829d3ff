"""Training-loop idioms of client code inside the functionalized function, beyond one optimizer
step: gradient accumulation, learning-rate schedulers, gradient scaling and foreach clipping, EMA
weights, copy.deepcopy snapshots of the parameters, gradients assigned to .grad,
zero_grad(set_to_none=False), recurrent and transformer layers, BatchNorm switching between train
and eval, weight_norm, torch.cond inside a step, torch.amp.GradScaler, a gradient penalty (double
backward). Each against eager, in both remove modes, eagerly, as a make_fx graph and as a capture,
both replayed as f is called (reference.assert_client_matches_eager). Also: hooks on parameters,
custom autograd.Functions (more in test_custom_functions.py), checkpointing and autocast inside
the step."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, TEST_DEVICE, assert_client_matches_eager, assert_functional_graph,
    assert_trees_match,
)
from torch_functionalize import capture, functionalize, is_functional

torch.manual_seed(3)
MLP = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
LSTM = nn.LSTM(4, 5, batch_first=True)
ENCODER = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
NORMED = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())


def leaves_of(module):
    return {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}


def mse(out, y):
    return ((out - y) ** 2).mean()


def mlp_inputs():
    return leaves_of(MLP), torch.randn(6, 4), torch.randn(6, 3)


def grad_accumulation(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        for mb in (slice(0, 3), slice(3, 6)):
            loss = mse(functional_call(MLP, p, (x[mb],)), y[mb]) / 2
            loss.backward()
            losses.append(loss.detach())
        opt.step()
    return losses


def lr_scheduler(p, x, y):
    opt = torch.optim.Adam(list(p.values()), lr=0.05, foreach=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = mse(functional_call(MLP, p, (x,)), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
    return losses


def scaled_and_clipped_gradients(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    loss = mse(functional_call(MLP, p, (x,)), y)
    loss.backward()
    for q in p.values():
        q.grad.mul_(0.5)
    torch.nn.utils.clip_grad_norm_(list(p.values()), 0.1, foreach=True)
    opt.step()
    return loss.detach()


def ema_weights(p, x, y):
    ema = [q.detach().clone() for q in p.values()]
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        mse(functional_call(MLP, p, (x,)), y).backward()
        opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, list(p.values()), 0.1)
    return ema


def zero_grad_keeping_tensors(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    for _ in range(2):
        opt.zero_grad(set_to_none=False)
        mse(functional_call(MLP, p, (x,)), y).backward()
        opt.step()
    return [q.grad.clone() for q in p.values()]


def cond_inside_a_step(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    out = functional_call(MLP, p, (x,))
    with torch.no_grad():
        scale = torch.cond(out.sum() > 0, lambda o: o.abs().mean(), lambda o: o.pow(2).mean(),
                           (out,))
    loss = mse(out, y) * scale
    loss.backward()
    opt.step()
    return loss.detach()


def lstm_steps(p, x):
    # The CPU LSTM kernel looks at the grad mode: the graph replays in f's modes
    # (Note [API: epilogue writes of leaves in graphs]).
    opt = torch.optim.Adam(list(p.values()), lr=0.05)
    for _ in range(2):
        opt.zero_grad()
        out, _ = functional_call(LSTM, p, (x,))
        out.pow(2).mean().backward()
        opt.step()
    return out.detach()


def encoder_steps(p, x):
    # SGD, not Adam: a few of the encoder's gradients are zero up to rounding (the key bias), and
    # Adam turns rounding differences of 1e-8 between eager and a views-removed graph's layouts
    # into steps of lr.
    opt = torch.optim.SGD(list(p.values()), lr=0.1, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        functional_call(ENCODER, p, (x,)).pow(2).mean().backward()
        opt.step()
    return x


def batch_norm_train_then_eval(state, x):
    opt = torch.optim.SGD([v for v in state.values() if v.requires_grad], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        functional_call(NORMED, state, (x,)).sum().backward()
        opt.step()
    NORMED.eval()
    try:
        return functional_call(NORMED, state, (x,))
    finally:
        NORMED.train()


def normed_inputs():
    state = leaves_of(NORMED)
    state.update({k: v.detach().clone() for k, v in NORMED.named_buffers()})
    return state, torch.randn(8, 4)


def weight_norm_steps(g, v, x):
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3, bias=False))
    params = {"parametrizations.weight.original0": g, "parametrizations.weight.original1": v}
    opt = torch.optim.SGD([g, v], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        functional_call(layer, params, (x,)).sum().backward()
        opt.step()
    return g, v


def grad_scaler(p, x, y):
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        loss = mse(functional_call(MLP, p, (x,)), y)
        scaler.scale(loss).backward()
        scaler.step(opt)  # reads found_inf with .item()
        scaler.update()
    return loss.detach()


def clipping_hooks(p, x, y):
    # Note [Autograd: hooks on leaf wrappers]: hooks on leaves ran nowhere before.
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    handles = [q.register_hook(lambda g: g.clamp(-0.01, 0.01)) for q in p.values()]

    def halve(q):
        q.grad.mul_(0.5)

    handles += [q.register_post_accumulate_grad_hook(halve) for q in p.values()]
    mse(functional_call(MLP, p, (x,)), y).backward()
    opt.step()
    for h in handles:
        h.remove()
    return [q.grad.clone() for q in p.values()]


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return a * a

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return 2 * a * g


def custom_function_step(p, x, y):
    # Note [Autograd: custom Functions]: gradients through one were silently missing.
    opt = torch.optim.Adam(list(p.values()), lr=0.05)
    for _ in range(2):
        opt.zero_grad()
        loss = Square.apply(functional_call(MLP, p, (x,)) - y).mean()
        loss.backward()
        opt.step()
    return loss.detach()


def checkpoint_step(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    out = torch.utils.checkpoint.checkpoint(lambda a: functional_call(MLP, p, (a,)), x,
                                            use_reentrant=False)
    loss = mse(out, y)
    loss.backward()
    opt.step()
    return loss.detach()


def autocast_step(p, x, y):
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = functional_call(MLP, p, (x,))
    loss = mse(out.float(), y)
    loss.backward()
    opt.step()
    return loss.detach()


def flat_vector_sgd(p, x, y):
    # A hand-written SGD over one flat vector, written back with vector_to_parameters
    # (`q.data = ...` of each leaf): the leaves stay leaves that train on
    # (Note [Wrapper: x.data = y keeps x's autograd identity]).
    params = list(p.values())
    losses = []
    for _ in range(2):
        loss = mse(functional_call(MLP, p, (x,)), y)
        loss.backward()
        losses.append(loss.detach())
        with torch.no_grad():
            vec = torch.nn.utils.parameters_to_vector(params)
            grads = torch.nn.utils.parameters_to_vector([q.grad for q in params])
            torch.nn.utils.vector_to_parameters(vec - 0.1 * grads, params)
        for q in params:
            q.grad = None
    return losses


def data_assigned_weight_average(p, x, y):
    # Weights replaced by an average through .data (SWA-style), then trained on: .grad of the
    # same leaves.
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    mse(functional_call(MLP, p, (x,)), y).backward()
    opt.step()
    for q in p.values():
        q.data = (q.data + q.data.flip(0)) / 2
    opt.zero_grad()
    loss = mse(functional_call(MLP, p, (x,)), y)
    loss.backward()
    opt.step()
    return loss.detach()


def best_state_snapshot(p, x, y):
    # `best = copy.deepcopy(params)` inside a loop: deep copies of the parameters (leaves that
    # require grad, with a .grad after the first step), written later under no_grad.
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    snapshots = []
    for _ in range(2):
        opt.zero_grad()
        mse(functional_call(MLP, p, (x,)), y).backward()
        snapshots.append(copy.deepcopy(p))
        opt.step()
    with torch.no_grad():
        snapshots[0]["0.weight"].mul_(2)
    state = [(t.requires_grad, t.is_leaf, t.grad) for s in snapshots for t in s.values()]
    return snapshots, state


def gradients_assigned_then_step(p, x, y):
    # Gradients computed with autograd.grad, clipped, and handed to the optimizer by assigning
    # .grad (meta-learning and gradient-compression code): the inputs' .grad after the call is the
    # assigned tensor, plain (Note [Autograd: .backward() inside the function]).
    opt = torch.optim.Adam(list(p.values()), lr=0.05)
    losses = []
    for _ in range(2):
        loss = mse(functional_call(MLP, p, (x,)), y)
        grads = torch.autograd.grad(loss, list(p.values()))
        for q, g in zip(p.values(), grads):
            q.grad = g.clamp(-0.1, 0.1)
        opt.step()
        losses.append(loss.detach())
    return losses


def bce_with_logits_steps(p, x, y):
    # BCEWithLogitsLoss's backward formula multiplies the incoming (functional) gradient into a
    # plain temporary of its own in place (Note [Autograd: formula temporaries written in place]).
    targets = (y > 0).float()
    loss_fn = nn.BCEWithLogitsLoss(weight=torch.tensor([1.0, 0.5, 2.0]),
                                   pos_weight=torch.tensor([2.0, 1.0, 0.5]))
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = loss_fn(functional_call(MLP, p, (x,)), targets)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    out = functional_call(MLP, p, (x,)).sum(1)
    (g,) = torch.autograd.grad(
        nn.functional.binary_cross_entropy_with_logits(out, targets[:, 0], reduction="sum"),
        p["0.bias"])
    return losses, g


def module_backward_hooks(p, x, y):
    # Full backward hooks wrap the module's inputs and outputs in torch's BackwardHookFunction and
    # find its node by grad_fn name (Note [Autograd: custom Functions]).
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    seen = []
    model[0].register_full_backward_hook(lambda m, gi, go: seen.append(go[0].sum()))
    model[2].register_full_backward_pre_hook(lambda m, go: (go[0].clamp(-0.05, 0.05),))
    opt = torch.optim.SGD(list(p.values()), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        mse(functional_call(model, p, (x,)), y).backward()
        opt.step()
    return seen, [q.grad for q in p.values()]


class _QatConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.dequant = torch.ao.quantization.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.dequant(self.fc(self.relu(self.bn(self.conv(self.quant(x)))).flatten(1)))


def qat_model_made_inside(w, x, y):
    # The default QAT qconfig made inside f: its per-channel observer starts running_min as
    # torch.tensor([]) (a detached alias of a fresh constant) that its fused op resizes.
    model = _QatConvNet().train()
    with torch.no_grad():
        model.conv.weight.copy_(w)
    model.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
    torch.ao.quantization.fuse_modules_qat(model, [["conv", "bn", "relu"]], inplace=True)
    torch.ao.quantization.prepare_qat(model, inplace=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, model.conv.weight.detach(), model.fc.weight_fake_quant.scale


def gradient_penalty_steps(p, x, y):
    # WGAN-GP: the critic's input gradient (create_graph=True), its norm penalised, weights
    # clipped under no_grad. The norm's double backward writes a temporary of its own in place
    # (Note [Autograd: formula temporaries written in place]) and reads its saved output
    # (without views it was a constant of the graph: Note [Autograd: saved outputs under a tracer]).
    opt = torch.optim.Adam(list(p.values()), lr=1e-3, betas=(0.5, 0.9))
    losses = []
    for _ in range(2):
        opt.zero_grad()
        eps = torch.rand(x.shape[0], 1)
        mixed = (eps * x + (1 - eps) * y[:, :1].expand_as(x)).requires_grad_(True)
        critic = functional_call(MLP, p, (mixed,))
        (g,) = torch.autograd.grad(critic.sum(), mixed, create_graph=True)
        loss = critic.mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for q in p.values():
                q.clamp_(-0.5, 0.5)
        losses.append(loss.detach())
    return losses


class _Scriptable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.tanh(self.fc(x)) * 2


def scripted_module_steps(p, x, y):
    # A TorchScript module trained inside f: from its third call the profiling executor runs a
    # DifferentiableGraph, which sets its backward node on the outputs it returns; before, those
    # steps' gradients never reached the parameters.
    # See Note [Wrapper: history set on a wrapper]
    model = _Scriptable()
    with torch.no_grad():
        model.fc.weight.copy_(p["0.weight"][:3])
        model.fc.bias.copy_(p["0.bias"][:3])
    scripted = torch.jit.script(model)
    return _sgd_steps(scripted, x, y, 4), scripted.fc.weight.detach()


def _sgd_steps(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = mse(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return losses


def lazy_module_steps(x, y):
    # nn.LazyLinear made inside f: its first call materializes the weight with `.data = ` of a
    # new shape on a parameter no op has read (eager makes its grad accumulator then), and
    # initializes it in place; the steps train it.
    model = nn.Sequential(nn.LazyLinear(5), nn.ReLU(), nn.LazyLinear(3))
    model(x)  # materializes
    return _sgd_steps(model, x, y, 2), [p.detach() for p in model.parameters()]


CASES = {
    "gradient_penalty_steps": (gradient_penalty_steps, mlp_inputs),
    "scripted_module_steps": (scripted_module_steps, mlp_inputs),
    "lazy_module_steps": (lazy_module_steps, lambda: (torch.randn(6, 4), torch.randn(6, 3))),
    "bce_with_logits_steps": (bce_with_logits_steps, mlp_inputs),
    "module_backward_hooks": (module_backward_hooks, mlp_inputs),
    "qat_model_made_inside": (qat_model_made_inside, lambda: (
        torch.randn(4, 2, 3, 3), torch.randn(3, 2, 4, 4), torch.randint(0, 3, (3,)))),
    "flat_vector_sgd": (flat_vector_sgd, mlp_inputs),
    "data_assigned_weight_average": (data_assigned_weight_average, mlp_inputs),
    "clipping_hooks": (clipping_hooks, mlp_inputs),
    "custom_function_step": (custom_function_step, mlp_inputs),
    "checkpoint_step": (checkpoint_step, mlp_inputs),
    "grad_accumulation": (grad_accumulation, mlp_inputs),
    "lr_scheduler": (lr_scheduler, mlp_inputs),
    "scaled_and_clipped_gradients": (scaled_and_clipped_gradients, mlp_inputs),
    "ema_weights": (ema_weights, mlp_inputs),
    "best_state_snapshot": (best_state_snapshot, mlp_inputs),
    "gradients_assigned_then_step": (gradients_assigned_then_step, mlp_inputs),
    "zero_grad_keeping_tensors": (zero_grad_keeping_tensors, mlp_inputs),
    "cond_inside_a_step": (cond_inside_a_step, mlp_inputs),
    "lstm_steps": (lstm_steps, lambda: (leaves_of(LSTM), torch.randn(2, 3, 4))),
    "encoder_steps": (encoder_steps, lambda: (leaves_of(ENCODER), torch.randn(2, 5, 8))),
    "batch_norm_train_then_eval": (batch_norm_train_then_eval, normed_inputs),
    "weight_norm_steps": (weight_norm_steps, lambda: (torch.rand(3, 1).requires_grad_(),
                                                      torch.randn(3, 4).requires_grad_(),
                                                      torch.randn(5, 4))),
}


# Known failures on one device, strict: each must keep failing there until fixed.
_DEVICE_XFAILS: dict[tuple[str, str], str] = {}


def _idiom(name):
    reason = _DEVICE_XFAILS.get((name, torch.device(TEST_DEVICE).type))
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason) if reason
                        else ())


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("name", [_idiom(n) for n in sorted(CASES)])
def test_training_idiom_matches_eager(name, remove):
    f, make_inputs = CASES[name]
    assert_client_matches_eager(f, make_inputs, remove=remove)


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_autocast_step_matches_eager_and_capture_records_it_through_make_fx(remove):
    # Note [Capture: autocast inside the function]: capture's recording missed autocast's casts.
    with pytest.warns(UserWarning, match="autocast is enabled inside the function"):
        assert_client_matches_eager(autocast_step, mlp_inputs, remove=remove)


@pytest.mark.parametrize("graph", ["make_fx", "capture"])
def test_checkpointed_step_graph_replays_other_inputs(graph):
    # The graph held the activations recomputed in the backward, and the saved weights, as
    # constants (Note [Autograd: saved outputs under a tracer]): replays on other parameters and
    # inputs must compute from them.
    def grads(p, x, y):
        out = torch.utils.checkpoint.checkpoint(lambda a: functional_call(MLP, p, (a,)), x,
                                                use_reentrant=False)
        mse(out, y).backward()
        return [q.grad for q in p.values()]

    def other_inputs(seed):
        torch.manual_seed(seed)
        p, x, y = mlp_inputs()
        return {k: (v * 1.5).detach().requires_grad_() for k, v in p.items()}, x, y

    torch.manual_seed(0)
    traced_on = mlp_inputs()
    gm = (make_fx(functionalize(grads))(*traced_on) if graph == "make_fx"
          else capture(grads, *traced_on))
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"], gm.code
    a_in, e_in = other_inputs(1), other_inputs(1)
    assert_trees_match(gm(*a_in), grads(*e_in), "replay on other inputs")


@pytest.mark.parametrize("remove", REMOVE_MODES)
@pytest.mark.parametrize("graph", ["make_fx", "capture"])
def test_checkpointed_dropout_block_graph_gives_eager_gradients(graph, remove):
    # Two silent wrong gradients of graphs: the recomputation drew a second dropout mask (the
    # random state checkpoint restores was invisible to tracers), and the block's last op (relu),
    # where checkpoint stops recomputing, had its saved output held as a constant. See
    # Note [Graphs: random state saved and restored]
    # and Note [Autograd: saved outputs under a tracer].
    def block(a, w, b):
        return torch.nn.functional.dropout(torch.nn.functional.linear(a, w, b), 0.5).relu()

    def grads(w, b, x):
        out = torch.utils.checkpoint.checkpoint(block, x, w, b, use_reentrant=False)
        (out * torch.arange(out.numel()).view(out.shape)).sum().backward()
        return out.detach(), w.grad, b.grad

    def inputs(seed):
        torch.manual_seed(seed)
        return (torch.randn(3, 4).requires_grad_(), torch.randn(3).requires_grad_(),
                torch.randn(5, 4))

    def run(fn, seed):
        args = inputs(seed)
        torch.manual_seed(100 + seed)
        return fn(*args)

    torch.manual_seed(1)
    traced_on = inputs(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # capture records it through make_fx, and says so
        gm = (make_fx(functionalize(grads, remove=remove))(*traced_on) if graph == "make_fx"
              else capture(grads, *traced_on, remove=remove))
    assert_functional_graph(gm, remove)
    for seed in (1, 2):
        assert_trees_match(run(gm, seed), run(grads, seed), f"replay on inputs {seed}")


def test_custom_function_backward_after_the_call_reaches_the_inputs():
    # The Function's node joins the values (Note [Autograd: custom Functions]): its saved
    # tensors are no wrappers, so a backward after functionalize returns works too.
    def f(w, x):
        return Square.apply(x @ w).sum()

    w, x = torch.randn(3, 2, requires_grad=True), torch.randn(4, 3)
    w_e = w.detach().clone().requires_grad_()
    functionalize(f)(w, x).backward()
    f(w_e, x).backward()
    assert_trees_match(w.grad, w_e.grad, ".grad")


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_grad_scaler_matches_eager_as_a_capture(remove):
    # GradScaler reads whether a gradient is infinite (.item()): capture guards the read
    # (Note [Capture: guards on values read]); make_fx refuses it, as plain make_fx does.
    assert_client_matches_eager(grad_scaler, mlp_inputs, remove=remove, graphs=("capture",))
    with pytest.raises(RuntimeError, match="value out of a tracing tensor"):
        make_fx(functionalize(grad_scaler, remove=remove))(*mlp_inputs())


def _averaged_copy_of_an_outside_module(p, x, y):
    # copy.deepcopy of a module that lives outside f: its copies are tensors f made, written with
    # f's values (Note [API: deep copies of plain tensors inside the function]).
    averaged = torch.optim.swa_utils.AveragedModel(copy.deepcopy(MLP))
    mse(functional_call(MLP, p, (x,)), y).backward()
    with torch.no_grad():
        for (k, v) in averaged.module.named_parameters():
            v.copy_(p[k])
    averaged.update_parameters(averaged.module)
    return averaged(x), [t.detach().clone() for t in averaged.parameters()]


def _update_bn_of_an_outside_module(x):
    # swa_utils.update_bn over an AveragedModel of a module from outside f: the copy's buffers
    # are reset and then written by training-mode batch norms of f's inputs.
    averaged = torch.optim.swa_utils.AveragedModel(NORMED)
    averaged.update_parameters(NORMED)
    torch.optim.swa_utils.update_bn([x[:5], x[5:]], averaged)
    return averaged(x), [b.clone() for b in averaged.module.buffers()]


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_averaged_copy_of_an_outside_module_matches_eager(remove):
    assert_client_matches_eager(_averaged_copy_of_an_outside_module, mlp_inputs, remove=remove,
                                graphs=("make_fx", "capture"))


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_update_bn_of_an_outside_module_matches_eager(remove):
    # AveragedModel counts its updates in a buffer read with bool(): capture guards it, make_fx
    # refuses it (as plain make_fx does).
    assert_client_matches_eager(_update_bn_of_an_outside_module, lambda: (torch.randn(10, 4),),
                                remove=remove, graphs=("capture",))


def test_deep_copy_of_an_outside_module_gives_tensors_of_the_function():
    def f(x):
        model = copy.deepcopy(NORMED)
        copies = list(model.state_dict().values())
        assert all(is_functional(t) for t in copies)
        assert all(torch.equal(a, b) for a, b in zip(copies, NORMED.state_dict().values()))
        assert all(type(p) is nn.Parameter and p.is_leaf and p.requires_grad
                   for p in model.parameters())
        return model(x)

    before = dict(copy.deepcopy(NORMED.state_dict()))
    functionalize(f)(torch.randn(5, 4))
    assert_trees_match(dict(NORMED.state_dict()), before, "the original is untouched")


def test_deep_copy_of_outside_tensors_that_share_memory_is_refused_by_name():
    # Eager's copies would share memory as the originals do; ours would not: refused.
    shared = torch.arange(6.)

    def f(x):
        return copy.deepcopy([shared, shared[2:]])

    with pytest.raises(NotImplementedError, match="deepcopy inside the function of two tensors"):
        functionalize(f)(torch.ones(1))
