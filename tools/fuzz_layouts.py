"""make_fx graphs of the fuzzer's programs replayed on inputs laid out otherwise than the traced
ones (Note [Inputs: storage coordinates under a tracer]).

  python tools/fuzz_layouts.py --seed 640000 --programs 3000

Each valid program (tools/fuzz.py's generator) is traced with make_fx(functionalize(f)) in both
remove modes on its own inputs, then replayed on two relayouts of fresh inputs: each input a
contiguous clone, and each input at storage offset 3 of a larger buffer with its own strides.
A replay must give eager's outputs and input values on the same relaid inputs, or raise our
layout guard. Where plain make_fx(f) (no functionalize) is wrong on the same relaid inputs too,
the difference is make_fx's own specialization (one tensor passed twice is one placeholder; a
reshape that copied stays a copy) and is counted, not failed. Programs whose eager result is not
deterministic (uninitialized memory returned) are skipped. Exit status 1 if any replay of ours
gave other values or another error. (~16 programs a second on one core.)
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from torch_functionalize.testing._internal.fuzz.layouts import sweep  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--programs", type=int, default=100)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    counts, failures = sweep(args.seed, args.programs)
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    for seed, mode, relayout, outcome in failures:
        print(f"FAILED program {seed} ({mode}, {relayout}): {outcome}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
