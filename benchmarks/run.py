"""The benchmark command: ours vs torch.func.functionalize vs FunctionalTensorMode vs eager.

    python benchmarks/run.py            # full run (4-10 minutes on 2 cores)
    python benchmarks/run.py --quick    # smoke run (1-2 minutes)
    python benchmarks/run.py --only tiny/inplace --only 'scale/views/*'
    python benchmarks/run.py --device cuda   # inputs on the GPU, wall clock, writes results-cuda.md

Each workload runs in its own process (_harness.py --worker), peak memory in one more process per
workload (_harness.py --memory). Results are checked against eager before anything is timed. Prints
the tables and the targets of issue #4 (MET / NOT MET), writes them to benchmarks/results.md and
the scaling curves to benchmarks/scaling.png. See benchmarks/README.md for how to read them.
"""
from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import math
import os
import platform
import subprocess
import sys
import time

# _harness.py (beside this script) first: it makes TFZ_BENCH_DEVICE the default device before the
# workloads build their modules.
from _harness import IMPLS, RESULT_TAG, TIMING_MALLOC_ENV
from torch_functionalize.testing._internal import workloads

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER_TIMEOUT_S = 600
MEMORY_TIMEOUT_S = 180
LINEAR_SLOPE_MAX = 1.25     # log-log slope of the largest step that still counts as linear
MEMORY_SLACK = (1.05, 512 * 1024)   # ours <= torch.func * 1.05 + 512 KiB counts as "no worse"


# ---------------------------------------------------------------------------------------------
# Running the workers.



def _run_worker(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    cmd = [sys.executable, os.path.join(HERE, "_harness.py")] + argv
    try:
        # TFZ_BENCH_DEVICE (set by --device) reaches the worker through os.environ.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**(env or {}), **os.environ})
    except subprocess.TimeoutExpired:
        return {"fatal": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"fatal": f"worker exited with {proc.returncode}: {tail[0][:200]}"}


def run_all(selected: list[workloads.Workload], scale: float, memory: bool,
            wall: bool) -> list[dict]:
    results = []
    try:
        _run_each(selected, scale, memory, wall, results)
    except KeyboardInterrupt:
        # A run cut short (Ctrl-C, or tools/gpu_check.sh's `timeout -s INT` on a lent GPU machine)
        # still reports the workloads it finished, and says it stopped early; the alternative,
        # writing nothing, lost the whole CUDA run of a 10-minute device lease once.
        print(f"\ninterrupted: reporting the {len(results)} of {len(selected)} workloads that "
              "finished", flush=True)
        results.append({"interrupted": f"{len(results)} of {len(selected)}"})
    return results


def _run_each(selected: list[workloads.Workload], scale: float, memory: bool, wall: bool,
              results: list[dict]) -> None:
    for i, w in enumerate(selected, 1):
        t0 = time.perf_counter()
        print(f"[{i}/{len(selected)}] {w.name} ...", end=" ", flush=True)
        argv = ["--worker", w.name, "--scale", str(scale)] + (["--wall"] if wall else [])
        res = _run_worker(argv, WORKER_TIMEOUT_S, env=TIMING_MALLOC_ENV)
        res.setdefault("name", w.name)
        res.update({"group": w.group, "series": w.series, "param": w.param,
                    "description": w.description})
        if memory and w.memory and "fatal" not in res:
            # Every allocation above 64 KiB is its own mmap, so freed tensors leave the RSS.
            m = _run_worker(["--memory", w.name], MEMORY_TIMEOUT_S,
                            env={"MALLOC_MMAP_THRESHOLD_": "65536"})
            res["memory"] = m.get("memory") or {
                impl: {"status": "error", "reason": m.get("fatal")} for impl in IMPLS}
        print(f"{time.perf_counter() - t0:.1f} s" + (f"  FAILED: {res['fatal']}"
                                                      if "fatal" in res else ""), flush=True)
        results.append(res)


# ---------------------------------------------------------------------------------------------
# Formatting.

def fmt_time(s: float | None) -> str:
    if s is None or math.isnan(s):
        return "n/a"
    if abs(s) >= 1.0:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "n/a"
    if abs(b) >= 1 << 20:
        return f"{b / (1 << 20):.1f} MiB"
    return f"{b / 1024:.0f} KiB"


def fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None or math.isnan(r) or math.isinf(r) else f"{r:.2f}x"


class Notes:
    """Footnotes for n/a cells: the cell says n/a (error [k]), the note gives the reason."""

    def __init__(self):
        self.items: list[str] = []

    def cell(self, entry: dict | None, where: str) -> str:
        if entry is None:
            return "n/a"
        status = entry.get("status", "error")
        self.items.append(f"[{len(self.items) + 1}] {where}: {status}: {entry.get('reason')}")
        return f"n/a ({status} [{len(self.items)}])"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def _median(res: dict, impl: str) -> float | None:
    e = res.get("impls", {}).get(impl)
    return e["median_s"] if e and e.get("status") == "ok" else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def overhead_per_op(res: dict, impl: str) -> float | None:
    t, e = _median(res, impl), _median(res, "eager")
    if t is None or e is None or not res.get("aten_ops"):
        return None
    return (t - e) / res["aten_ops"]


# ---------------------------------------------------------------------------------------------
# Tables.

def timing_table(results: list[dict], notes: Notes) -> str:
    rows = []
    for r in results:
        if "fatal" in r:
            rows.append([r["name"], "", notes.cell({"status": "error", "reason": r["fatal"]},
                                                   r["name"])] + [""] * (len(IMPLS) + 1))
            continue
        cells = [r["name"], str(r.get("aten_ops", ""))]
        for impl in IMPLS:
            t = _median(r, impl)
            cells.append(fmt_time(t) if t is not None else
                         notes.cell(r["impls"].get(impl), f"{impl} on {r['name']}"))
        ours = _median(r, "ours")
        cells.append(fmt_ratio(_ratio(ours, _median(r, "torch.func"))))
        cells.append(fmt_ratio(_ratio(ours, _median(r, "eager"))))
        rows.append(cells)
    return table(["workload", "ATen ops"] + [f"{i}" for i in IMPLS] +
                 ["ours / torch.func", "ours / eager"], rows)


def overhead_table(results: list[dict]) -> str:
    rows = []
    for r in results:
        if "fatal" in r or r["group"] not in ("tiny", "large") and r.get("series") != \
                "program length (ops)":
            continue
        o = {impl: overhead_per_op(r, impl) for impl in ("ours", "torch.func", "FTMode")}
        rows.append([r["name"]] + [fmt_time(o[i]) for i in o] +
                     [fmt_ratio(_ratio(o["ours"], o["torch.func"]))])
    return table(["workload", "ours overhead/op", "torch.func overhead/op",
                  "FTMode overhead/op", "ours / torch.func"], rows)


TRACERS = IMPLS + ("capture", "capture+codegen")  # make_fx of each impl, then ours' capture


def trace_table(results: list[dict], notes: Notes) -> str:
    rows = []
    for r in results:
        tr = r.get("trace") or {}
        if not tr:
            continue
        times, nodes = [], []
        for impl in TRACERS:
            e = tr.get(impl)
            if e and e.get("status") == "ok":
                times.append(fmt_time(e["time_s"]))
                flag = " (hidden writes)" if e.get("hidden_writes") else ""
                if not e.get("graph_ok"):
                    notes.items.append(f"[{len(notes.items) + 1}] graph of {impl} on "
                                       f"{r['name']}: {e.get('graph_mismatch')}")
                    flag = f" (graph differs [{len(notes.items)}])"
                nodes.append(f"{e['nodes']}{flag}")
            else:
                cell = notes.cell(e, f"{impl} on {r['name']}")
                times.append(cell)
                nodes.append("n/a")
        t = {i: (tr.get(i) or {}).get("time_s") for i in TRACERS}
        rows.append([r["name"]] + times + nodes[:len(IMPLS) + 1] +
                    [fmt_ratio(_ratio(t["ours"], t["torch.func"])),
                     fmt_ratio(_ratio(t["capture"], t["torch.func"])),
                     fmt_ratio(_ratio(t["capture+codegen"], t["torch.func"]))])
    return table(["workload"] + [f"trace {i}" for i in IMPLS] +
                 ["capture", "capture+codegen"] + [f"nodes {i}" for i in IMPLS] +
                 ["nodes capture", "make_fx(ours) / make_fx(torch.func)",
                  "capture / make_fx(torch.func)", "capture+codegen / make_fx(torch.func)"], rows)


def epilogue_table(results: list[dict]) -> str:
    """Bytes written into the inputs per call: eager f itself, and each functional graph (its
    epilogue). Workloads that write no input are left out."""
    rows = []
    for r in results:
        tr = r.get("trace") or {}
        b = {i: (tr.get(i) or {}).get("input_bytes") for i in ("eager", "ours", "torch.func",
                                                                "capture")}
        if not b["eager"]:
            continue
        rows.append([r["name"]] + [fmt_bytes(b[i]) for i in ("eager", "capture", "ours",
                                                             "torch.func")] +
                    [fmt_ratio(_ratio(b["capture"], b["eager"])),
                     fmt_ratio(_ratio(b["torch.func"], b["eager"]))])
    return table(["workload", "eager f", "capture epilogue", "make_fx(ours) epilogue",
                  "make_fx(torch.func) epilogue", "capture / eager", "torch.func / eager"], rows)


def memory_table(results: list[dict], notes: Notes) -> str:
    rows = []
    for r in results:
        mem = r.get("memory")
        if not mem:
            continue
        cells = [r["name"]]
        peaks, rss = {}, {}
        for impl in IMPLS:
            e = mem.get(impl)
            if e and e.get("status") == "ok":
                peaks[impl], rss[impl] = e["peak_bytes"], e.get("rss_peak_bytes")
                cells.append(fmt_bytes(e["peak_bytes"]))
            else:
                cells.append(notes.cell(e, f"memory of {impl} on {r['name']}"))
        cells.append(fmt_ratio(_ratio(peaks.get("ours"), peaks.get("torch.func"))))
        cells.append(fmt_ratio(_ratio(peaks.get("ours"), peaks.get("eager"))))
        cells += [fmt_bytes(rss.get(i)) for i in ("eager", "ours", "torch.func")]
        rows.append(cells)
    return table(["workload"] + [f"peak {i}" for i in IMPLS] +
                 ["ours / torch.func", "ours / eager", "RSS eager", "RSS ours",
                  "RSS torch.func"], rows)


def series_points(results: list[dict], series: str, impl: str) -> list[tuple[int, float]]:
    pts = [(r["param"], _median(r, impl)) for r in results
           if r.get("series") == series and "fatal" not in r]
    return sorted((p, t) for p, t in pts if t is not None)


def slope(points: list[tuple[int, float]]) -> float | None:
    """log-log slope of the last (largest) step: 1 = linear, 2 = quadratic."""
    if len(points) < 2:
        return None
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return math.log(y1 / y0) / math.log(x1 / x0)


SERIES = ("program length (ops)", "live views of one base", "view-chain depth")


def scaling_table(results: list[dict]) -> str:
    rows = []
    for series in SERIES:
        for impl in IMPLS:
            pts = series_points(results, series, impl)
            if not pts:
                continue
            per_item = ", ".join(f"{p}: {fmt_time(t / p)}" for p, t in pts)
            rows.append([series, impl, fmt_ratio(slope(pts)).rstrip("x"), per_item])
    return table(["series", "impl", "slope (last step)", "time per op / view / level"], rows)


# ---------------------------------------------------------------------------------------------
# Targets (issue #4, point 4).

def targets(results: list[dict]) -> list[tuple[str, str, str]]:
    out = []
    ok = [r for r in results if "fatal" not in r]

    # 1. eager overhead per op <= 0.5x torch.func's, on every tiny workload.
    ratios = []
    for r in ok:
        if r["group"] != "tiny":
            continue
        o_ours, o_tf = overhead_per_op(r, "ours"), overhead_per_op(r, "torch.func")
        if o_ours is not None and o_tf is not None:
            ratios.append((o_ours / o_tf if o_tf > 0 else math.inf, r["name"], o_ours, o_tf))
    if ratios:
        worst = max(ratios)
        figure = "; ".join(f"{n.split('/')[1]} {fmt_ratio(x)} ({fmt_time(a)} vs {fmt_time(b)})"
                           for x, n, a, b in ratios)
        out.append(("eager overhead per op <= 0.5x torch.func's (tiny/*)",
                    f"worst {fmt_ratio(worst[0])} on {worst[1]}; {figure}",
                    "MET" if worst[0] <= 0.5 else "NOT MET"))

    # 2. trace time <= 0.8x torch.func's; 3. node count never above torch.func's.
    t_ratios, node_over, node_pairs = [], [], 0
    for r in ok:
        tr = r.get("trace") or {}
        a, b, e = tr.get("ours") or {}, tr.get("torch.func") or {}, tr.get("eager") or {}
        if a.get("status") == "ok" and b.get("status") == "ok":
            floor = e["time_s"] / b["time_s"] if e.get("status") == "ok" else math.nan
            t_ratios.append((a["time_s"] / b["time_s"], r["name"], floor))
            node_pairs += 1
            if a["nodes"] > b["nodes"]:
                node_over.append(f"{r['name']} {a['nodes']} vs {b['nodes']}")
    if t_ratios:
        worst = max(t_ratios)
        med = sorted(x for x, _, _ in t_ratios)[len(t_ratios) // 2]
        below = sum(1 for x, _, _ in t_ratios if x <= 0.8)
        out.append(("make_fx trace time <= 0.8x torch.func's",
                    f"worst {fmt_ratio(worst[0])} on {worst[1]} (make_fx(f) without any "
                    f"functionalization: {fmt_ratio(worst[2])}), median {fmt_ratio(med)}; "
                    f"met on {below} of {len(t_ratios)} workloads",
                    "MET" if worst[0] <= 0.8 else "NOT MET"))
        out.append(("graph node count never above torch.func's",
                    (f"above on {len(node_over)} of {node_pairs}: " + "; ".join(node_over))
                    if node_over else f"never above ({node_pairs} workloads)",
                    "NOT MET" if node_over else "MET"))

    # Issue #14 point 2: capture <= 0.1x make_fx(torch.func.functionalize(f)) on every trace
    # workload; point 4: capture's node count <= torch.func's where torch.func is correct.
    c_ratios, c_codegen, c_nodes_over, c_nodes_pairs, c_wrong = [], [], [], 0, []
    for r in ok:
        tr = r.get("trace") or {}
        c, cc, b = tr.get("capture") or {}, tr.get("capture+codegen") or {}, tr.get("torch.func") or {}
        if c.get("status") == "ok" and b.get("status") == "ok":
            c_ratios.append((c["time_s"] / b["time_s"], r["name"]))
            if cc.get("status") == "ok":
                c_codegen.append((cc["time_s"] / b["time_s"], r["name"]))
            if not b.get("graph_ok") or b.get("hidden_writes"):
                c_wrong.append(r["name"] + (" (hidden batch-norm writes)"
                                            if b.get("hidden_writes") else ""))
            else:
                c_nodes_pairs += 1
                if c["nodes"] > b["nodes"]:
                    c_nodes_over.append(f"{r['name']} {c['nodes']} vs {b['nodes']}")
        elif b.get("status") == "ok":  # make_fx(torch.func) traces it, capture does not
            c_ratios.append((math.inf, r["name"]))
    if c_ratios:
        worst = max(c_ratios)
        cg = max(c_codegen) if c_codegen else (math.nan, "n/a")
        out.append(("capture time <= 0.1x make_fx(torch.func.functionalize(f)) (issue #14.2)",
                    f"worst {fmt_ratio(worst[0])} on {worst[1]} over {len(c_ratios)} trace "
                    f"workloads; with code generation: worst {fmt_ratio(cg[0])} on {cg[1]}",
                    "MET" if worst[0] <= 0.1 else "NOT MET"))
        out.append(("capture node count <= torch.func's where torch.func is correct (#14.4)",
                    ((f"above on {len(c_nodes_over)} of {c_nodes_pairs}: " +
                      "; ".join(c_nodes_over)) if c_nodes_over else
                     f"never above ({c_nodes_pairs} workloads)") +
                    (f"; torch.func's graph is wrong on {', '.join(c_wrong)}" if c_wrong else ""),
                    "NOT MET" if c_nodes_over else "MET"))

    # Issue #14 point 5: the epilogue writes no more into an input than eager f writes to it.
    over, pairs = [], []
    for r in ok:
        tr = r.get("trace") or {}
        e, c = (tr.get("eager") or {}).get("input_bytes"), (tr.get("capture") or {}).get(
            "input_bytes")
        if e and c is not None:
            pairs.append(f"{r['name']} {fmt_bytes(c)} vs {fmt_bytes(e)}")
            if c > e:
                over.append(r["name"])
    if pairs:
        out.append(("capture epilogue bytes <= bytes eager writes to the inputs (#14.5)",
                    ("above on " + ", ".join(over) + "; " if over else "") + "; ".join(pairs),
                    "NOT MET" if over else "MET"))

    # Issue #14 point 6: view chains linear in depth, and at most 3x eager at depth 1000.
    pts = series_points(ok, "view-chain depth", "ours")
    by_name = {r["name"]: r for r in ok}
    deep = by_name.get("scale/depth/1000")
    if len(pts) >= 2 and deep is not None:
        s = slope([p for p in pts if p[0] in (100, 1000)])
        ratio = _ratio(_median(deep, "ours"), _median(deep, "eager"))
        if s is not None and ratio is not None:
            out.append(("view chain: slope <= 1.1 from D=100 to 1000, ours/eager <= 3x at D=1000 "
                        "(#14.6)", f"slope {s:.2f}, {fmt_ratio(ratio)} eager at D=1000",
                        "MET" if s <= 1.1 and ratio <= 3.0 else "NOT MET"))

    # Issue #14 point 7: eager-mode mutation programs at most 2x eager.
    cells, worst = [], 0.0
    for name in ("real/adam_foreach", "real/adam_torch_optim", "large/inplace"):
        r = by_name.get(name)
        ratio = _ratio(_median(r, "ours"), _median(r, "eager")) if r else None
        if ratio is not None:
            cells.append(f"{name} {fmt_ratio(ratio)}")
            worst = max(worst, ratio)
    if cells:
        out.append(("adam_foreach, torch.optim Adam, large/inplace <= 2x eager (#14.7)",
                    "; ".join(cells), "MET" if worst <= 2.0 else "NOT MET"))

    # 4. linear in program length and in live aliases.
    for series, label in (("program length (ops)", "program length"),
                          ("live views of one base", "number of live aliases")):
        pts = series_points(ok, series, "ours")
        s = slope(pts)
        if s is not None:
            out.append((f"time linear in {label} (no quadratic term)",
                        f"log-log slope {s:.2f} from {pts[-2][0]} to {pts[-1][0]} "
                        f"(1 = linear, 2 = quadratic; MET if <= {LINEAR_SLOPE_MAX})",
                        "MET" if s <= LINEAR_SLOPE_MAX else "NOT MET"))

    # 5. peak memory no worse than torch.func's.
    worse, pairs = [], []
    for r in ok:
        mem = r.get("memory") or {}
        a, b = mem.get("ours") or {}, mem.get("torch.func") or {}
        if a.get("status") == "ok" and b.get("status") == "ok":
            pairs.append(r["name"])
            if a["peak_bytes"] > b["peak_bytes"] * MEMORY_SLACK[0] + MEMORY_SLACK[1]:
                worse.append(f"{r['name']} {fmt_bytes(a['peak_bytes'])} vs "
                             f"{fmt_bytes(b['peak_bytes'])}")
    if pairs:
        out.append(("peak memory no worse than torch.func's",
                    ("worse on " + "; ".join(worse)) if worse else
                    f"no worse on {len(pairs)} workloads (5% + 512 KiB slack)",
                    "NOT MET" if worse else "MET"))
    return out


# ---------------------------------------------------------------------------------------------
# Plot.

def plot(results: list[dict], path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot written"
    series = [s for s in SERIES if any(r.get("series") == s for r in results)]
    if not series:
        return None
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 4), squeeze=False)
    for ax, s in zip(axes[0], series):
        for impl in IMPLS:
            pts = series_points(results, s, impl)
            if pts:
                ax.plot([p for p, _ in pts], [t for _, t in pts], marker="o", label=impl)
        ours = series_points(results, s, "ours")
        if len(ours) >= 2:
            x0, y0 = ours[0]
            xs = [p for p, _ in ours]
            ax.plot(xs, [y0 * x / x0 for x in xs], "k:", linewidth=1, label="linear (from ours)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(s)
        ax.set_ylabel("median time per call (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("torch-functionalize scaling (log-log; slope 1 = linear)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


# ---------------------------------------------------------------------------------------------

def environment(args, started: float, load_before: tuple) -> list[str]:
    import torch
    import torch_functionalize

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"
    dirty = " (with uncommitted changes in csrc/ or python/)" if git(
        "status", "--porcelain", "--", "../csrc", "../python") else ""
    package = os.path.dirname(os.path.abspath(torch_functionalize.__file__))
    repo_package = os.path.normpath(os.path.join(HERE, "..", "python", "torch_functionalize"))
    source = "" if package == repo_package else f"; torch_functionalize imported from {package}"
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mode = "quick" if args.quick else "full"
    if args.only:
        mode += f", only {' '.join(args.only)}"
    clock = "wall-clock" if args.wall else "CPU time of the timing thread"
    if getattr(args, "device", "cpu") != "cpu":
        clock += f", tensors on {args.device} (synchronized)"
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}, "
        f"wall time {time.perf_counter() - started:.0f} s, mode: {mode}",
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"commit {git('rev-parse', '--short', 'HEAD')}{dirty}{source}",
        f"- CPU: {cpu}, {os.cpu_count()} cores; 1 thread; clock: {clock}; load average before "
        f"{load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (a shared machine: compare "
        "ratios, not absolute times)",
    ]


def report(results: list[dict], env_lines: list[str]) -> str:
    notes = Notes()
    parts = ["# torch-functionalize benchmark results", "",
             "Generated by `python benchmarks/run.py`; see benchmarks/README.md for what each "
             "workload measures and how to read the ratios. The distributed training step "
             "(2 gloo ranks, issue #16) is measured by `python benchmarks/distributed_step.py` "
             "into benchmarks/results_distributed.md.", ""] + env_lines + [""]
    parts += ["## Targets", "",
              table(["target", "measured", "result"], [list(t) for t in targets(results)]), ""]
    parts += ["## Median time per call", "",
              "Results of every implementation were checked against eager (outputs and mutated "
              "inputs) before timing. Ratios below 1 mean ours is faster.", "",
              timing_table(results, notes), ""]
    if any(r.get("group") in ("tiny", "large") for r in results):
        parts += ["## Overhead per ATen op over eager", "",
                  "(median time - eager median time) / ATen ops dispatched by eager.", "",
                  overhead_table(results), ""]
    if any(r.get("series") for r in results):
        parts += ["## Scaling", "", "See scaling.png. Slope of log(time) against log(size) "
                  "over the largest step: 1 is linear, 2 quadratic.", "",
                  scaling_table(results), ""]
    if any(((r.get("trace") or {}).get("eager") or {}).get("input_bytes") for r in results):
        parts += ["## Bytes written into the inputs per call", "",
                  "What ops that declare a write put into the inputs' memory: eager f's own "
                  "writes, and each graph's epilogue (counted by a dispatch mode while the graph "
                  "runs). capture writes only the regions the program wrote "
                  "(Note [Capture: region-precise epilogue]).", "", epilogue_table(results), ""]
    if any(r.get("trace") for r in results):
        parts += ["## make_fx(functionalize(f)): trace time and graph size", "",
                  "`trace eager` traces f itself (a graph that still mutates) as a baseline. "
                  "Nodes: call_function nodes of the graph (getitem included). Each graph was "
                  "run on fresh inputs and compared with eager.", "",
                  trace_table(results, notes), ""]
    if any(r.get("memory") for r in results):
        parts += ["## Peak memory of one call", "",
                  "Peak CPU tensor memory live during one call above what was live before it "
                  "(inputs excluded), from torch.profiler's allocation events, measured in a "
                  "separate process per workload after a warm-up call. RSS columns: the peak "
                  "resident set above the RSS before the call (meaningful for large tensors "
                  "only; small ones come from malloc's cached heap).", "",
                  memory_table(results, notes), ""]
    parts += ["## Workloads", ""] + [f"- `{r['name']}`: {r['description']}" for r in results]
    if notes.items:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in notes.items]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Benchmark torch-functionalize against torch.func.functionalize, "
                    "FunctionalTensorMode and eager.")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: fewer workloads and sizes, shorter timing budgets")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="workload name or glob (repeatable), e.g. tiny/inplace, 'scale/*'")
    parser.add_argument("--no-memory", action="store_true", help="skip peak-memory processes")
    parser.add_argument("--wall", action="store_true",
                        help="time wall-clock instead of the timing thread's CPU time")
    parser.add_argument("--out", default=os.path.join(HERE, "results.md"),
                        help="markdown output (default benchmarks/results.md)")
    parser.add_argument("--plot", default=os.path.join(HERE, "scaling.png"),
                        help="scaling plot output (default benchmarks/scaling.png)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--device", default="cpu",
                        help="where the workloads' tensors live (cpu, cuda); cuda times the wall "
                             "clock with a device synchronize and writes results-cuda.md")
    args = parser.parse_args()
    if args.device != "cpu":
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            sys.exit(f"benchmarks/run.py: --device {args.device}: no CUDA device on this machine "
                     f"(torch {torch.__version__}, torch.cuda.is_available() is False)")
        os.environ["TFZ_BENCH_DEVICE"] = args.device
        args.wall = True  # the timing thread's CPU time does not see GPU work
        if args.out == os.path.join(HERE, "results.md"):
            args.out = os.path.join(HERE, f"results-{args.device.split(':')[0]}.md")
        if args.plot == os.path.join(HERE, "scaling.png"):
            args.plot = os.path.join(HERE, f"scaling-{args.device.split(':')[0]}.png")

    selected = workloads.all_workloads()
    if args.only:
        selected = [w for w in selected if any(fnmatch.fnmatch(w.name, p) or p == w.name
                                               for p in args.only)]
    elif args.quick:
        selected = [w for w in selected if w.quick]
    if args.list or not selected:
        for w in workloads.all_workloads():
            print(f"{w.name:28s} {w.description}")
        if not selected:
            sys.exit(f"no workload matches {args.only}")
        return

    started, load_before = time.perf_counter(), os.getloadavg()
    # Peak memory is the worker process's RSS, which does not see device memory: on CUDA it would
    # report the host side only, so it is not measured there rather than shown as if it were.
    memory = not args.no_memory and args.device == "cpu"
    results = run_all(selected, scale=0.25 if args.quick else 1.0, memory=memory, wall=args.wall)
    env_lines = environment(args, started, load_before)
    if results and "interrupted" in results[-1]:
        env_lines.append(f"- **partial run**: interrupted after {results.pop()['interrupted']} "
                         "workloads")
    if not memory and args.device != "cpu":
        env_lines.append(f"- peak memory not measured on {args.device} (the host RSS the memory "
                         "worker reads does not see device memory)")
    text = report(results, env_lines)
    print()
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    problem = plot(results, args.plot)
    print(f"wrote {os.path.relpath(args.out)}" +
          (f" and {os.path.relpath(args.plot)}" if problem is None and
           any(r.get("series") for r in results) else "") + (f"; {problem}" if problem else ""))


if __name__ == "__main__":
    main()
