"""Shared pytest fixtures: remove modes, the device, a fixed seed and a fresh dynamo; helpers live in
torch_functionalize/testing/_internal/reference.py.

The device comes from one place, the TFZ_TEST_DEVICE environment variable (default cpu):
`TFZ_TEST_DEVICE=cuda python -m pytest test/python` makes cuda torch's default device for the
whole run (torch.set_default_device), so every tensor a test creates without naming a device is
created there, and the `device` fixture returns it for tests that move inputs explicitly. The
OpInfo cases (opinfo_programs.DEVICE) read the same variable. Asking for a device this machine does
not have stops the run at start with a message instead of failing every test.
Rejected: parametrizing `device` over every available device (what this file did): only the tests
that took the fixture ran on CUDA, so a CUDA machine ran the suite on the CPU and called it done.
"""

import pytest
import torch

from torch_functionalize.testing._internal import reference

TEST_DEVICE = reference.TEST_DEVICE


def pytest_configure(config):
    try:
        device = torch.device(TEST_DEVICE)
    except RuntimeError as e:
        raise pytest.UsageError(f"TFZ_TEST_DEVICE={TEST_DEVICE!r} is not a device: {e}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            f"TFZ_TEST_DEVICE={TEST_DEVICE}: no CUDA device on this machine (torch "
            f"{torch.__version__}, torch.cuda.is_available() is False). Unset it to test on the CPU.")
    if device.type != "cpu":
        torch.set_default_device(device)


@pytest.fixture(params=reference.REMOVE_MODES)
def remove(request):
    """Each test that takes `remove` runs once per remove mode."""
    return request.param


@pytest.fixture
def deterministic_fill():
    # Uninitialized memory is filled (NaN / max int): a graph that replays torch.empty's fill onto a
    # constant, or leaves new memory unwritten, shows up as wrong values.
    was_det = torch.are_deterministic_algorithms_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was_det)
    torch.utils.deterministic.fill_uninitialized_memory = was_fill


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches reset before and after the test: graphs compiled by one test would
    otherwise be reused (or count as recompiles) in the next."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def device():
    """The device under test (TFZ_TEST_DEVICE, default cpu)."""
    return TEST_DEVICE


@pytest.fixture(autouse=True)
def _fixed_seed():
    # Random inputs are reproducible per test, and random ops inside f see the same stream.
    torch.manual_seed(0)
