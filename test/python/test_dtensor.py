"""DTensor inputs to functionalize(f) on real gloo ranks on 127.0.0.1: they stay DTensors inside f,
outputs keep eager's placements, values and input mutations match eager on every rank, and the
traced graph is the functional local program. The ranks run dtensor_cases.py (once per session);
each case is one pytest item. See Note [API: wrapper subclasses].
"""
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dtensor_cases  # noqa: E402
from test_distributed import _free_port  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with gloo",
)

WORLD = 2
LAUNCH_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("dtensor")
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        log = open(out_dir / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, os.path.join(HERE, "dtensor_cases.py"),
             str(out_dir / f"rank{rank}.json")],
            env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failures = []
    for rank, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p, _ in procs:
                p.kill()
            rc = "timeout"
        log.close()
        if rc != 0:
            failures.append(f"rank {rank} exited with {rc}:\n"
                            + (out_dir / f"rank{rank}.log").read_text()[-3000:])
    if failures:
        pytest.fail("\n".join(failures))
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("case_id", dtensor_cases.case_ids())
def test_dtensor(ranks, case_id):
    problems = [f"rank {r}: {res.get(case_id, 'not run')}" for r, res in enumerate(ranks)
                if res.get(case_id, "not run") is not None]
    assert not problems, "\n".join(problems)
