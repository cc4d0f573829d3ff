"""The harness of the torch.compile backend's tests: a user compiler that records the functional
graphs it is handed, and a check of a compiled function against eager over several calls (the
tests take conftest's fresh_dynamo fixture).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from torch_functionalize import backend
from torch_functionalize.testing import clone_inputs
from torch_functionalize.testing._internal.reference import (
    assert_functional_graph, assert_trees_match,
)


class Recorder:
    """A user compiler that records each functional graph and runs it."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        self.graphs.append(gm)

        def run(*args: Any) -> Any:
            self.calls += 1
            return gm(*args)

        return run


def compile_matches_eager(f: Callable[..., Any], *inputs: Any, remove: str = "mutations",
                          calls: int = 1, dynamic: bool | None = None) -> Recorder:
    """Runs f eagerly and compiled with the backend on copies of `inputs`, `calls` times each;
    outputs and inputs must match eager after every call, and every graph must be functional."""
    recorder = Recorder()
    compiled = torch.compile(f, backend=backend(compiler=recorder, remove=remove), dynamic=dynamic)
    eager_in, comp_in = clone_inputs(inputs), clone_inputs(inputs)
    for i in range(calls):
        expected = f(*eager_in)
        actual = compiled(*comp_in)
        assert_trees_match(actual, expected, f"output of call {i}")
        assert_trees_match(comp_in, eager_in, f"inputs after call {i}", check_strides=True)
    assert recorder.graphs, "dynamo compiled no graph"
    assert recorder.calls >= calls, "the user compiler's callable was not used"
    for gm in recorder.graphs:
        assert_functional_graph(gm, remove)
    return recorder
