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
# docs/reliability.md). Fixed the same session: make_fx graphs of an input that does not span its
# storage, grown through out= (652798, 654111, 654514: the epilogue wrote the grown elements from
# the storage's start instead of the input's first element;
# Note [Inputs: writes to a grown storage]), and reinplaced make_fx graphs whose result, read
# through as_strided, was written into such an input (650363, 650915;
# Note [Reinplace: the rules], rule 2).
FIXED_PROGRAMS = (650363, 650915, 652798, 654111, 654514)
# Open: resize_ of a view (unfold of movedim) of such an input reaching storage elements outside
# it, then a write through the input: the input's own base, replaced by the write's fresh value,
# no longer has the storage's coordinates the resized view's as_strided step counts in, and the
# view reads other elements (make_fx, both remove modes). Refusing resize_ of every view of such
# an input would also refuse programs that are right (test_conjugate_views.py, no write after).
# Kept exact: a fix fails the test until its entry goes.
OPEN_PROGRAMS: dict[int, set[tuple[str, str]]] = {
    650054: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
}


@pytest.mark.parametrize("seed", sorted(OPEN_PROGRAMS) + list(FIXED_PROGRAMS))
def test_fuzz_programs_of_the_27th_session_fail_exactly_as_known(seed):
    found = {(path, kind) for _, path, kind in fuzz.failures_of_ours(seed, 1)}
    assert found == OPEN_PROGRAMS.get(seed, set()), f"program {seed}: {sorted(found)}"


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
