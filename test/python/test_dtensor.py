"""DTensor inputs to functionalize(f) on real gloo ranks on 127.0.0.1: they stay DTensors inside f,
outputs keep eager's placements, values and input mutations match eager on every rank, and the
traced graph is the functional local program. The ranks run dtensor_cases.py (once per session);
each case is one pytest item. See Note [API: wrapper subclasses].
"""
import pytest
import torch.distributed as dist

from torch_functionalize.testing._internal import dtensor_cases
from torch_functionalize.testing._internal.distributed_cases import launch_ranks

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with gloo",
)

WORLD = 2
LAUNCH_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(dtensor_cases, WORLD, tmp_path_factory.mktemp("dtensor"),
                        timeout_s=LAUNCH_TIMEOUT_S)


@pytest.mark.parametrize("case_id", dtensor_cases.case_ids())
def test_dtensor(ranks, case_id):
    problems = [f"rank {r}: {res.get(case_id, 'not run')}" for r, res in enumerate(ranks)
                if res.get(case_id, "not run") is not None]
    assert not problems, "\n".join(problems)
