"""The benchmark workloads: each is a plain PyTorch function plus a recipe for fresh inputs.

Every workload is run by every implementation (eager, ours, torch.func.functionalize,
FunctionalTensorMode) on the same inputs; see benchmarks/README.md for what each one measures.
This file only defines programs and inputs; timing, checking and reporting live in
benchmarks/_harness.py (benchmarks/run.py is the command).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

TINY = 8              # elements of a "tiny" tensor: pure dispatch overhead
LARGE = 1 << 22       # elements of a "large" tensor (16 MiB of float32): bandwidth-bound
TINY_ITERS = 25       # loop trips of the tiny programs (about 100 ATen ops per call)
LARGE_ITERS = 3       # loop trips of the large programs (about 10 ops per call)


@dataclass
class Workload:
    """One program to run under every implementation.

    ``fn(*make_inputs())`` is the program; ``make_inputs`` must return fresh, deterministic
    inputs on every call (programs may mutate them). ``param`` is the x coordinate of a scaling
    series (``series``), ``trace`` says whether make_fx trace time / node count are measured,
    ``memory`` whether peak memory is measured, ``skip`` maps implementation name to the reason it
    is not run (shown as n/a).
    """

    name: str
    group: str
    fn: Callable[..., Any]
    make_inputs: Callable[[], tuple]
    description: str
    series: str | None = None
    param: int | None = None
    trace: bool = False
    memory: bool = False
    quick: bool = True
    skip: dict[str, str] = field(default_factory=dict)
    budget: float = 1.0           # multiplies the harness's timing budget per implementation


def _bind(prog: Callable[..., Any], n: int) -> Callable[..., Any]:
    """prog with its size argument fixed, as a one-argument function (make_fx traces the
    signature, so no defaulted extra parameter)."""
    def fn(x):
        return prog(x, n)
    fn.__name__ = f"{prog.__name__}_{n}"
    return fn


def _seeded(make: Callable[[], tuple]) -> Callable[[], tuple]:
    def fresh() -> tuple:
        torch.manual_seed(0)
        return make()
    return fresh


# ---------------------------------------------------------------------------------------------
# Per-op programs (tiny: overhead; large: extra copies). `iters` loop trips of a 4-op body.

def functional_ops(x: torch.Tensor, iters: int) -> torch.Tensor:
    """No mutation at all: a chain of functional ops on the input."""
    y = x
    for _ in range(iters):
        y = torch.mul(y, 0.5)
        y = torch.add(y, 1.0)
        y = torch.sub(y, 0.25)
        y = torch.div(y, 1.5)
    return y


def inplace_ops(x: torch.Tensor, iters: int) -> torch.Tensor:
    """In-place ops on an intermediate (the input itself is not written)."""
    y = x.clone()
    for _ in range(iters):
        y.mul_(0.5)
        y.add_(1.0)
        y.sub_(0.25)
        y.div_(1.5)
    return y


def view_mutate_read_base(x: torch.Tensor, iters: int) -> torch.Tensor:
    """Mutation through a view (select or slice) of an intermediate, then a read of the base."""
    y = x.clone()
    n = y.shape[0]
    out = y
    for i in range(iters):
        v = y[i % n] if i % 2 == 0 else y[1: n // 2]
        v.add_(1.0)
        out = y.mul(0.5)          # reads the base: the write through v must be visible
        out.sub_(0.25)
    return out


def out_ops(x: torch.Tensor, iters: int) -> torch.Tensor:
    """out= ops writing into preallocated intermediates."""
    a = x.clone()
    b = torch.empty_like(x)
    for _ in range(iters):
        torch.mul(a, 0.5, out=b)
        torch.add(b, 1.0, out=a)
        torch.sub(a, 0.25, out=b)
        torch.div(b, 1.5, out=a)
    return a


PER_OP_PROGRAMS = {
    "functional": (functional_ops, "no mutation: mul/add/sub/div chain on the input"),
    "inplace": (inplace_ops, "mul_/add_/sub_/div_ on a clone of the input"),
    "view_mutate": (view_mutate_read_base,
                    "select/slice view of a clone, add_ through it, read the base (mul, sub_)"),
    "out": (out_ops, "mul/add/sub/div with out= into two preallocated buffers"),
}


def _per_op_workloads() -> list[Workload]:
    result = []
    for key, (prog, desc) in PER_OP_PROGRAMS.items():
        result.append(Workload(
            name=f"tiny/{key}", group="tiny",
            fn=_bind(prog, TINY_ITERS),
            make_inputs=_seeded(lambda: (torch.randn(TINY),)),
            description=f"{desc}; {TINY} elements, {TINY_ITERS} trips",
            trace=True))
        result.append(Workload(
            name=f"large/{key}", group="large",
            fn=_bind(prog, LARGE_ITERS),
            make_inputs=_seeded(lambda: (torch.randn(LARGE),)),
            description=f"{desc}; {LARGE} elements (16 MiB), {LARGE_ITERS} trips",
            memory=True, quick=key in ("inplace", "view_mutate")))
    return result


# ---------------------------------------------------------------------------------------------
# Scaling series.

def program_length(x: torch.Tensor, n_ops: int) -> torch.Tensor:
    """n_ops ops on tiny tensors, a repeated 4-op block: functional, in-place, view, write through
    the view (values converge to 1: no overflow or denormals however long the program)."""
    y = x.clone()
    for _ in range(n_ops // 4):
        z = y.mul(0.5)
        y.lerp_(z, 0.5)
        v = y.view(2, -1)
        v.add_(0.25)
    return y


def live_views(x: torch.Tensor, n_views: int) -> torch.Tensor:
    """n_views live views of one base (overlapping slices of a 16-element intermediate), each
    mutated and then read after all the others were mutated."""
    base = x.clone()
    n = base.shape[0]
    views = [base[i % n: i % n + 1] for i in range(n_views)]
    for v in views:
        v.add_(1.0)
    total = base.sum()
    for v in views:
        total = total + v     # each view is stale here: it must see every earlier write
    return total


def view_chain(x: torch.Tensor, depth: int) -> torch.Tensor:
    """A chain of `depth` views (alternating view(2, -1) / view(-1)); the deepest is mutated and
    the base read."""
    base = x.clone()
    v = base
    for i in range(depth):
        v = v.view(2, -1) if i % 2 == 0 else v.view(-1)
    v.add_(1.0)
    return base.mul(2.0)


def _scaling_workloads() -> list[Workload]:
    result = []
    for n in (1_000, 10_000, 100_000):
        result.append(Workload(
            name=f"scale/length/{n}", group="scale", series="program length (ops)", param=n,
            fn=_bind(program_length, n),
            make_inputs=_seeded(lambda: (torch.randn(TINY),)),
            description=f"{n} ops on {TINY}-element tensors (mul, lerp_, view, add_ through it)",
            quick=n <= 10_000,
            skip={"FTMode": "at about 100 us/op it would take minutes"}
            if n > 10_000 else {},
            budget=2.0 if n >= 10_000 else 1.0))
    for n in (10, 100, 1_000, 10_000):
        result.append(Workload(
            name=f"scale/views/{n}", group="scale", series="live views of one base", param=n,
            fn=_bind(live_views, n),
            make_inputs=_seeded(lambda: (torch.randn(16),)),
            description=f"{n} live slices of one 16-element base, each add_-ed, then each read",
            quick=n <= 1_000,
            skip={"FTMode": "at about 100 us/op it would take minutes"}
            if n > 1_000 else {},
            budget=2.0 if n >= 1_000 else 1.0))
    for n in (10, 100, 1_000):
        result.append(Workload(
            name=f"scale/depth/{n}", group="scale", series="view-chain depth", param=n,
            fn=_bind(view_chain, n),
            make_inputs=_seeded(lambda: (torch.randn(16),)),
            description=f"a chain of {n} views of a 16-element base, add_ on the last, base read",
            quick=n <= 100))
    return result


# ---------------------------------------------------------------------------------------------
# Real workloads.

MLP_IN, MLP_HIDDEN, MLP_OUT, MLP_BATCH, MLP_LR = 256, 512, 10, 64, 0.01


def mlp_train_step(w1, b1, w2, b2, x, y):
    """One SGD step of a 2-layer MLP with a hand-written backward (cross-entropy loss); the
    parameters (inputs) are updated in place. No autograd, so every implementation can run it."""
    h_pre = torch.addmm(b1, x, w1.t())
    h = torch.relu(h_pre)
    logits = torch.addmm(b2, h, w2.t())
    loss = F.cross_entropy(logits, y)
    g_logits = torch.softmax(logits, dim=1)
    g_logits[torch.arange(x.shape[0]), y] -= 1.0      # index_put_ into an intermediate
    g_logits /= x.shape[0]
    g_w2 = g_logits.t() @ h
    g_b2 = g_logits.sum(0)
    g_h = g_logits @ w2
    g_h.mul_(h_pre > 0)                               # relu backward, in place
    g_w1 = g_h.t() @ x
    g_b1 = g_h.sum(0)
    for p, g in ((w1, g_w1), (b1, g_b1), (w2, g_w2), (b2, g_b2)):
        p.sub_(g, alpha=MLP_LR)
    return loss


def _mlp_inputs():
    return (torch.randn(MLP_HIDDEN, MLP_IN) * 0.05, torch.zeros(MLP_HIDDEN),
            torch.randn(MLP_OUT, MLP_HIDDEN) * 0.05, torch.zeros(MLP_OUT),
            torch.randn(MLP_BATCH, MLP_IN), torch.randint(0, MLP_OUT, (MLP_BATCH,)))


_MLP = nn.Sequential(nn.Linear(MLP_IN, MLP_HIDDEN), nn.ReLU(), nn.Linear(MLP_HIDDEN, MLP_OUT))


def mlp_autograd_step(params, x, y):
    """The same step with torch.autograd.grad inside the function (autograd under the transform)."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(functional_call(_MLP, leaves, (x,)), y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    with torch.no_grad():
        for p, g in zip(params.values(), grads):
            p.sub_(g, alpha=MLP_LR)
    return loss.detach()


def _mlp_autograd_inputs():
    params = {k: torch.randn_like(v) * 0.05 for k, v in _MLP.named_parameters()}
    return (params, torch.randn(MLP_BATCH, MLP_IN), torch.randint(0, MLP_OUT, (MLP_BATCH,)))


class ResBlock(nn.Module):
    """conv-bn-relu-conv-bn + identity, relu (ResNet basic block)."""

    def __init__(self, channels: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + x)


_RES = ResBlock().train()


def resnet_block_step(state, x):
    """Training-mode forward of the block: batch norm updates running_mean / running_var /
    num_batches_tracked (inputs) in place."""
    return functional_call(_RES, state, (x,))


def _resnet_inputs():
    state = {k: v.detach().clone() for k, v in _RES.state_dict().items()}
    for k, v in state.items():
        if v.is_floating_point() and "running" not in k:
            v.copy_(torch.randn_like(v) * 0.1)
    return (state, torch.randn(8, 32, 16, 16))


GPT_C, GPT_HEADS, GPT_T, GPT_BATCH, GPT_POS = 128, 4, 256, 4, 100


class GPTBlock(nn.Module):
    """Pre-norm transformer block for one decoding step; keys and values are written into a
    preallocated KV cache (inputs) through slices, then attention reads the filled prefix."""

    def __init__(self, c: int = GPT_C, heads: int = GPT_HEADS):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x, cache_k, cache_v, pos: int):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        cache_k[:, :, pos: pos + t] = k
        cache_v[:, :, pos: pos + t] = v
        y = F.scaled_dot_product_attention(q, cache_k[:, :, : pos + t], cache_v[:, :, : pos + t])
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


_GPT = GPTBlock()


def gpt_kv_cache_step(params, x, cache_k, cache_v):
    return functional_call(_GPT, params, (x, cache_k, cache_v, GPT_POS))


def _gpt_inputs():
    params = {k: torch.randn_like(v) * 0.05 for k, v in _GPT.named_parameters()}
    shape = (GPT_BATCH, GPT_HEADS, GPT_T, GPT_C // GPT_HEADS)
    return (params, torch.randn(GPT_BATCH, 1, GPT_C), torch.randn(shape), torch.randn(shape))


STACK_BLOCKS, STACK_C, STACK_HEADS, STACK_T, STACK_BATCH, STACK_POS = 56, 64, 4, 16, 2, 8
_STACK = nn.ModuleList(GPTBlock(STACK_C, STACK_HEADS) for _ in range(STACK_BLOCKS))


def transformer_stack_step(params, x, caches_k, caches_v):
    """A decoding step through a stack of GPT blocks, each writing its own KV cache (inputs):
    about 2000 ATen ops, the size of a small model's graph."""
    for block, p, ck, cv in zip(_STACK, params, caches_k, caches_v):
        x = functional_call(block, p, (x, ck, cv, STACK_POS))
    return x


def _stack_inputs():
    params = [{k: torch.randn_like(v) * 0.05 for k, v in b.named_parameters()} for b in _STACK]
    shape = (STACK_BATCH, STACK_HEADS, STACK_T, STACK_C // STACK_HEADS)
    caches = [[torch.randn(shape) for _ in _STACK] for _ in range(2)]
    return (params, torch.randn(STACK_BATCH, 1, STACK_C), caches[0], caches[1])


ADAM_PARAMS = 100
ADAM_SHAPE = (32, 32)


def adam_foreach_step(params, grads, exp_avgs, exp_avg_sqs, steps):
    """Adam over a list of parameters with _foreach ops, the tensor-step ("capturable") form of
    torch.optim's _multi_tensor_adam, so it has no .item() and can be traced."""
    lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8
    torch._foreach_add_(steps, 1)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    bias1 = torch._foreach_pow(beta1, steps)
    torch._foreach_sub_(bias1, 1)
    torch._foreach_neg_(bias1)
    bias2 = torch._foreach_pow(beta2, steps)
    torch._foreach_sub_(bias2, 1)
    torch._foreach_neg_(bias2)
    step_size = torch._foreach_div(bias1, lr)
    torch._foreach_reciprocal_(step_size)
    torch._foreach_neg_(step_size)
    torch._foreach_sqrt_(bias2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bias2)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    torch._foreach_mul_(update, step_size)
    torch._foreach_add_(params, update)
    return params


def adam_torch_optim_step(params, grads, exp_avgs, exp_avg_sqs, steps):
    """torch.optim's own functional adam(foreach=True); it reads the step with .item(), so it
    runs eagerly but cannot be traced by make_fx."""
    adam = sys.modules["torch.optim.adam"].adam
    adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, capturable=False,
         differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False,
         amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-3, weight_decay=0.0, eps=1e-8,
         maximize=False)
    return params


def _adam_inputs():
    def tensors():
        return [torch.randn(ADAM_SHAPE) for _ in range(ADAM_PARAMS)]
    return (tensors(), tensors(), [torch.zeros(ADAM_SHAPE) for _ in range(ADAM_PARAMS)],
            [torch.zeros(ADAM_SHAPE) for _ in range(ADAM_PARAMS)],
            [torch.tensor(float(i % 7)) for i in range(ADAM_PARAMS)])


def _real_workloads() -> list[Workload]:
    return [
        Workload("real/mlp_train", "real", mlp_train_step, _seeded(_mlp_inputs),
                 f"SGD step of a {MLP_IN}-{MLP_HIDDEN}-{MLP_OUT} MLP, batch {MLP_BATCH}, "
                 "hand-written backward, parameters updated in place",
                 trace=True, memory=True),
        Workload("real/mlp_autograd", "real", mlp_autograd_step, _seeded(_mlp_autograd_inputs),
                 "the same MLP step with torch.autograd.grad inside the function",
                 trace=True, quick=False),
        Workload("real/resnet_block", "real", resnet_block_step, _seeded(_resnet_inputs),
                 "ResNet basic block (32 channels, 8x16x16), training-mode batch norm updating "
                 "running stats", trace=True, memory=True),
        Workload("real/gpt_kv_cache", "real", gpt_kv_cache_step, _seeded(_gpt_inputs),
                 f"GPT block decoding step (C={GPT_C}, {GPT_HEADS} heads, batch {GPT_BATCH}), "
                 f"k/v written into a {GPT_T}-slot KV cache (input) at position {GPT_POS}",
                 trace=True, memory=True),
        Workload("real/transformer_stack", "real", transformer_stack_step, _seeded(_stack_inputs),
                 f"decoding step through {STACK_BLOCKS} GPT blocks (C={STACK_C}), each writing "
                 f"its {STACK_T}-slot KV cache (inputs): a graph of about 2000 ops",
                 trace=True),
        Workload("real/adam_foreach", "real", adam_foreach_step, _seeded(_adam_inputs),
                 f"Adam step over {ADAM_PARAMS} parameters of {ADAM_SHAPE[0]}x{ADAM_SHAPE[1]} "
                 "with _foreach ops (tensor steps)", trace=True, memory=True),
        Workload("real/adam_torch_optim", "real", adam_torch_optim_step, _seeded(_adam_inputs),
                 "torch.optim.adam.adam(foreach=True) on the same state (eager-only: .item())",
                 quick=False),
    ]


def all_workloads() -> list[Workload]:
    return _per_op_workloads() + _scaling_workloads() + _real_workloads()


def get(name: str) -> Workload:
    for w in all_workloads():
        if w.name == name:
            return w
    raise KeyError(f"no workload named {name!r}")
