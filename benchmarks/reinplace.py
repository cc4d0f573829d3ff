"""Functional programs against eager's cost (issue #33): peak memory and time of one call, per
workload and variant, each variant in a fresh process, written to results_reinplace.md.

  python benchmarks/reinplace.py                 # every workload (about 8 minutes on 2 cores)
  python benchmarks/reinplace.py --only 'large/*' --out /tmp/r.md

Variants: eager; ours eager-mode (functionalize(f) called); ours graph (capture(f) replayed);
ours reinplaced (reinplace(capture(f)) replayed); ours C++ reinplaced (capture's C++ graph after
tfz::reinplace, the pass a LibTorch program gets, replayed); torch.func + PyTorch's
torch.fx.passes.reinplace on make_fx(torch.func.functionalize(f)); Inductor's reinplacing pass
(torch._inductor.fx_passes.reinplace) on that same graph, where it runs. Each variant's result
(outputs and inputs afterwards) is checked against eager before it is measured. Peak memory is
the allocator's peak of live CPU tensor bytes during one call above what was live before it
(torch.profiler allocation events); time is the median of up to 400 calls (2 s) on the same
inputs, after a warm-up call, on the CPU clock of the calling thread (time.thread_time, as
benchmarks/run.py: with one intra-op thread all work runs there, and on a shared 2-core machine
wall-clock medians moved by 2-3x between processes with other jobs' load). Each variant runs in
its own process, one after the other, with run.py's malloc settings for timing (TIMING_MALLOC_ENV:
freed tensors up to 32 MiB reused from the heap, as a caching allocator would, instead of being
unmapped and faulted back in on the next call). Rejected: MALLOC_MMAP_THRESHOLD_=65536, used
here before: every buffer above 64 KiB then cost its page faults on every call, which made a
1 MiB undo copy cost twice its copy and the eager-mode column swing between 1.7x and 7x.

  python benchmarks/reinplace.py --device cuda   # the same on CUDA tensors

On CUDA (`--device cuda`), peak memory is the caching allocator's peak of allocated bytes during
the call above those allocated before it (torch.cuda.max_memory_allocated, exact for tensor bytes),
the clock waits for the device, and every variant runs in one process, one after the other.
Rejected on CUDA: a process per variant, as on the CPU. A fresh process guards the CPU figures
against malloc's state; the CUDA allocator's counters need no such guard, and each process would
pay CUDA's start-up (~20 s on the GPU machines here) 63 times.
"""
from __future__ import annotations

import argparse
import fnmatch
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from typing import Any, Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_TAG = "@@REINPLACE-RESULT@@ "
VARIANTS = ("eager", "ours eager-mode", "ours graph", "ours reinplaced", "ours C++ reinplaced",
            "torch.func + fx reinplace", "Inductor reinplace")
MIB = 1 << 20


# -- workloads --------------------------------------------------------------------------------
# Large-tensor programs of the shapes issue #33 names; each maker returns fresh inputs.

def kv_cache_decode(cache, pos, k):
    """One decode step: the new key written into its slot, then a read of a few slots."""
    cache.index_copy_(2, pos, k)
    return cache.index_select(2, torch.tensor([0, 1, 2, 3])).sum()


def _kv_inputs():
    return (torch.zeros(1, 32, 4096, 256), torch.tensor([7]), torch.randn(1, 32, 1, 256))


def slice_writes(x, y):
    """Column slices of a large input written, one by a copy, one by an in-place op."""
    x[:, 0:64] = y
    x[:, 1000:1064].mul_(2)
    return x[:, 64:128].sum()


def _slice_inputs():
    return (torch.randn(4096, 8192), torch.randn(4096, 64))


def residual_block(x, w1, w2):
    """An in-place residual block: x += relu(x @ w1) @ w2."""
    x.add_(torch.relu(x @ w1) @ w2)
    return x.mean()


def _residual_inputs():
    return (torch.randn(16384, 1024), torch.randn(1024, 256) * 0.03,
            torch.randn(256, 1024) * 0.03)


def _large_adam_inputs():
    def tensors():
        return [torch.randn(1024, 1024) for _ in range(16)]
    return (tensors(), tensors(), [torch.zeros(1024, 1024) for _ in range(16)],
            [torch.zeros(1024, 1024) for _ in range(16)],
            [torch.tensor(float(i % 7)) for i in range(16)])


def _adam_step(params, grads, exp_avgs, exp_avg_sqs, steps):
    from torch_functionalize.testing._internal.workloads import adam_foreach_step
    adam_foreach_step(params, grads, exp_avgs, exp_avg_sqs, steps)
    return None


def _workloads() -> dict[str, tuple[Callable[..., Any], Callable[[], tuple], str]]:
    from torch_functionalize.testing._internal import workloads as real

    table = {
        "large/kv_cache_decode": (kv_cache_decode, _kv_inputs,
                                  "index_copy_ of one slot into a 128 MiB KV cache, then a read"),
        "large/slice_writes": (slice_writes, _slice_inputs,
                               "two column-slice writes into a 128 MiB input"),
        "large/foreach_adam": (_adam_step, _large_adam_inputs,
                               "Adam (_foreach ops) over 16 parameters of 4 MiB (256 MiB state)"),
        "large/residual_block": (residual_block, _residual_inputs,
                                 "x += relu(x @ w1) @ w2 on a 64 MiB input"),
    }
    for name in ("real/gpt_kv_cache", "real/adam_foreach", "real/mlp_train",
                 "real/resnet_block", "real/transformer_stack"):
        w = real.get(name)
        table[name] = (w.fn, w.make_inputs, w.description)
    return table


# -- one variant in this process --------------------------------------------------------------

def _callable(variant: str, fn: Callable[..., Any], make_inputs: Callable[[], tuple]):
    import torch_functionalize as tfz
    from torch.fx.experimental.proxy_tensor import make_fx

    if variant == "eager":
        return fn
    if variant == "ours eager-mode":
        return tfz.functionalize(fn)
    if variant == "ours graph":
        return tfz.capture(fn, *make_inputs())
    if variant == "ours reinplaced":
        return tfz.reinplace(tfz.capture(fn, *make_inputs()))
    if variant == "ours C++ reinplaced":
        from torch_functionalize import _C
        from torch_functionalize.capture import _capture
        return _capture(fn, make_inputs(), {}, "mutations", False,
                        graph_pass=lambda graph: _C._reinplace_graph(graph)[0])
    # torch.func's graph traced with fake tensors: one fake mode for every node's meta value,
    # which both passes read (a "real" trace gives each input its own mode, and PyTorch's pass
    # then refuses the graph's constants).
    from torch._guards import detect_fake_mode
    gm = make_fx(torch.func.functionalize(fn), tracing_mode="fake")(*make_inputs())
    values = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    if variant == "torch.func + fx reinplace":
        from torch.fx.passes.reinplace import reinplace
        return reinplace(gm, *values)
    if variant == "Inductor reinplace":
        from torch._inductor.fx_passes.reinplace import reinplace_inplaceable_ops
        from torch._inductor.fx_utils import FakeTensorUpdater
        from torch._inductor.virtualized import V
        # FakeTensorUpdater takes the GraphModule in recent torch, the Graph in 2.11.
        first = list(inspect.signature(FakeTensorUpdater.__init__).parameters)[1]
        updater = FakeTensorUpdater(gm.graph if first == "graph" else gm)
        with V.set_fake_mode(detect_fake_mode(values)):
            reinplace_inplaceable_ops(updater, gm.graph)
        _as_inductor_lowers_foreach_writes(gm.graph)
        gm.recompile()
        return gm
    raise ValueError(variant)


def _as_inductor_lowers_foreach_writes(graph: torch.fx.Graph) -> None:
    """Inductor's pass turns `_foreach_add` into `_foreach_add_` but leaves the getitems of its
    result, which Inductor's lowering of the in-place op reads as the written tensors; the
    op itself returns None, so in Python each getitem becomes the tensor it names."""
    import operator

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and \
                isinstance(node.args[0], torch.fx.Node) and \
                isinstance(node.args[0].target, torch._ops.OpOverload) and \
                node.args[0].target.name().startswith("aten::_foreach_") and \
                node.args[0].target._schema.returns == []:
            node.replace_all_uses_with(node.args[0].args[0][node.args[1]])
            graph.erase_node(node)


def _peak_bytes(g: Callable[..., Any], inputs: tuple) -> int:
    """Peak live CPU tensor bytes during one call above those live before it (the allocator
    events of _harness.py, shared with run.py's memory table)."""
    from _harness import allocation_events, peak_live

    return peak_live(allocation_events(g, inputs))


def _cuda_peak_bytes(g: Callable[..., Any], inputs: tuple) -> int:
    """Peak CUDA bytes allocated during one call above those allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = g(*inputs)
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before


def _clock(device: str) -> Callable[[], float]:
    if device == "cpu":
        return time.thread_time

    def synchronized() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()
    return synchronized


def worker(name: str, variant: str, device: str = "cpu") -> dict[str, Any]:
    from torch_functionalize.testing import compare

    torch.set_num_threads(1)
    if device != "cpu":
        torch.set_default_device(device)  # before the workloads build their modules
    clock = _clock(device)
    fn, make_inputs, _ = _workloads()[name]
    maker = make_inputs

    def make_inputs() -> tuple:  # the same values on every call
        torch.manual_seed(0)
        return maker()

    try:
        g = _callable(variant, fn, make_inputs)
        expected_inputs = make_inputs()
        expected = fn(*expected_inputs)
        inputs = make_inputs()
        actual = g(*inputs)
        problem = compare((actual, inputs), (expected, expected_inputs), "result", atol=1e-4,
                          rtol=1e-4)
        if problem is not None:
            return {"status": "wrong", "reason": problem[:300]}
        del expected, expected_inputs, actual
        inputs = make_inputs()
        g(*inputs)  # warm-up
        peak = _peak_bytes(g, inputs) if device == "cpu" else _cuda_peak_bytes(g, inputs)
        times: list[float] = []
        budget = time.perf_counter() + 2.0
        while len(times) < 5 or (time.perf_counter() < budget and len(times) < 400):
            t0 = clock()
            g(*inputs)
            times.append(clock() - t0)
        return {"status": "ok", "peak": peak, "time": statistics.median(times)}
    except Exception as e:  # noqa: BLE001  (a variant that fails is a result, shown as n/a)
        return {"status": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


# -- the run ----------------------------------------------------------------------------------

def _run(name: str, variant: str) -> dict[str, Any]:
    from _harness import TIMING_MALLOC_ENV
    env = dict(TIMING_MALLOC_ENV, **os.environ)  # variables already set win, as in run.py
    proc = subprocess.run([sys.executable, __file__, "--worker", name, variant],
                          capture_output=True, text=True, env=env, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return {"status": "error", "reason": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def _run_all_cuda(names: list[str], device: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Every workload and variant in one process on `device` (the module header says why)."""
    results: dict[str, dict[str, dict[str, Any]]] = {
        n: {v: {"status": "error", "reason": "the worker process ended before this variant"}
            for v in VARIANTS} for n in names}
    with subprocess.Popen([sys.executable, __file__, "--device", device, "--worker-all"] + names,
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # results as they come: a run cut short still shows its part
            if line.startswith(RESULT_TAG):
                name, variant, r = json.loads(line[len(RESULT_TAG):])
                results[name][variant] = r
                print(f"{name:<24} {variant:<26} {r}", flush=True)
    return results


def _fmt_bytes(b: int) -> str:
    return f"{b / MIB:.1f} MiB"


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def _targets(results: dict[str, dict[str, dict]]) -> list[tuple[str, str, str]]:
    rows = []
    for variant, mem_ratio, time_ratio in (("ours reinplaced", 1.1, 2.0),
                                           ("ours C++ reinplaced", 1.1, 2.0),
                                           ("ours eager-mode", 1.25, 2.0)):
        misses, worst_mem, worst_time = [], 0.0, 0.0
        for name, r in results.items():
            e, v = r.get("eager", {}), r.get(variant, {})
            if e.get("status") != "ok" or v.get("status") != "ok":
                misses.append(f"{name} (n/a)")
                continue
            mem_ok = v["peak"] <= mem_ratio * e["peak"] + 8 * MIB
            t = v["time"] / e["time"]
            worst_time = max(worst_time, t)
            worst_mem = max(worst_mem, (v["peak"] - 8 * MIB) / max(e["peak"], 1))
            if not mem_ok or t > time_ratio:
                misses.append(f"{name} (peak {_fmt_bytes(v['peak'])} vs "
                              f"{_fmt_bytes(e['peak'])}, time {t:.2f}x)")
        target = (f"{variant}: peak <= {mem_ratio}x eager's + 8 MiB and time <= {time_ratio}x "
                  "on every workload")
        measured = "met everywhere" if not misses else "missed on " + "; ".join(misses)
        rows.append((target, f"worst time {worst_time:.2f}x; {measured}",
                     "MET" if not misses else "NOT MET"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "VARIANT"))
    parser.add_argument("--worker-all", nargs="+", metavar="WORKLOAD")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--only", action="append", metavar="GLOB")
    parser.add_argument("--out", default=os.path.join(HERE, "results_reinplace.md"))
    parser.add_argument("--from-json", metavar="PATH",
                        help="write the tables from a run's raw results (the .json beside --out)")
    args = parser.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(*args.worker, device=args.device)), flush=True)
        return
    if args.worker_all:
        for name in args.worker_all:
            for variant in VARIANTS:
                r = worker(name, variant, device=args.device)
                print(RESULT_TAG + json.dumps([name, variant, r]), flush=True)
        return
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    table = _workloads()
    raw = os.path.splitext(args.out)[0] + ".json"
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        results, header = saved["results"], saved["header"]
        names = list(results)
    else:
        names = [n for n in table
                 if not args.only or any(fnmatch.fnmatch(n, g) for g in args.only)]
        start = time.time()
        if args.device == "cpu":
            results = {}
            for name in names:
                results[name] = {}
                for variant in VARIANTS:
                    results[name][variant] = r = _run(name, variant)
                    print(f"{name:<24} {variant:<26} {r}", flush=True)
            where = "1 thread; each variant in a fresh process"
        else:
            results = _run_all_cuda(names, args.device)
            where = (f"{args.device} ({torch.cuda.get_device_name(args.device)}); every variant in "
                     "one process; peak = CUDA allocator's max allocated above the start")
        header = (f"- date: {datetime.now().isoformat(timespec='seconds')}, wall time "
                  f"{time.time() - start:.0f} s; torch {torch.__version__}; {where}")
        with open(raw, "w") as f:
            json.dump({"header": header, "results": results}, f, indent=1)
    lines = [
        "# Reinplacing: functional programs against eager's cost (issue #33)", "",
        "Generated by `python benchmarks/reinplace.py" +
        (f" --device {args.device}" if args.device != "cpu" else "") +
        "` (see its header for the method).", "",
        header, "",
        "## Targets", "", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {r} |" for t, m, r in _targets(results)]
    for what, key, fmt in (("Peak memory of one call above the inputs (ratio to eager)", "peak",
                            _fmt_bytes), ("Median time of one call (ratio to eager)", "time",
                                          _fmt_time)):
        lines += ["", f"## {what}", "", "| workload | " + " | ".join(VARIANTS) + " |",
                  "|---|" + "---|" * len(VARIANTS)]
        for name in names:
            e = results[name]["eager"]
            cells = []
            for variant in VARIANTS:
                r = results[name][variant]
                if r["status"] != "ok":
                    cells.append(f"n/a ({r['status']})")
                elif variant == "eager" or e.get("status") != "ok":
                    cells.append(fmt(r[key]))
                elif key == "peak" and e[key] < MIB:  # a ratio to a few bytes says nothing
                    cells.append(f"{fmt(r[key])} ({(r[key] - e[key]) / MIB:+.1f} MiB)")
                else:
                    ratio = r[key] / e[key] if e[key] > 0 else float("inf")
                    cells.append(f"{fmt(r[key])} ({ratio:.2f}x)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [(n, v, r["reason"]) for n in names for v, r in results[n].items()
             if r["status"] != "ok"]
    if notes:
        lines += ["", "## Variants that did not run or were wrong", ""]
        lines += [f"- {n}, {v}: {reason}" for n, v, reason in notes]
    lines += ["", "## Workloads", ""] + [f"- {n}: {table[n][2]}" for n in names]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
