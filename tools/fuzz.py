"""Differential fuzzer (issue #12): random straight-line programs run eagerly and through every
functionalize path, compared with eager.

  python tools/fuzz.py --seconds 600 --seed 0 [--programs N] [--workers 1] [--out fuzz_out]
                       [--compile]

Programs (the generator in python/torch_functionalize/testing/_internal/fuzz/) take 1-3 inputs
that may alias each other (views, transposes, diagonals, strided and dtype-reinterpreting views of
one base) and mix views of views, in-place and out= ops, metadata mutations, factories, seeded
random ops, copy_ between aliases and returns of views of inputs. Each valid program (eager runs it
twice with equal results) runs through
  ours_mut / ours_mav   functionalize(f) with remove="mutations" / "mutations_and_views",
  fx_mut / fx_mav       make_fx(functionalize(f)) replayed on fresh inputs,
  cap_mut / cap_mav     torch_functionalize.capture(f) replayed on fresh inputs,
  rip_mut / rip_mav     capture's graph after torch_functionalize.reinplace, replayed,
  fxrip_mut             make_fx(functionalize(f)) after reinplace, replayed,
  cpprip_mut / _mav     capture's C++ graph after the C++ pass (tfz::reinplace), replayed,
  tf_mut / tf_mav       torch.func.functionalize(f), for the comparison,
  dyn_mut / dyn_mav     with --compile: torch.compile(f, backend=torch_functionalize.backend(
                        remove=...)), each program a fresh compile (the run then takes about
                        twice as long per program),
and outputs plus inputs afterwards (values, sizes, strides, storage offset; fuzz/check.py there)
are compared with eager (output strides only with views kept: without views outputs are copies;
floats with a tolerance; integers read from floats' bytes may differ only in the bits of NaNs,
which IEEE 754 leaves to the implementation). Each program runs in a worker process, so a crash or a hang (30 s) is a
result, not the end of the run. A failure of ours is shrunk (the shortest failing prefix, then
statements dropped while it still fails the same way) and written as a standalone reproducer
(<out>/repro_<seed>_<path>.py, runnable with python). Named errors ("functionalize: ...",
unsupported programs) are counted and grouped, not failures, and so are make_fx paths' errors that
plain make_fx(f) raises too (make_fx itself cannot trace or print f), and dyn_ paths' failures
that dynamo shows with its plain "eager" backend too (dynamo's own). Exit status 1 if ours
failed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

# The deterministic-algorithm warnings (put_, index_add_, ...) would flood the output.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from torch_functionalize.testing._internal.fuzz import check as fc  # noqa: E402
from torch_functionalize.testing._internal.fuzz.check import NOT_FAILURES, run_one  # noqa: E402

HANG_SECONDS = 30
PROGRESS_SECONDS = 60  # how often a run rewrites OUT/progress.txt


def _init_worker():
    fc.setup_process()


REPRO = '''"""Reproducer written by tools/fuzz.py: program seed {seed}, path {path}, {kind}.
{detail}
Run: python {name}  (prints eager's and the path's results and whether they agree)."""
import json
import sys

from torch_functionalize.testing._internal.fuzz import check as fc
from torch_functionalize.testing._internal.fuzz.program import Program

PROGRAM = Program.from_json(json.loads({program!r}))

if __name__ == "__main__":
    fc.setup_process()
    print(PROGRAM.source())
    eager, reason = fc.eager_outcome(PROGRAM)
    assert eager is not None, reason
    result = fc.judge(PROGRAM, eager, {path!r})
    print({path!r}, result.status, result.message)
    for d in result.diffs:
        print(" ", d.kind, d.where, d.detail[:400])
    sys.exit(0 if result.status == "ok" else 1)
'''


def write_repro(out: Path, seed: int, failure: dict) -> Path:
    name = out / f"repro_{seed}_{failure['path']}.py"
    name.write_text(REPRO.format(seed=seed, path=failure["path"], kind=failure["kind"],
                                 detail=failure["detail"].replace('"""', "'''")[:400],
                                 name=name.name, program=json.dumps(failure["program"])))
    return name


def _new_pool(workers):
    return cf.ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                                  mp_context=multiprocessing.get_context("spawn"))


def fuzz(seed: int, seconds: float, programs: int | None, workers: int, out: Path,
         with_compile: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    stats = {"programs": 0, "valid": 0, "invalid": collections.Counter(),
             "ours": collections.Counter(), "unsupported": collections.Counter(),
             "torch_func_wrong_ours_right": collections.Counter(),
             "make_fx_itself": collections.Counter(), "dynamo_itself": collections.Counter(),
             "crash": [], "hang": [],
             "repros": []}
    start = time.time()
    next_seed = seed
    pool = _new_pool(workers)
    pending = {}
    last_progress = start

    def budget_left():
        return (programs is None or next_seed - seed < programs) and time.time() - start < seconds

    while pending or budget_left():
        while budget_left() and len(pending) < 2 * workers:
            pending[pool.submit(run_one, next_seed, True, with_compile)] = (next_seed, time.time())
            next_seed += 1
        done, _ = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_COMPLETED)
        broken = False
        for fut in done:
            s, _ = pending.pop(fut)
            stats["programs"] += 1
            try:
                r = fut.result()
            except cf.process.BrokenProcessPool:
                stats["crash"].append(s)
                broken = True
                continue
            except Exception as error:  # noqa: BLE001 - the generator itself failed
                stats["invalid"][f"harness: {type(error).__name__}"] += 1
                continue
            if "invalid" in r:
                stats["invalid"][r["invalid"]] += 1
                continue
            stats["valid"] += 1
            for path, status in r["paths"].items():
                if path not in fc.TF_PATHS and status not in NOT_FAILURES:
                    stats["ours"][f"{path}: {status}"] += 1
                if status == fc.MAKE_FX_ITSELF:
                    stats["make_fx_itself"][path] += 1
                if status == fc.DYNAMO_ITSELF:
                    stats["dynamo_itself"][path] += 1
                if status == "unsupported":
                    stats["unsupported"][r["messages"][path]] += 1
            for mode in ("mut", "mav"):
                tf, ours = r["paths"][f"tf_{mode}"], r["paths"][f"ours_{mode}"]
                if tf != "ok" and ours == "ok":
                    stats["torch_func_wrong_ours_right"][tf] += 1
            for failure in r["failures"]:
                stats["repros"].append(str(write_repro(out, r["seed"], failure)))
        now = time.time()
        if now - last_progress > PROGRESS_SECONDS:
            # A long run can be stopped at any time and still leave its figures so far.
            last_progress = now
            stats["seconds"], stats["seeds"] = now - start, (seed, next_seed - 1)
            (out / "progress.txt").write_text(report(stats) + "\n")
        hung = [f for f, (_, t0) in pending.items() if now - t0 > HANG_SECONDS]
        if broken or hung:
            for f in hung:
                stats["hang"].append(pending[f][0])
                stats["programs"] += 1
            # A crashed or hung worker takes the pool down: resubmit what was still pending.
            resubmit = [s for f, (s, _) in pending.items() if f not in hung]
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            pool = _new_pool(workers)
            pending = {pool.submit(run_one, s, True, with_compile): (s, time.time())
                       for s in resubmit}
    pool.shutdown()
    stats["seconds"] = time.time() - start
    stats["seeds"] = (seed, next_seed - 1)
    return stats


def report(stats: dict) -> str:
    lines = [f"programs {stats['programs']:,} (seeds {stats['seeds'][0]}..{stats['seeds'][1]}), "
             f"valid {stats['valid']:,}, {stats['seconds']:.0f} s"]
    lines.append(f"invalid (eager raised or was nondeterministic): {dict(stats['invalid'])}")
    lines.append(f"crashes: {stats['crash'] or 'none'}; hangs: {stats['hang'] or 'none'}")
    lines.append(f"failures of ours: {dict(stats['ours']) or 'none'}")
    for repro in stats["repros"][:50]:
        lines.append(f"  reproducer: {repro}")
    lines.append("make_fx paths failing as plain make_fx(f) does (not ours): "
                 f"{dict(stats.get('make_fx_itself', {})) or 'none'}")
    if stats.get("dynamo_itself"):
        lines.append("dyn_ paths failing as dynamo's plain eager backend does (not ours): "
                     f"{dict(stats['dynamo_itself'])}")
    lines.append("named errors (unsupported), grouped:")
    for message, n in stats["unsupported"].most_common(20):
        lines.append(f"  {n:6d}  {message}")
    lines.append("torch.func wrong where ours is right (by kind): "
                 f"{dict(stats['torch_func_wrong_ours_right']) or 'none'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--programs", type=int, default=None)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--out", type=Path, default=Path("fuzz_out"))
    parser.add_argument("--compile", action="store_true",
                        help="also run each program through torch.compile(backend=tfz)")
    args = parser.parse_args(argv)
    stats = fuzz(args.seed, args.seconds, args.programs, args.workers, args.out, args.compile)
    print(report(stats))
    (args.out / "report.txt").write_text(report(stats) + "\n")
    return 1 if stats["ours"] or stats["crash"] or stats["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
