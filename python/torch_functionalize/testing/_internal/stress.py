"""Soak and thread stress for torch_functionalize (issue #12, item 4): the program mix, the
check of one program against eager, `soak` (memory and live tensors over many calls) and
`threads` (concurrent functionalize calls beside eager code). tools/stress.py is the command
line (the long runs); test/python/test_stress.py runs short versions of both.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from torch_functionalize import functionalize
from torch_functionalize.cli.programs import PROGRAMS
from torch_functionalize.testing import compare

# --- the program mix -----------------------------------------------------------------------------


def _foreach_step(a, b, c):
    torch._foreach_mul_([a, b], 0.9)
    torch._foreach_add_([a, b], [c, c], alpha=0.1)
    return a.sum() + b.sum()


def _batch_norm_train(x, mean, var):
    return F.batch_norm(x, mean, var, training=True, momentum=0.1)


def _index_and_out(x, idx):
    y = torch.zeros(4, 3)
    y.index_put_((idx,), x[:2])
    out = torch.empty(0)
    torch.mul(y, 2, out=out)
    return out


def _view_chain_and_resize(x):
    v = x.clone()
    w = v.view(-1)[2:].view(2, -1).t()
    w.mul_(3)
    total = w.sum()
    del w  # growing past the storage with views alive is refused (a documented limit)
    v.resize_(20)
    return v[:12].view(3, 4) + total


def _autograd_step(p, x):
    # A training step inside f: a leaf made inside f, .backward() (AccumulateGrad hooks), tanh
    # (a saved output, kept for tracers), an update of the input under no_grad.
    w = p.detach().requires_grad_()
    loss = (x @ w).tanh().sum()
    loss.backward()
    with torch.no_grad():
        p.sub_(0.1 * w.grad)
    return loss.detach()


def _aliased_inputs(x, xv):
    xv.add_(1)
    x[0].mul_(2)
    return x + xv.sum()


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    make_inputs: Callable[[], tuple]


def programs() -> list[Program]:
    """The mix: the demo programs plus optimizer-, batch-norm-, indexing-, view-chain-, autograd-
    and aliasing-shaped ones. Inputs are deterministic so that expected values can be computed once."""

    def seeded(shapes):
        def make():
            g = torch.Generator(torch.get_default_device()).manual_seed(0)
            return tuple(torch.randn(*s, generator=g) for s in shapes)

        return make

    mix = [Program(name, fn, seeded(shapes)) for name, (fn, shapes) in PROGRAMS.items()]
    mix += [
        Program("foreach_step", _foreach_step, seeded([(8,), (8,), (8,)])),
        Program(
            "batch_norm_train",
            _batch_norm_train,
            lambda: (torch.randn(4, 3, generator=torch.Generator(torch.get_default_device()).manual_seed(1)),
                     torch.zeros(3), torch.ones(3)),
        ),
        Program(
            "index_and_out",
            _index_and_out,
            lambda: (torch.randn(3, 3, generator=torch.Generator(torch.get_default_device()).manual_seed(2)),
                     torch.tensor([3, 0])),
        ),
        Program("view_chain_and_resize", _view_chain_and_resize, seeded([(12,)])),
        Program("autograd_step", _autograd_step, seeded([(3, 2), (4, 3)])),
        Program(
            "aliased_inputs",
            _aliased_inputs,
            lambda: (lambda b: (b, b.view(-1)))(
                torch.randn(3, 4, generator=torch.Generator(torch.get_default_device()).manual_seed(3))),
        ),
    ]
    return mix


class CountOps(TorchDispatchMode):
    """Counts the ATen ops dispatched while it is active (after CompositeImplicitAutograd
    decomposition); the benchmarks count with it too."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_per_call(program: Program) -> int:
    """ATen ops one eager call of the program runs (what functionalize intercepts)."""
    with CountOps() as counter:
        program.fn(*program.make_inputs())
    return max(counter.count, 1)


@dataclass
class Expected:
    outputs: object
    inputs_after: tuple


def expected_of(program: Program) -> Expected:
    inputs = program.make_inputs()
    out = program.fn(*inputs)
    return Expected(out, inputs)


# make_fx patches module-level state while it traces, so torch does not support two traces at
# once on different threads; traces are serialized (functionalize calls are not).
_TRACE_LOCK = threading.Lock()


def check(program: Program, expected: Expected, remove: str, traced: bool) -> str | None:
    """None if one functionalized call (or a traced graph's replay) matches eager."""
    inputs = program.make_inputs()
    if traced:
        with _TRACE_LOCK:
            gm = make_fx(functionalize(program.fn, remove=remove))(*program.make_inputs())
        out = gm(*inputs)
    else:
        out = functionalize(program.fn, remove=remove)(*inputs)
    return compare(out, expected.outputs, "output") or compare(
        inputs, expected.inputs_after, "input")


# --- soak ------------------------------------------------------------------------------------------


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _live_tensors() -> int:
    with warnings.catch_warnings():  # isinstance() on some torch module objects warns
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


@dataclass
class SoakResult:
    ops: int
    calls: int
    seconds: float
    samples: list  # (ops so far, rss MiB, live tensors)
    rss_growth_mib: float
    tensor_growth: int
    failures: list


def soak(total_ops: int, trace_every: int = 50, samples: int = 10) -> SoakResult:
    mix = programs()
    per_call = [ops_per_call(p) for p in mix]
    expected = [expected_of(p) for p in mix]
    modes = ("mutations", "mutations_and_views")
    ops = calls = 0
    points, failures = [], []
    next_sample = total_ops // samples
    start = time.perf_counter()
    while ops < total_ops:
        for k, p in enumerate(mix):
            remove = modes[calls % 2]
            traced = trace_every > 0 and calls % trace_every == trace_every - 1
            problem = check(p, expected[k], remove, traced)
            if problem and len(failures) < 20:
                failures.append(f"{p.name} ({remove}, {'traced' if traced else 'eager'}): {problem}")
            ops += per_call[k]
            calls += 1
        if ops >= next_sample:
            gc.collect()
            points.append((ops, _rss_mib(), _live_tensors()))
            next_sample += total_ops // samples
    seconds = time.perf_counter() - start
    first, last = points[0], points[-1]
    return SoakResult(ops, calls, seconds, points, last[1] - first[1], last[2] - first[2],
                      failures)


# --- threads ---------------------------------------------------------------------------------------


@dataclass
class ThreadsResult:
    threads: int
    calls: int
    seconds: float
    failures: list


def threads(n_threads: int, iterations: int) -> ThreadsResult:
    mix = programs()
    expected = [expected_of(p) for p in mix]
    shared = torch.randn(64, 64, generator=torch.Generator(torch.get_default_device()).manual_seed(7))
    shared_expected = (shared @ shared.t()).sin().sum()
    failures: list[str] = []
    calls = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(n_threads + 1)
    # torch's default device is per thread: a new thread makes its tensors on the CPU whatever the
    # caller set (TFZ_TEST_DEVICE=cuda), so each thread takes the caller's, or its programs' inputs
    # would be CPU tensors checked against CUDA results (the third GPU run, docs/cuda.md).
    device = torch.get_default_device()

    def on_callers_device():
        if device.type != "cpu":
            torch.set_default_device(device)

    def record(problem):
        with lock:
            if len(failures) < 20:
                failures.append(problem)

    def functionalizing(worker: int):
        # Even workers each take their own program; odd workers all run the first program.
        on_callers_device()
        barrier.wait()
        for i in range(iterations):
            k = worker % len(mix) if worker % 2 == 0 else 0
            p = mix[k]
            remove = ("mutations", "mutations_and_views")[(i + worker) % 2]
            try:
                problem = check(p, expected[k], remove, traced=(i % 25 == 24))
                # Reads the tensor the eager thread also reads, inside a functionalized call.
                got = functionalize(lambda s: (s @ s.t()).sin().sum())(shared)
                problem = problem or compare(got, shared_expected, "shared read")
            except Exception as error:  # noqa: BLE001 - reported as a failure
                problem = f"raised {type(error).__name__}: {error}"
            if problem:
                record(f"thread {worker} {p.name} ({remove}): {problem}")
            with lock:
                calls[0] += 1

    def eager():
        on_callers_device()
        barrier.wait()
        for _ in range(iterations):
            # Plain eager code must see no trace of the other threads' functionalize layers.
            y = shared.clone()
            y.add_(1).mul_(2)
            got = (shared @ shared.t()).sin().sum()
            problem = compare(got, shared_expected, "eager read") or compare(
                y, (shared + 1) * 2, "eager write")
            if problem or type(y) is not torch.Tensor:
                record(f"eager thread: {problem or type(y)}")

    workers = [threading.Thread(target=functionalizing, args=(w,)) for w in range(n_threads - 1)]
    workers.append(threading.Thread(target=eager))
    for t in workers:
        t.start()
    start = time.perf_counter()
    barrier.wait()
    for t in workers:
        t.join()
    return ThreadsResult(n_threads, calls[0], time.perf_counter() - start, failures)
