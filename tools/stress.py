"""Soak and thread stress for torch_functionalize (issue #12, item 4).

  python tools/stress.py soak [--ops 1000000] [--max-growth-mib 32]
      Runs a mix of functionalized programs (both remove modes, eagerly and, every few
      iterations, traced with make_fx and replayed) until at least --ops ATen ops have been
      functionalized, sampling the process's resident memory and the number of live Python
      tensor objects. Fails (exit 1) if either grows past its bound between the end of warm-up
      (the first 10% of the run) and the end.
  python tools/stress.py threads [--threads 8] [--iterations 200]
      Runs functionalized programs on several threads at once (each thread its own program,
      several threads one shared program, and one thread running plain eager code on tensors the
      others also read), checking every result against eager values computed beforehand on one
      thread. Fails (exit 1) on any mismatch or exception.

The program mix, soak and threads are in torch_functionalize.testing._internal.stress; the test
suite runs short versions of both (test/python/test_stress.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from torch_functionalize.testing._internal.stress import soak, threads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("soak", help="long run; fails if memory or live tensors grow")
    s.add_argument("--ops", type=int, default=1_000_000)
    s.add_argument("--max-growth-mib", type=float, default=32.0)
    s.add_argument("--max-tensor-growth", type=int, default=100)
    s.add_argument("--trace-every", type=int, default=50,
                   help="trace with make_fx and replay every Nth call (0: never)")
    t = sub.add_parser("threads", help="concurrent functionalize calls checked against eager")
    t.add_argument("--threads", type=int, default=8)
    t.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    if args.command == "soak":
        r = soak(args.ops, trace_every=args.trace_every)
        print(f"soak: {r.ops:,} ATen ops in {r.calls:,} functionalized calls, {r.seconds:.0f} s")
        print("| ATen ops so far | RSS (MiB) | live Python tensors |")
        print("|---|---|---|")
        for ops, rss, live in r.samples:
            print(f"| {ops:,} | {rss:.1f} | {live} |")
        print(f"growth after warm-up: RSS {r.rss_growth_mib:+.1f} MiB (bound {args.max_growth_mib}),"
              f" live tensors {r.tensor_growth:+d} (bound {args.max_tensor_growth})")
        for f in r.failures:
            print("MISMATCH", f)
        ok = (not r.failures and r.rss_growth_mib <= args.max_growth_mib
              and r.tensor_growth <= args.max_tensor_growth)
    else:
        r = threads(args.threads, args.iterations)
        print(f"threads: {r.threads} threads ({r.threads - 1} functionalizing, 1 eager), "
              f"{r.calls:,} functionalized calls checked, {r.seconds:.1f} s")
        for f in r.failures:
            print("FAILURE", f)
        ok = not r.failures
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
