"""A data-parallel training step, functionalized: forward, backward, gradient all_reduce, SGD.

    torchrun --nproc-per-node 2 examples/distributed/ddp_step.py

Runs on CPU with gloo. Each rank holds a replica of a small MLP and its own batch; the step
computes gradients with torch.func.grad, averages them with dist.all_reduce (in place, as DDP
does) and updates the parameters in place. `functionalize(step)` runs the same step without
mutations: the all_reduce becomes `_c10d_functional.all_reduce` + `wait_tensor` on the group's
name, and the parameter updates become the copy_ epilogue. Rank 0 prints the functional graph;
every rank checks eager, functionalize(step) and the graph's replay against each other (loss and
updated parameters) and the script exits non-zero if any differs.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from torch_functionalize import functionalize
from torch_functionalize.testing import check_against_eager

LR = 0.1


def loss_fn(params, x, y):
    w1, b1, w2, b2 = params
    h = torch.tanh(x @ w1 + b1)
    return ((h @ w2 + b2 - y) ** 2).mean()


def step(w1, b1, w2, b2, x, y):
    """One DDP-style step; updates the parameters in place and returns the local loss."""
    params = (w1, b1, w2, b2)
    grads, loss = torch.func.grad_and_value(loss_fn)(params, x, y)
    world = dist.get_world_size()
    for g in grads:
        dist.all_reduce(g)  # in place: every rank gets the sum of the gradients
        g.div_(world)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(LR * g)
    return loss


def make_inputs(rank):
    torch.manual_seed(0)  # the same replica on every rank
    params = (torch.randn(4, 8), torch.zeros(8), torch.randn(8, 1), torch.zeros(1))
    torch.manual_seed(100 + rank)  # a different batch per rank
    x = torch.randn(16, 4)
    y = x.sum(1, keepdim=True).sin()
    return (*params, x, y)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    inputs = make_inputs(rank)

    graph = make_fx(functionalize(step))(*make_inputs(rank))
    if rank == 0:
        print("# make_fx(functionalize(step)): the functional graph of one step")
        print(graph.code)

    problem = check_against_eager(
        step, inputs, [("functionalize(step)", functionalize(step)), ("graph replay", graph)]
    )
    # Replicas must stay identical: compare rank 0's updated parameters with everyone's.
    updated = list(make_inputs(rank))
    functionalize(step)(*updated)
    flat = torch.cat([p.reshape(-1) for p in updated[:4]])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    if problem is None and not torch.equal(flat, reference):
        problem = "replicas differ after the step"
    print(f"rank {rank}: {'OK, matches eager' if problem is None else 'MISMATCH: ' + problem}")
    dist.destroy_process_group()
    return 0 if problem is None else 1


if __name__ == "__main__":
    code = main()
    # Leave without interpreter finalization: torch's gloo backend can abort at exit ("terminate
    # called without an active exception") when its worker threads outlive the interpreter, even
    # after destroy_process_group (pytorch/pytorch#190489, #179291); the check has run.
    sys.stdout.flush()
    os._exit(code)
