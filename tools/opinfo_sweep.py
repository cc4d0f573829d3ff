"""OpInfo differential sweep: runs the cases of opinfo_cases.py (package
torch_functionalize.testing._internal) and writes docs/reports/coverage.md.

    python tools/opinfo_sweep.py --full --out docs/reports/coverage.md     # every op, every sample
    python tools/opinfo_sweep.py --subset                          # the CI subset
    python tools/opinfo_sweep.py --ops add,view --out /tmp/c.md    # a few ops
    python tools/opinfo_sweep.py --full --json r.json              # also keep raw results
    python tools/opinfo_sweep.py --from-json r.json --out c.md     # re-render, run nothing
    python tools/opinfo_sweep.py --full --device cuda --out docs/reports/coverage-cuda.md   # on a GPU

The ops are split into chunks; each chunk runs in its own process (`--jobs` at a time), which
appends one JSON line per event to its own file. A process that dies (a crash) or stops making
progress (a hang no alarm could interrupt) is replaced by one that resumes after the case in
progress, which is recorded as "crash" for the run that was executing. Results are merged and
turned into the markdown report by `write_report`. The engine package and this harness are
copied at start (`--no-snapshot` to run them in place), so a rebuild during the sweep is harmless.
The full sweep takes about 25 minutes on 2 cores (`--jobs`, default: all cores).
"""

import argparse
import collections
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

# The cases live in the package (test/python/test_opinfo.py runs their fast subset), so the
# snapshot of the package (snapshot below) carries them.
from torch_functionalize.testing._internal import opinfo_cases as oc
from torch_functionalize.testing._internal import opinfo_programs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

FULL_COMMAND = "python tools/opinfo_sweep.py --full --out docs/reports/coverage.md"


# ---------------------------------------------------------------------------------------------
# Worker: one process, a list of ops, one JSON line per event.


def worker_main(args):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.worker_plan) as fh:
        plan = json.load(fh)
    skip = set(plan.get("skip", []))
    forced = {
        cid: {run: oc.RunResult(**r) for run, r in runs.items()}
        for cid, runs in plan.get("forced", {}).items()
    }
    out = open(args.worker_results, "a", buffering=1)

    def emit(record):
        out.write(json.dumps(record) + "\n")
        out.flush()

    import torch_functionalize

    emit({"t": "engine", "path": torch_functionalize.__file__})
    for key in plan["ops"]:
        emit({"t": "op_begin", "op": key})
        if plan["mode"] == "subset":
            cases = oc.subset_cases_for_op(key)
        else:
            cases = oc.cases_for_op(key, max_samples=plan.get("max_samples"))
        try:
            for case in cases:
                if case.id in skip:
                    continue

                def on_begin(run, cid=case.id):
                    emit({"t": "begin", "case": cid, "run": run})

                result = oc.run_case(case, timeout=plan["timeout"], on_begin=on_begin,
                                     forced=forced.get(case.id))
                emit({"t": "case", **result.to_dict()})
        except Exception as e:  # noqa: BLE001 - a harness failure is recorded, never fatal
            result = oc.CaseResult(f"{key}-*", key, "*", "*", -1,
                                   na=f"case generation raises: {oc._first_line(e)}")
            emit({"t": "case", **result.to_dict()})
        emit({"t": "op_end", "op": key})
    out.close()


# ---------------------------------------------------------------------------------------------
# Parent: chunks, supervision, resume after a crash or a hang.


class Chunk:
    def __init__(self, index, ops, workdir):
        self.index = index
        self.ops = list(ops)
        self.results_path = os.path.join(workdir, f"chunk{index}.jsonl")
        self.skip = set()  # case ids already recorded
        self.forced = {}  # case id -> run -> result
        self.finished_ops = set()
        self.na_ops = {}  # op -> reason, for crashes outside any run
        self.generation = 0
        self.proc = None
        self.offset = 0
        self.last_event = None
        self.last_time = time.time()
        self.restarts_without_progress = 0


def _start(chunk, args, workdir):
    remaining = [k for k in chunk.ops if k not in chunk.finished_ops and k not in chunk.na_ops]
    if not remaining:
        return False
    plan_path = os.path.join(workdir, f"chunk{chunk.index}.g{chunk.generation}.json")
    with open(plan_path, "w") as fh:
        json.dump({"ops": remaining, "mode": args.mode, "max_samples": args.max_samples,
                   "timeout": args.timeout, "skip": sorted(chunk.skip),
                   "forced": chunk.forced}, fh)
    cmd = [sys.executable, args.worker_script, "--worker-plan", plan_path,
           "--worker-results", chunk.results_path, "--threads", str(args.threads)]
    env = dict(os.environ)
    if args.snapshot_dir:
        env["PYTHONPATH"] = os.pathsep.join(
            [args.snapshot_dir] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    chunk.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, env=env,
                                  stderr=open(chunk.results_path + ".stderr", "a"))
    chunk.generation += 1
    chunk.last_time = time.time()
    return True


def _read_events(chunk, results):
    """Consumes the chunk's new JSON lines; returns whether a case finished."""
    progressed = False
    if not os.path.exists(chunk.results_path):
        return progressed
    with open(chunk.results_path) as fh:
        fh.seek(chunk.offset)
        while True:
            line = fh.readline()
            if not line or not line.endswith("\n"):
                break
            chunk.offset = fh.tell()
            event = json.loads(line)
            chunk.last_time = time.time()
            t = event.pop("t")
            if t == "case":
                results[event["id"]] = event
                chunk.skip.add(event["id"])
                progressed = True
            elif t == "op_end":
                chunk.finished_ops.add(event["op"])
                progressed = True
            chunk.last_event = (t, event)
    return progressed


def _record_crash(chunk, results, why):
    """Attributes a dead or hung worker's failure to the run in progress, if any."""
    t, event = chunk.last_event or (None, {})
    if t == "begin" and event["case"] not in chunk.skip:
        chunk.forced.setdefault(event["case"], {})[event["run"]] = {
            "status": "crash", "message": why}
        chunk.restarts_without_progress = 0
        return
    # Not inside a run: case generation or the eager probe of the current op.
    op = event.get("op") if t in ("op_begin",) else None
    if op is None:
        done = chunk.finished_ops | set(chunk.na_ops)
        op = next((k for k in chunk.ops if k not in done), None)
    chunk.restarts_without_progress += 1
    if op is not None and (t == "op_begin" or chunk.restarts_without_progress >= 2):
        chunk.na_ops[op] = f"the worker process dies outside any run ({why})"
        results[f"{op}-*"] = {"id": f"{op}-*", "op": op, "placement": "*", "dtype": "*",
                              "sample": -1, "description": "", "runs": {}, "seconds": 0.0,
                              "na": chunk.na_ops[op]}


def snapshot(workdir):
    """Copies the installed torch_functionalize package (its .so files included; they find each
    other through RUNPATH $ORIGIN; the cases in testing/_internal) and this script, so that a
    rebuild or an edit during the sweep cannot crash the workers or mix two versions in one
    report. Returns (PYTHONPATH entry, worker script)."""
    spec = importlib.util.find_spec("torch_functionalize")
    source = list(spec.submodule_search_locations)[0]
    target = os.path.join(workdir, "engine")
    shutil.copytree(source, os.path.join(target, "torch_functionalize"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    harness = os.path.join(workdir, "harness")
    os.makedirs(harness)
    shutil.copy2(os.path.abspath(__file__), harness)
    return target, os.path.join(harness, "opinfo_sweep.py")


def engine_version():
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_sweep(args, keys):
    workdir = tempfile.mkdtemp(prefix="opinfo_sweep_")
    if args.snapshot:
        args.snapshot_dir, args.worker_script = snapshot(workdir)
    else:
        args.snapshot_dir, args.worker_script = None, os.path.abspath(__file__)
    n_chunks = max(1, min(len(keys), args.chunks or max(args.jobs * 6, 1)))
    chunks = [Chunk(i, keys[i::n_chunks], workdir) for i in range(n_chunks)]
    pending = list(chunks)
    running = []
    results = {}
    hard_timeout = 2 * args.timeout + 60
    started = time.time()
    last_report = 0.0
    # Interrupted (Ctrl-C, or `timeout -s INT` as tools/gpu_check.sh uses): the cases finished so
    # far are reported, marked partial, instead of nothing.
    args.interrupted = None
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                chunk = pending.pop(0)
                if _start(chunk, args, workdir):
                    running.append(chunk)
            time.sleep(0.2)
            for chunk in list(running):
                if _read_events(chunk, results):
                    chunk.restarts_without_progress = 0
                rc = chunk.proc.poll()
                hung = rc is None and time.time() - chunk.last_time > hard_timeout
                if rc is None and not hung:
                    continue
                if hung:
                    chunk.proc.kill()
                    chunk.proc.wait()
                    why = f"no progress for {hard_timeout:.0f} s; the process was killed"
                else:
                    why = f"the process exited with status {rc}"
                _read_events(chunk, results)
                running.remove(chunk)
                left = [k for k in chunk.ops if k not in chunk.finished_ops
                        and k not in chunk.na_ops]
                if left:
                    _record_crash(chunk, results, why)
                    with open(chunk.results_path + ".stderr") as fh:
                        tail = fh.read()[-2000:]
                    print(f"[sweep] chunk {chunk.index}: {why}; resuming "
                          f"({len(left)} ops left)\n{tail}", file=sys.stderr)
                    pending.insert(0, chunk)
            if time.time() - last_report > 30:
                last_report = time.time()
                done = sum(len(c.finished_ops) + len(c.na_ops) for c in chunks)
                print(f"[sweep] {time.time() - started:6.0f} s  ops {done}/{len(keys)}  "
                      f"cases {len(results)}", file=sys.stderr)
    except KeyboardInterrupt:
        for chunk in running:
            chunk.proc.kill()
            chunk.proc.wait()
            _read_events(chunk, results)
        done = sum(len(c.finished_ops) + len(c.na_ops) for c in chunks)
        args.interrupted = f"interrupted after {done} of {len(keys)} ops: partial results"
        print(f"[sweep] {args.interrupted}", file=sys.stderr)
    if args.keep_workdir:
        print(f"[sweep] worker files kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return list(results.values()), time.time() - started


# ---------------------------------------------------------------------------------------------
# Report.


def _pct(n, d):
    return f"{n} ({100.0 * n / d:.1f}%)" if d else "0"


def _case_rows(results):
    """(case record, remove, ours RunResult dict, torch.func RunResult dict) per compared case."""
    for r in results:
        if r["na"] is not None:
            continue
        for remove in ("mutations", "mutations_and_views"):
            ours = r["runs"].get(f"ours/{remove}")
            ref = r["runs"].get(f"torch.func/{remove}")
            if ours is not None and ref is not None:
                yield r, remove, ours, ref


def _counts(rows):
    c = collections.Counter()
    for _, _, ours, ref in rows:
        o, t = ours["status"] == "passed", ref["status"] == "passed"
        c["cases"] += 1
        c["ours"] += o
        c["ref"] += t
        c["ours_only_fail"] += (not o) and t
        c["ref_only_fail"] += o and not t
        c["both_fail"] += (not o) and not t
        c["blockers"] += ours["status"] in oc.WRONG_VALUE_STATUSES and t
        c["worse"] += _worse(ours, ref)
    return c


def _worse(ours, ref):
    """Ours fails where torch.func passes, or fails worse (see opinfo_cases.SEVERITY)."""
    return not oc.not_worse(oc.RunResult(**ours), oc.RunResult(**ref))


def _md_escape(text):
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _where(where):
    """'[s0,s3] [m,mv]' for a list of (sample index, remove mode, ...)."""
    samples = sorted({w[0] for w in where})
    modes = sorted({"m" if w[1] == "mutations" else "mv" for w in where})
    text = ",".join(f"s{s}" for s in samples[:12])
    if len(samples) > 12:
        text += f",… ({len(samples)} samples)"
    return f"[{text}] [{','.join(modes)}]"


def write_report(results, meta, path):
    results = sorted(results, key=lambda r: (r["op"], r["placement"], r["dtype"], r["sample"]))
    rows = list(_case_rows(results))
    na_cases = [r for r in results if r["na"] is not None]
    lines = []
    w = lines.append
    w("# OpInfo coverage: torch-functionalize vs torch.func.functionalize")
    w("")
    full = "" if meta["command"] == FULL_COMMAND else f" (the full sweep: `{FULL_COMMAND}`)"
    w(f"Generated by `{meta['command']}`{full}. Do not edit by hand.")
    w("")
    w(f"- torch-functionalize at `{meta['engine']}`; torch {meta['torch']}, "
      f"Python {meta['python']}, {meta['machine']}")
    w(f"- mode: {meta['mode']}; ops: {meta['n_ops']}; samples per op and dtype: "
      f"{meta['samples']}; per-run time limit {meta['timeout']:.0f} s; "
      f"{meta['jobs']} worker processes")
    w(f"- run time: {meta['duration'] / 60:.1f} min, finished {meta['finished']}")
    w("")
    w("A case is one OpInfo sample (float32, and one integer or bool dtype where the op supports "
      "it) placed in a small program, run in one remove mode (`mutations` or "
      "`mutations_and_views`; each mode counts as a case). It passes when the functionalized "
      "program's outputs and the final state of its inputs (values, dtypes, shapes, strides) "
      "equal eager (`torch.testing.assert_close` defaults, `equal_nan=True`, exact for integers), "
      "when the `make_fx` graph has no mutable op except the input write-back epilogue (and no "
      "view op in `mutations_and_views` mode), and when that graph, run again on fresh inputs, "
      "equals eager too. Random ops are reseeded before every run. Cases eager cannot run, or "
      "runs nondeterministically, are listed as not applicable with their reason.")
    w("")

    total = _counts(rows)
    w("## Totals")
    w("")
    w("| cases | ours passed | torch.func passed | ours fails, torch.func passes | "
      "torch.func fails, ours passes | both fail | ours worse than torch.func | "
      "wrong value where torch.func is right | not applicable |")
    w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    w(f"| {total['cases']} | {_pct(total['ours'], total['cases'])} | "
      f"{_pct(total['ref'], total['cases'])} | {total['ours_only_fail']} | "
      f"{total['ref_only_fail']} | {total['both_fail']} | {total['worse']} | "
      f"**{total['blockers']}** | {len(na_cases)} |")
    w("")
    w("\"Ours worse\" counts the cases ours fails while torch.func passes, plus those where both "
      "fail and ours fails worse: a wrong value is worse than an escaped mutation or view, "
      "which is worse than a clear error.")
    w("")

    w("## By category")
    w("")
    w("| category | program | cases | ours passed | torch.func passed | ours fails, "
      "torch.func passes | torch.func fails, ours passes | both fail | ours worse | "
      "not applicable |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for placement, what in oc.PLACEMENTS.items():
        c = _counts([row for row in rows if row[0]["placement"] == placement])
        na = sum(1 for r in na_cases if r["placement"] == placement)
        w(f"| `{placement}` | {what} | {c['cases']} | {_pct(c['ours'], c['cases'])} | "
          f"{_pct(c['ref'], c['cases'])} | {c['ours_only_fail']} | {c['ref_only_fail']} | "
          f"{c['both_fail']} | {c['worse']} | {na} |")
    w("")
    for remove in ("mutations", "mutations_and_views"):
        c = _counts([row for row in rows if row[1] == remove])
        w(f"- `remove=\"{remove}\"`: {c['cases']} cases, ours {c['ours']}, "
          f"torch.func {c['ref']}")
    w("")

    w("## Why we fail")
    w("")
    w("| ours | cases | torch.func passes | torch.func fails too |")
    w("|---|---:|---:|---:|")
    by_status = collections.defaultdict(collections.Counter)
    for _, _, ours, ref in rows:
        if ours["status"] != "passed":
            by_status[ours["status"]]["n"] += 1
            by_status[ours["status"]]["ref_pass" if ref["status"] == "passed" else "ref_fail"] += 1
    for status in sorted(by_status, key=lambda s: (-oc.SEVERITY.get(s, 9), s)):
        c = by_status[status]
        w(f"| `{status}` | {c['n']} | {c['ref_pass']} | {c['ref_fail']} |")
    if not by_status:
        w("| (none) | 0 | 0 | 0 |")
    w("")
    w("Statuses: `wrong_value` / `wrong_input_state` (outputs / final inputs differ from eager), "
      "`graph_wrong_value` (the make_fx graph computes something else, or raises, when run "
      "again), `graph_not_functional` (a mutable op outside the input epilogue), "
      "`view_in_graph` (a view op in `mutations_and_views` mode), `error` (the functionalized "
      "call raises), `trace_error` (make_fx of it raises), `timeout`, `crash` (the process "
      "died), `state_leak` (dispatch state left changed).")
    w("")

    per_op = collections.defaultdict(list)
    for row in rows:
        per_op[row[0]["op"]].append(row)
    na_per_op = collections.Counter(r["op"] for r in na_cases)
    extras = opinfo_programs.extra_op_keys()

    blockers = [row for row in rows
                if row[2]["status"] in oc.WRONG_VALUE_STATUSES and row[3]["status"] == "passed"]
    w("## Blockers: wrong value where torch.func is right")
    w("")
    if not blockers:
        w("None.")
    for r, remove, ours, _ in blockers:
        w(f"- `{r['id']}-{remove}` {r['description']}: `{ours['status']}`: "
          f"{_md_escape(ours['message'])}")
    w("")

    w("## Where ours is worse than torch.func")
    w("")
    worse_groups = collections.OrderedDict()
    for r, remove, ours, ref in rows:
        if _worse(ours, ref):
            key = (r["op"], r["placement"], r["dtype"], ours["status"], ours["message"],
                   ref["status"])
            worse_groups.setdefault(key, []).append((r["sample"], remove, r["description"]))
    if not worse_groups:
        w("None.")
    for (op, placement, dtype, status, message, ref_status), where in worse_groups.items():
        w(f"- `{op}` {placement} {dtype} {_where(where)}, e.g. {where[0][2]}: `{status}` "
          f"(torch.func: `{ref_status}`): {_md_escape(message)}")
    w("")

    w("## Per op")
    w("")
    w("Ops marked * are view entries added to op_db by opinfo_programs.py.")
    w("")
    w("| op | cases | ours passed | torch.func passed | not applicable |")
    w("|---|---:|---:|---:|---:|")
    for op in sorted(set(per_op) | set(na_per_op)):
        c = _counts(per_op.get(op, []))
        mark = " *" if op in extras else ""
        flag = " ⚠" if c["ours"] < c["ref"] else ""
        w(f"| `{op}`{mark} | {c['cases']} | {c['ours']}{flag} | {c['ref']} | {na_per_op[op]} |")
    w("")

    w("## Every case we fail")
    w("")
    w("Grouped by op, placement, dtype, status and message; `s<i>` are sample indices, then "
      "the remove modes (`m` mutations, `mv` mutations_and_views).")
    w("")
    groups = collections.OrderedDict()
    for r, remove, ours, ref in rows:
        if ours["status"] == "passed":
            continue
        key = (r["op"], r["placement"], r["dtype"], ours["status"], ours["message"],
               ref["status"])
        groups.setdefault(key, []).append((r["sample"], remove))
    current_op = None
    for (op, placement, dtype, status, message, ref_status), where in groups.items():
        if op != current_op:
            w("")
            w(f"### `{op}`")
            w("")
            current_op = op
        w(f"- {placement} {dtype} {_where(where)}: `{status}` "
          f"(torch.func: `{ref_status}`): {_md_escape(message)}")
    if not groups:
        w("None.")
    w("")

    w("## Slowest ops")
    w("")
    w("| op | cases | seconds |")
    w("|---|---:|---:|")
    seconds = collections.Counter()
    n_cases = collections.Counter()
    for r in results:
        seconds[r["op"]] += r.get("seconds", 0.0)
        n_cases[r["op"]] += 1
    for op, sec in seconds.most_common(10):
        w(f"| `{op}` | {n_cases[op]} | {sec:.0f} |")
    w("")

    w("## Not applicable")
    w("")
    w("Cases that were not compared, by reason (messages shortened).")
    w("")
    w("| reason | cases | ops |")
    w("|---|---:|---|")
    reasons = collections.defaultdict(lambda: [0, set()])
    for r in na_cases:
        reason = r["na"]
        if len(reason) > 140:
            reason = reason[:137] + "..."
        reasons[reason][0] += 1
        reasons[reason][1].add(r["op"])
    for reason, (n, ops) in sorted(reasons.items(), key=lambda kv: -kv[1][0]):
        ops = sorted(ops)
        shown = ", ".join(f"`{o}`" for o in ops[:6]) + (f", … ({len(ops)})" if len(ops) > 6
                                                         else "")
        w(f"| {_md_escape(reason)} | {n} | {shown} |")
    w("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return total


# ---------------------------------------------------------------------------------------------
# CLI.


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="every op_db op (plus the extra view entries), every sample")
    mode.add_argument("--subset", dest="mode", action="store_const", const="subset",
                      help="the CI subset (SUBSET_OPS, one sample per slot, and REGRESSION_CASES)")
    parser.add_argument("--ops", help="comma-separated op keys (name or name.variant)")
    parser.add_argument("--out", default=None, help="markdown report path")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--from-json", default=None,
                        help="write the report from results saved by --json; run nothing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunks", type=int, default=0, help="op chunks (default 6 x jobs)")
    parser.add_argument("--max-samples", type=int, default=None,
                        help="samples per op and dtype (full mode; default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-run limit, seconds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                        help="run the installed engine in place instead of a copy taken at "
                             "start (a rebuild during the sweep then crashes the workers)")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the per-chunk event files and worker logs")
    parser.add_argument("--device", default=os.environ.get("TFZ_TEST_DEVICE", "cpu"),
                        help="device of the samples (cpu, cuda); default TFZ_TEST_DEVICE or cpu")
    parser.add_argument("--worker-plan", help=argparse.SUPPRESS)
    parser.add_argument("--worker-results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_plan:
        worker_main(args)
        return 0
    args.mode = args.mode or "full"
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        out = args.out or os.path.join(REPO, "docs", "reports", "coverage.md")
        write_report(saved["results"], saved["meta"], out)
        print(f"[sweep] wrote {out} from {args.from_json}", file=sys.stderr)
        return 0

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"[sweep] --device {args.device}: no CUDA device on this machine (torch "
              f"{torch.__version__}, torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    # Workers are new processes: they read the device from the environment (opinfo_programs.DEVICE).
    os.environ["TFZ_TEST_DEVICE"] = opinfo_programs.DEVICE = args.device
    all_keys = list(opinfo_programs.all_ops())
    if args.ops:
        keys = [k.strip() for k in args.ops.split(",") if k.strip()]
        unknown = [k for k in keys if k not in opinfo_programs.all_ops()]
        if unknown:
            parser.error(f"unknown op keys: {', '.join(unknown)}")
    elif args.mode == "subset":
        keys = oc.subset_op_keys()
    else:
        keys = all_keys
    out = args.out or (os.path.join(REPO, "docs", "reports", "coverage.md") if args.mode == "full"
                       and not args.ops else None)
    shown = list(argv if argv is not None else sys.argv[1:])
    if "--json" in shown:  # an extra output; the report does not depend on it
        i = shown.index("--json")
        del shown[i:i + 2]
    command = "python tools/opinfo_sweep.py " + " ".join(shown)
    results, duration = run_sweep(args, keys)
    meta = {
        "command": command.strip(),
        "torch": torch.__version__,
        "engine": engine_version(),
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs" + (
            f", samples on {torch.cuda.get_device_name()}" if args.device.startswith("cuda")
            else ""),
        "mode": args.mode + (f" (--ops {args.ops})" if args.ops else "") + (
            f" **({args.interrupted})**" if args.interrupted else ""),
        "n_ops": len(keys),
        "samples": ("first comparable of the first 4, per dtype and placement"
                    if args.mode == "subset" else (args.max_samples or "all")),
        "timeout": args.timeout,
        "jobs": args.jobs,
        "duration": duration,
        "finished": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": results}, fh)
    rows = list(_case_rows(results))
    total = _counts(rows)
    if out:
        write_report(results, meta, out)
        print(f"[sweep] wrote {out}", file=sys.stderr)
    print(f"[sweep] {duration / 60:.1f} min: {total['cases']} cases, ours {total['ours']}, "
          f"torch.func {total['ref']}, blockers {total['blockers']}", file=sys.stderr)
    return 130 if args.interrupted else 0  # 130: as a shell reports an interrupted command


if __name__ == "__main__":
    sys.exit(main())
