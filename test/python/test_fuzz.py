"""A short fixed-seed run of the differential fuzzer (tools/fuzz.py: programs 0..99, every path,
no shrinking, ~5 s). Its failures of ours are open bugs, listed in docs/reliability.md; this test
keeps the list exact in both directions: a new failure fails it, and so does a fixed one (remove
it from KNOWN then), like a strict xfail per case."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import fuzz  # noqa: E402

# (program seed, path, kind) found by `python tools/fuzz.py --programs 100 --seed 0` at the commit
# that added this test. Classes (docs/reliability.md): make_fx replays of programs with aliased,
# strided inputs index with wrong values ("fx_* error"); in-place ops whose source aliases the
# written tensor (masked_scatter_(m, x0) on x0) and writes through aliased strided inputs differ
# in value; a few ops raise torch's internal errors on wrappers; one output that eager returns as
# the input itself comes back as a copy ("alias").
KNOWN = {
    (2, "fx_mav", "error"), (2, "fx_mut", "error"), (2, "ours_mav", "error"),
    (2, "ours_mut", "error"), (3, "fx_mav", "error"), (3, "fx_mut", "error"),
    (3, "ours_mav", "error"), (3, "ours_mut", "error"), (4, "fx_mav", "error"),
    (4, "fx_mut", "error"), (6, "fx_mav", "value"), (6, "fx_mut", "value"),
    (6, "ours_mav", "value"), (6, "ours_mut", "value"), (8, "fx_mav", "error"),
    (8, "fx_mut", "error"), (8, "ours_mav", "error"), (8, "ours_mut", "error"),
    (14, "ours_mut", "alias"), (22, "fx_mav", "error"), (22, "fx_mut", "error"),
    (24, "fx_mav", "error"), (24, "fx_mut", "error"), (26, "fx_mav", "error"),
    (26, "fx_mut", "error"), (30, "fx_mav", "error"), (30, "fx_mut", "error"),
    (35, "fx_mav", "error"), (35, "fx_mut", "error"), (36, "fx_mav", "value"),
    (36, "fx_mut", "value"), (36, "ours_mav", "value"), (36, "ours_mut", "value"),
    (52, "fx_mav", "error"), (52, "fx_mut", "error"), (55, "fx_mav", "error"),
    (55, "fx_mut", "error"), (58, "fx_mav", "error"), (58, "fx_mut", "error"),
    (60, "fx_mav", "value"), (60, "fx_mut", "value"), (60, "ours_mav", "value"),
    (60, "ours_mut", "value"), (62, "fx_mav", "value"), (62, "fx_mut", "value"),
    (62, "ours_mav", "value"), (62, "ours_mut", "value"), (69, "fx_mav", "error"),
    (69, "fx_mut", "error"), (70, "fx_mav", "error"), (70, "fx_mut", "error"),
    (71, "fx_mav", "error"), (71, "ours_mav", "error"), (73, "fx_mav", "error"),
    (73, "fx_mut", "error"), (77, "fx_mav", "value"), (77, "fx_mut", "value"),
    (77, "ours_mav", "value"), (77, "ours_mut", "value"), (91, "fx_mav", "error"),
    (91, "fx_mut", "error"),
}


def test_short_fuzz_run_finds_exactly_the_known_failures():
    found = set(fuzz.failures_of_ours(0, 100))
    assert found - KNOWN == set(), f"new failures: {sorted(found - KNOWN)}"
    assert KNOWN - found == set(), f"fixed (remove from KNOWN): {sorted(KNOWN - found)}"
