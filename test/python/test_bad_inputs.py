"""Every bad input of tools/bad_inputs.py (the table in docs/reliability.md) behaves as its row
states: eager's behaviour, or a clear error from functionalize with the inputs untouched; and
afterwards the thread's dispatch state is what it was before the call."""

import pytest
import torch

from torch_functionalize.testing._internal import bad_inputs


def _dispatch_state():
    return (str(torch._C._dispatch_tls_local_include_set()),
            str(torch._C._dispatch_tls_local_exclude_set()))


@pytest.mark.parametrize("case", bad_inputs.CASES, ids=[c.name for c in bad_inputs.CASES])
def test_bad_input_gets_what_the_table_says(case):
    before = _dispatch_state()
    assert bad_inputs.check(case) is None, bad_inputs.check(case)
    assert _dispatch_state() == before
    plain = torch.ones(2) + 1
    assert type(plain) is torch.Tensor and torch.equal(plain, torch.full((2,), 2.0))
