"""torch.distributed collectives inside functionalize, on real gloo ranks on 127.0.0.1.

The ranks start once per world size (2, and 4 for a smaller set) as subprocesses running
distributed_cases.py, which runs every case on every rank and writes per-case results; each
case is then one pytest item here, so a failure is named (case, remove mode, check, rank).
Bounded: each launch has a timeout, and the port is chosen at run time.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from torch_functionalize.testing._internal import distributed_cases
from torch_functionalize.testing._internal.distributed_cases import free_port, launch_ranks

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed with gloo",
)

LAUNCH_TIMEOUT_S = 240


def _launch(world, tmp_path_factory):
    return launch_ranks(distributed_cases, world, tmp_path_factory.mktemp(f"dist{world}"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _launch(2, tmp_path_factory)


def _assert_case(results, case_id):
    problems = [f"rank {r}: {res.get(case_id, 'not run')}" for r, res in enumerate(results)
                if res.get(case_id, "not run") is not None]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case_id", distributed_cases.case_ids(2))
def test_two_ranks(two_ranks, case_id):
    _assert_case(two_ranks, case_id)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return _launch(4, tmp_path_factory)


@pytest.mark.parametrize("case_id", distributed_cases.case_ids(4))
def test_four_ranks(four_ranks, case_id):
    _assert_case(four_ranks, case_id)


def test_ddp_example_runs_under_torchrun():
    """examples/distributed/ddp_step.py, as a user runs it: torchrun, 2 ranks; every rank checks
    eager, functionalize and the graph replay against each other and exits 0 only if they agree."""
    root = os.path.dirname(os.path.dirname(HERE))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           os.path.join(root, "examples", "distributed", "ddp_step.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "_c10d_functional.all_reduce.default" in proc.stdout
    assert "c10d.allreduce_" not in proc.stdout
    assert proc.stdout.count("OK, matches eager") == 2
