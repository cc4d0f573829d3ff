"""OpInfo differential sweep, fast subset: eager vs ours vs torch.func.functionalize.

One test per (op, placement, dtype, remove mode) of opinfo_cases.SUBSET_OPS, each on the first of
the op's first samples that eager runs deterministically in that placement (chosen at
collection), plus the cases of opinfo_cases.REGRESSION_CASES (their ids name the sample). Ours
must match eager (outputs, final inputs, a functional make_fx graph that replays to the same
values). Where ours fails, torch.func must fail as well, and ours must not fail worse (a clear
error is better than a wrong number). The full sweep and its report are opinfo_sweep.py:
`python tools/opinfo_sweep.py --full --out docs/reports/coverage.md`.
"""

import pytest

from torch_functionalize.testing._internal import opinfo_cases as oc


def _params():
    params = []
    for key in oc.subset_op_keys():
        for case in oc.subset_cases_for_op(key, max_tries=SUBSET_TRIES):
            if case.na is not None:
                continue  # eager cannot run it: listed as not applicable in the sweep report
            sample = f"-s{case.sample_index}" if case.regression else ""
            for remove in oc.REMOVE_MODES:
                params.append(pytest.param(
                    key, case.placement, case.dtype, case.sample_index, remove,
                    id=f"{key}-{case.placement}-{case.dtype}{sample}-{remove}"))
    return params


# No known failures: a case that fails here is a finding (fix it, or mark it a strict xfail that
# names the bug). Cases the full sweep once failed stay in the subset via
# opinfo_cases.REGRESSION_CASES.

SUBSET_TRIES = 4
PARAMS = _params()


def test_subset_covers_every_placement():
    # The stratified selection must keep a case in every category of the report.
    placements = {p.values[1] for p in PARAMS}
    assert placements == set(oc.PLACEMENTS), set(oc.PLACEMENTS) - placements


@pytest.mark.parametrize("key,placement,dtype,sample_index,remove", PARAMS)
def test_opinfo_case_matches_eager(key, placement, dtype, sample_index, remove):
    case = oc.build_case(key, placement, dtype, sample_index)
    result = oc.run_case(case, removes=(remove,))
    assert result.na is None, f"eager no longer runs this case: {result.na}"
    ours = result.runs[oc.run_key("ours", remove)]
    ref = result.runs[oc.run_key("torch.func", remove)]
    if ours.passed:
        return
    if ref.passed:
        pytest.fail(f"ours: {ours.status}: {ours.message} | torch.func passes "
                    f"(sample {case.sample.description})", pytrace=False)
    if not oc.not_worse(ours, ref):
        pytest.fail(f"ours: {ours.status}: {ours.message} | worse than torch.func: "
                    f"{ref.status}: {ref.message} (sample {case.sample.description})",
                    pytrace=False)
