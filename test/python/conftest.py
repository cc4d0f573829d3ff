"""Shared pytest fixtures: remove modes, devices and a fixed seed; helpers live in reference.py."""

import os
import sys

import pytest
import torch

# Make `import reference` work however pytest is invoked (rootdir or this folder).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=reference.REMOVE_MODES)
def remove(request):
    """Each test that takes `remove` runs once per remove mode."""
    return request.param


@pytest.fixture(params=DEVICES)
def device(request):
    """Each test that takes `device` runs once per available device."""
    return request.param


@pytest.fixture(autouse=True)
def _fixed_seed():
    # Random inputs are reproducible per test, and random ops inside f see the same stream.
    torch.manual_seed(0)
