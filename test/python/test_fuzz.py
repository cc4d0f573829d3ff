"""A short fixed-seed run of the differential fuzzer (tools/fuzz.py: programs 0..99, every path,
no shrinking, ~5 s). Its failures of ours are open bugs, listed in docs/reliability.md; this test
keeps the list exact in both directions: a new failure fails it, and so does a fixed one (remove
it from KNOWN then), like a strict xfail per case."""

import pytest

from torch_functionalize.testing._internal import fuzz
from torch_functionalize.testing._internal.fuzz import layouts

# (program seed, path, kind) found by `python tools/fuzz.py --programs 100 --seed 0`: none open.
# Program 14 ("alias": an output eager returns as a view of an input whose metadata the program
# changed in place came back as a copy) was fixed with Note [Inputs: outputs that alias inputs].
KNOWN: set[tuple[int, str, str]] = set()


# Found by the twenty-seventh session's run (seeds 650000..654703, 4,694 valid programs;
# docs/reliability.md), fixed the same session: make_fx graphs of an input that does not span its
# storage, grown through out= (652798, 654111, 654514: the epilogue wrote the grown elements from
# the storage's start instead of the input's first element;
# Note [Inputs: writes to a grown storage]), resize_ of a view of it taken by other view ops
# (650054: now refused by name, as as_strided), and reinplaced make_fx graphs whose result, read
# through as_strided, was written into such an input (650363, 650915;
# Note [Reinplace: the rules], rule 2).
FIXED_PROGRAMS = (650054, 650363, 650915, 652798, 654111, 654514)


@pytest.mark.parametrize("seed", FIXED_PROGRAMS)
def test_fuzz_programs_fixed_in_the_27th_session_match_eager_on_every_path(seed):
    assert fuzz.failures_of_ours(seed, 1) == []


def test_short_fuzz_run_finds_exactly_the_known_failures():
    found = set(fuzz.failures_of_ours(0, 100))
    assert found - KNOWN == set(), f"new failures: {sorted(found - KNOWN)}"
    assert KNOWN - found == set(), f"fixed (remove from KNOWN): {sorted(KNOWN - found)}"


def test_make_fx_graphs_of_fuzz_programs_hold_on_inputs_laid_out_otherwise():
    # tools/fuzz_layouts.py on programs 0..149 (~10 s): each replay on relaid inputs gives eager's
    # values or our layout guard's error (Note [Inputs: storage coordinates under a tracer]).
    counts, failures = layouts.sweep(0, 150)
    assert failures == [], failures
    assert counts["ok"] > 100 and counts["guarded"] > 20, counts
