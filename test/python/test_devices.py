"""The device under test comes from one place (TFZ_TEST_DEVICE, see conftest.py), and every
command that takes a device refuses one the machine does not have, at once and by name."""

import os
import subprocess
import sys

import pytest
import torch

from torch_functionalize.testing._internal.reference import TEST_DEVICE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_CUDA = not torch.cuda.is_available()


def _run(args, **env):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_device_fixture_and_default_device_follow_tfz_test_device(device):
    assert device == TEST_DEVICE == os.environ.get("TFZ_TEST_DEVICE", "cpu")
    assert torch.empty(1).device.type == torch.device(TEST_DEVICE).type


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", [
    ["-m", "pytest", "test/python/test_notes.py", "-q", "-p", "no:cacheprovider"],
    ["tools/opinfo_sweep.py", "--ops", "add", "--device", "cuda"],
    ["test/python/opinfo_sweep.py", "--ops", "add", "--device", "cuda"],
    ["benchmarks/run.py", "--only", "tiny/inplace", "--device", "cuda"],
    ["tools/hidden_writes.py", "--ops", "add", "--device", "cuda"],
], ids=["pytest", "opinfo_sweep", "opinfo_sweep_test_path", "benchmarks", "hidden_writes"])
def test_cuda_commands_refuse_a_machine_without_cuda(command):
    result = _run(command, TFZ_TEST_DEVICE="cuda")
    assert result.returncode != 0
    assert "no CUDA device on this machine" in result.stdout + result.stderr
