"""Benchmark harness: implementations, result checks, timing, tracing and peak memory.

run.py starts one worker process per workload (``python _harness.py --worker NAME``) and one more
per workload for peak memory (``--memory NAME``); each prints a single JSON line prefixed with
RESULT_TAG. Timings use torch.utils.benchmark (one thread, a warm-up, short timed blocks
interleaved across implementations, medians over the blocks). The workloads themselves are in
torch_functionalize.testing._internal.workloads.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import traceback
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils.benchmark import Timer

# The workloads build their modules (ResBlock, GPTBlock, ...) when imported, so the device run.py
# --device names must be the default before that import, or their weights stay on the CPU.
DEVICE = os.environ.get("TFZ_BENCH_DEVICE", "cpu")
if DEVICE != "cpu":
    torch.set_default_device(DEVICE)
from torch_functionalize.testing._internal import workloads  # noqa: E402
from torch_functionalize.testing._internal.stress import CountOps  # noqa: E402

RESULT_TAG = "@@BENCH-RESULT@@ "

# glibc malloc for timing workers (run.py's and reinplace.py's): tensors up to 32 MiB come from the
# heap and freed memory stays there (no trimming), so a freed tensor's pages are reused instead of
# being returned to the OS and faulted back in. glibc's default threshold moves with the
# allocation history, which made large-tensor times swing by up to 2x from one process to the
# next; this is the steady state of a caching allocator. Variables already set in the environment
# win.
TIMING_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                     "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
IMPLS = ("eager", "ours", "torch.func", "FTMode")


# ---------------------------------------------------------------------------------------------
# Implementations: each turns f into a callable with f's signature and eager's side effects.

def ftmode_functionalize(fn: Callable[..., Any]) -> Callable[..., Any]:
    """PyTorch's Python-mode functionalization (FunctionalTensorMode), driven like torch's own
    dispatch_functionalize / AOTAutograd: wrap inputs with FunctionalTensor.to_functional under
    the mode, run, sync and unwrap outputs, then copy mutated inputs back outside the mode."""
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

    def wrapped(*args):
        flat, spec = pytree.tree_flatten(args)
        no_functionalize_above = torch._C._ExcludeDispatchKeyGuard(
            torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        updates = []
        with no_functionalize_above, FunctionalTensorMode():
            f_flat = [FunctionalTensor.to_functional(a) if isinstance(a, torch.Tensor) else a
                      for a in flat]
            out = fn(*pytree.tree_unflatten(f_flat, spec))

            def unwrap(t):
                torch._sync(t)
                return torch._from_functional_tensor(t.elem)

            out = pytree.tree_map_only(FunctionalTensor, unwrap, out)
            for original, f in zip(flat, f_flat):
                if isinstance(f, FunctionalTensor):
                    torch._sync(f)
                    if torch._functionalize_has_data_mutation(f.elem):
                        updates.append((original, torch._from_functional_tensor(f.elem)))
        for original, new in updates:
            original.copy_(new)
        return out

    return wrapped


def make_impl(impl: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if impl == "eager":
        return fn
    if impl == "ours":
        import torch_functionalize
        return torch_functionalize.functionalize(fn)
    if impl == "torch.func":
        return torch.func.functionalize(fn)
    if impl == "FTMode":
        return ftmode_functionalize(fn)
    raise ValueError(impl)


# ---------------------------------------------------------------------------------------------
# Checks.

def _error_text(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {first}"
    return text if len(text) <= 160 else text[:157] + "..."


def mismatch(expected: Any, actual: Any) -> str | None:
    """None if the two pytrees agree (torch_functionalize.testing.compare, float tolerance 1e-4),
    else why not."""
    from torch_functionalize.testing import compare

    return compare(actual, expected, "leaf", rtol=1e-4, atol=1e-4)


def run_and_check(impl: str, w: workloads.Workload, reference: tuple[Any, Any]) -> str | None:
    """Runs impl once on fresh inputs; None if outputs and mutated inputs match eager's."""
    inputs = w.make_inputs()
    out = make_impl(impl, w.fn)(*inputs)
    bad = mismatch(reference[0], out)
    if bad:
        return "output " + bad
    bad = mismatch(reference[1], inputs)
    return "mutated input " + bad if bad else None


def count_aten_ops(w: workloads.Workload) -> int:
    """ATen ops an eager run dispatches (after CompositeImplicitAutograd decomposition)."""
    inputs = w.make_inputs()
    with CountOps() as counter:
        w.fn(*inputs)
    return counter.count


# ---------------------------------------------------------------------------------------------
# Timing.

# The clock: CPU time of the calling thread. Timings run on one thread (Timer's num_threads=1),
# so this counts all of the work, but not the time the shared machine gives to other jobs,
# which wall-clock medians on a loaded 2-core machine do not filter out. --wall switches back.
CLOCK = time.thread_time
SAMPLE_S = 0.02      # target length of one timed block
TIME_BUDGET_S = 0.6  # CPU seconds of timing per implementation and workload (times --scale)
TRACE_BUDGET_S = 0.3 # the same for make_fx trace time (at least one trace after the warm-up)
# FunctionalTensorMode is 10-50x slower than the others; it gets a smaller share of the budget.
BUDGET_SHARE = {"FTMode": 0.3}
SLOW_CALL_S = 0.25   # calls slower than this get 2 timed blocks at least instead of 3


def _timer(stmt: str, glob: dict) -> Timer:
    return Timer(stmt=stmt, globals=glob, num_threads=1, timer=CLOCK)


def _time_block(timer: Timer, number: int) -> float:
    """Seconds per call over one block of `number` calls (gc off, as timeit does). Timer._timeit
    is the primitive Timer.blocked_autorange is built on; Timer.timeit would add at least two
    untimed warm-up calls to every block, tripling the cost of slow ones."""
    return timer._timeit(number) / number


def _block_size(timer: Timer) -> tuple[int, float]:
    """Calls per timed block so that one block takes about SAMPLE_S, and the per-call time of the
    last (full-size) try, which counts as the first block."""
    number = 1
    while True:
        per_call = _time_block(timer, number)
        if per_call * number >= SAMPLE_S or number >= 1 << 20:
            return number, per_call
        number *= 2 if per_call * number > SAMPLE_S / 4 else 10


def interleaved_medians(timers: dict[str, Timer], budget: float, min_blocks: int = 3,
                        slow_min_blocks: int = 2,
                        first_blocks: dict[str, tuple[int, float]] | None = None
                        ) -> dict[str, dict]:
    """Times every timer in turn, one ~SAMPLE_S block each, until each has used its budget
    (`budget` seconds, times BUDGET_SHARE for the slow reference implementations) and timed at
    least `min_blocks` blocks (`slow_min_blocks` for calls slower than SLOW_CALL_S): load changes
    on the machine then hit every implementation alike. `first_blocks` gives (calls per block,
    first per-call time) for timers already timed once; the others get a block size from
    _block_size. Returns the median and interquartile range of the per-call time over the
    blocks."""
    numbers, samples, spent = {}, {}, {}
    for k, timer in timers.items():
        numbers[k], first = first_blocks[k] if first_blocks and k in first_blocks else \
            _block_size(timer)
        samples[k], spent[k] = [first], first * numbers[k]
    budgets = {k: budget * BUDGET_SHARE.get(k, 1.0) for k in timers}
    floor = {k: min(min_blocks, slow_min_blocks) if samples[k][0] > SLOW_CALL_S else min_blocks
             for k in timers}
    while True:
        pending = [k for k in timers if spent[k] < budgets[k] or len(samples[k]) < floor[k]]
        if not pending:
            break
        for k in pending:
            per_call = _time_block(timers[k], numbers[k])
            samples[k].append(per_call)
            spent[k] += per_call * numbers[k]
    result = {}
    for k, ts in samples.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        result[k] = {"status": "ok", "median_s": statistics.median(ts), "iqr_s": q[2] - q[0],
                     "blocks": len(ts), "calls_per_block": numbers[k]}
    return result


def time_impls(w: workloads.Workload, impls: list[str], scale: float) -> dict[str, dict]:
    """Median time per call of each implementation, on its own fresh inputs (inputs are reused
    across calls; the programs keep values bounded). The result check was each transform's
    warm-up call (registration, lazily built tables, imports); eager gets one here."""
    timers = {}
    for impl in impls:
        g = make_impl(impl, w.fn)
        inputs = w.make_inputs()
        if impl == "eager":
            g(*inputs)
        timers[impl] = _timer("g(*inputs)", {"g": g, "inputs": inputs})
    return interleaved_medians(timers, TIME_BUDGET_S * w.budget * scale) if timers else {}


# ---------------------------------------------------------------------------------------------
# Tracing: make_fx(functionalize(f)).

def _call_function_nodes(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


# Ops that write their arguments without saying so in their schema
# (docs/reports/hidden_writes.md): a graph that calls them is not functional, whatever its numbers.
HIDDEN_WRITE_OPS = {"aten.native_batch_norm.default", "aten.cudnn_batch_norm.default",
                    "aten.miopen_batch_norm.default"}


def bytes_written_to_inputs(g: Callable[..., Any], inputs: tuple) -> int:
    """Bytes that ops declared as writing (schema ``(a!)``, and the running stats of the hidden
    writes of training-mode batch norm, HIDDEN_WRITE_OPS) write into the memory of ``inputs``
    during one call of ``g``: elements of each written argument that shares a storage with an
    input, times their size. For a functional graph that is its epilogue; for eager f, what the
    program itself writes to its inputs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    storages = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(inputs)
                if isinstance(t, torch.Tensor)}

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            schema = func._schema
            hidden = str(func) in HIDDEN_WRITE_OPS and len(args) > 5 and args[5]  # training
            for i, a in enumerate(schema.arguments):
                declared = a.alias_info is not None and a.alias_info.is_write
                if not declared and not (hidden and a.name in ("running_mean", "running_var")):
                    continue
                value = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
                for t in pytree.tree_leaves(value):
                    if isinstance(t, torch.Tensor) and \
                            t.untyped_storage().data_ptr() in storages:
                        Count.total += t.numel() * t.element_size()
            return func(*args, **kwargs)

    with Count():
        g(*inputs)
    return Count.total


def _hidden_writes(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes
               if n.op == "call_function" and str(n.target) in HIDDEN_WRITE_OPS)


def trace_impls(w: workloads.Workload, impls: list[str], reference: tuple[Any, Any],
                scale: float) -> dict[str, dict]:
    """make_fx(impl(f)) per implementation, and torch_functionalize.capture(f) (CAPTURE_VARIANTS):
    the median trace time, the graph's call_function node count, its hidden writes, the bytes it
    writes into the inputs, and whether running it on fresh inputs reproduces eager (outputs and
    input mutations). For "eager", f itself is traced (a baseline graph that still mutates). A
    trace of a tiny function warms make_fx up first; each tracer's first trace is timed and gives
    the graph, more traces follow while the budget lasts (traces slower than SLOW_CALL_S: one)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    make_fx(lambda x: x.add(1))(torch.ones(1))
    tracers: dict[str, tuple[str, dict]] = {}  # name -> (timed statement, its globals)
    result, timers, first_blocks = {}, {}, {}
    for impl in impls:
        if impl in w.skip:
            result[impl] = {"status": "skipped", "reason": w.skip[impl]}
        else:
            tracers[impl] = ("holder['gm'] = make_fx(g)(*inputs)",
                             {"make_fx": make_fx, "g": make_impl(impl, w.fn)})
    if "ours" in tracers:
        from torch_functionalize import capture

        for name, stmt in CAPTURE_VARIANTS.items():
            tracers[name] = (stmt, {"capture": capture, "f": w.fn})
    for name, (stmt, glob) in tracers.items():
        try:
            holder: dict[str, Any] = {}
            timer = _timer(stmt, {**glob, "inputs": w.make_inputs(), "holder": holder})
            first = _time_block(timer, 1)
            gm = holder.pop("gm")
            inputs = w.make_inputs()
            out = gm(*inputs)
            # make_fx flattens the output pytree; compare leaf lists.
            bad = mismatch(pytree.tree_leaves(reference[0]), pytree.tree_leaves(out)) or \
                mismatch(reference[1], inputs)
        except Exception as e:  # noqa: BLE001 - any failure of a tracer is a result
            result[name] = {"status": "error", "reason": _error_text(e)}
            continue
        result[name] = {"status": "ok", "nodes": _call_function_nodes(gm),
                        "hidden_writes": _hidden_writes(gm),
                        "input_bytes": bytes_written_to_inputs(gm, w.make_inputs()),
                        "graph_ok": bad is None, "graph_mismatch": bad}
        timers[name], first_blocks[name] = timer, (1, first)
    medians = interleaved_medians(timers, TRACE_BUDGET_S * scale, min_blocks=3,
                                  slow_min_blocks=1, first_blocks=first_blocks)
    for name, res in medians.items():
        result[name]["time_s"] = res["median_s"]
        result[name]["traces"] = res["blocks"]
    return result


# torch_functionalize.capture, timed beside make_fx: "capture" returns the graph (code generated on
# first use, Note [Capture: code generated on first use]); "capture+codegen" also generates it.
CAPTURE_VARIANTS = {
    "capture": "holder['gm'] = capture(f, *inputs)",
    "capture+codegen": "holder['gm'] = capture(f, *inputs); holder['gm'].real_recompile()",
}


# ---------------------------------------------------------------------------------------------
# Worker entry points.

def worker(name: str, scale: float, impls: list[str]) -> dict:
    torch.set_num_threads(1)
    w = workloads.get(name)
    result: dict[str, Any] = {
        "name": w.name, "group": w.group, "series": w.series, "param": w.param,
        "description": w.description, "impls": {}, "trace": {}}
    t0 = time.perf_counter()
    result["aten_ops"] = count_aten_ops(w)

    ref_inputs = w.make_inputs()
    ref_out = w.fn(*ref_inputs)
    reference = (ref_out, ref_inputs)

    runnable = []
    for impl in impls:
        if impl in w.skip:
            result["impls"][impl] = {"status": "skipped", "reason": w.skip[impl]}
            continue
        try:
            bad = run_and_check(impl, w, reference) if impl != "eager" else None
        except Exception as e:  # noqa: BLE001 - any failure of an implementation is a result
            result["impls"][impl] = {"status": "error", "reason": _error_text(e)}
            continue
        if bad:
            result["impls"][impl] = {"status": "mismatch", "reason": bad}
            continue
        runnable.append(impl)
    t1 = time.perf_counter()
    result["impls"].update(time_impls(w, runnable, scale))
    t2 = time.perf_counter()
    if w.trace:
        result["trace"] = trace_impls(w, impls, reference, scale)
    t3 = time.perf_counter()
    result["phases_s"] = {"check": t1 - t0, "time": t2 - t1, "trace": t3 - t2}
    return result


def _proc_status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def allocation_events(g: Callable[..., Any], inputs: tuple) -> list[tuple[int, int]]:
    """(time ns, bytes: + allocated, - freed) of every CPU tensor allocation event during one
    call, from torch.profiler with profile_memory=True (exact, independent of malloc's caching).
    Shared with benchmarks/distributed_step.py."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = g(*inputs)
        del out
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if isinstance(fields, torch._C._profiler._ExtraFields_Allocation) and \
                fields.device.type == "cpu":
            events.append((node.start_time_ns, fields.alloc_size))
        stack.extend(node.children)
    return sorted(events)


def peak_live(events: list[tuple[int, int]]) -> int:
    """Peak bytes live above the start, over time-sorted allocation events."""
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak


def _allocator_peak(g: Callable[..., Any], inputs: tuple) -> int:
    """Peak bytes of CPU tensor memory allocated during one call above what was live before it."""
    return peak_live(allocation_events(g, inputs))


def memory_worker(name: str, impls: list[str]) -> dict:
    """Peak memory of one call of each implementation, two ways, after a warm-up call:
    - allocator: peak live CPU tensor bytes above those live before the call (torch.profiler
      allocation events); the figure the tables and the memory target use;
    - rss: peak resident memory above the RSS before the call (Linux clear_refs resets the
      high-water mark). Needs MALLOC_MMAP_THRESHOLD_ (run.py sets it) so that freed tensors go
      back to the OS; only meaningful for tensors well above 64 KiB.
    Implementations run one after the other in this process, each from a collected heap."""
    torch.set_num_threads(1)
    w = workloads.get(name)
    result: dict[str, Any] = {"name": name, "memory": {}}
    for impl in impls:
        if impl in w.skip:
            result["memory"][impl] = {"status": "skipped", "reason": w.skip[impl]}
            continue
        try:
            g = make_impl(impl, w.fn)
            inputs = w.make_inputs()
            g(*inputs)  # warm-up: imports, registration, lazily built tables
            gc.collect()
            before = _proc_status_kib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            out = g(*inputs)
            rss_peak = _proc_status_kib("VmHWM")
            del out
            gc.collect()
            alloc_peak = _allocator_peak(g, inputs)
            del inputs, g
            gc.collect()
        except Exception as e:  # noqa: BLE001
            result["memory"][impl] = {"status": "error", "reason": _error_text(e)}
            continue
        result["memory"][impl] = {"status": "ok", "peak_bytes": alloc_peak,
                                  "rss_peak_bytes": (rss_peak - before) * 1024}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worker", metavar="NAME")
    parser.add_argument("--memory", metavar="NAME")
    parser.add_argument("--impl", action="append", help="only these implementations")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies every timing budget (run.py --quick passes 0.25)")
    parser.add_argument("--wall", action="store_true",
                        help="time wall-clock instead of the thread's CPU time")
    args = parser.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    if DEVICE != "cpu":
        # Every factory in the workloads makes its tensors there (the default device, set above);
        # the clock waits for the device.
        def synchronized_clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()

        CLOCK = synchronized_clock
    try:
        impls = args.impl or list(IMPLS)
        if args.worker:
            res = worker(args.worker, args.scale, impls)
        elif args.memory:
            res = memory_worker(args.memory, impls)
        else:
            parser.error("pass --worker NAME or --memory NAME")
    except Exception as e:  # noqa: BLE001 - report, never crash the driver
        traceback.print_exc()
        res = {"name": args.worker or args.memory, "fatal": _error_text(e)}
    print(RESULT_TAG + json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
