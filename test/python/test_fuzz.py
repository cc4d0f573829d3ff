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


# Found by the twenty-seventh session's runs (seeds 650000..654703 and 660000..669521, 14,192
# valid programs; docs/reliability.md). Fixed the same session: make_fx graphs of an input that
# does not span its storage (under a tracer it keeps its own base), grown through out= or resize_
# (652798, 654111, 654514: the epilogue wrote the grown elements from the storage's start, not the
# input's first element, Note [Inputs: writes to a grown storage]; 661430, 665508: written before
# growing, its base no longer held the storage's other elements, now refused by name; 663693: a
# base still the caller's tensor counts in the storage's offsets already), and reinplaced make_fx
# graphs whose result, read through as_strided, was written into such an input (650363, 650915;
# Note [Reinplace: the rules], rule 2).
FIXED_PROGRAMS = (650363, 650915, 652798, 654111, 654514, 661430, 663693, 665508)
# Open, the same class on make_fx graphs: an input that does not span its storage, whose own base
# does not hold the storage's other elements, which the program then reaches through a resize_
# within the storage (669128, 650054 and 664602 through a view of it), a dtype view or an out=
# write into a view of it (661658, 666119), a metadata change before out= (662764), or out= of
# another shape after a random fill (661439). And one on every path: a float32 input viewed
# as int64 after a write, whose element pairs read bytes of neighbouring elements (668633). Kept
# exact: a fix fails the test until its entry goes.
OPEN_PROGRAMS: dict[int, set[tuple[str, str]]] = {
    650054: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
    661439: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
    661658: {("fx_mav", "value")},
    662764: {("fx_mav", "value")},
    664602: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
    666119: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
    668633: {(path, "value") for path in (
        "cap_mav", "cap_mut", "cpprip_mav", "cpprip_mut", "fx_mav", "fx_mut", "fxrip_mut",
        "ours_mav", "ours_mut", "rip_mav", "rip_mut")},
    669128: {("fx_mav", "value"), ("fx_mut", "value"), ("fxrip_mut", "value")},
    # Seeds 670000..672107 (a third run, 2,107 valid programs): torch's setStorage error instead
    # of a named one, a complex input of that kind resized while an alias of it lives.
    671880: {("fx_mav", "error"), ("fx_mut", "error"), ("fxrip_mut", "error")},
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
