"""TorchScript inside functionalized functions: a script function warmed up by the profiling
executor differentiates as in eager; TorchScript runs unoptimized while a layer is active, and as
before after a raise (Note [Layer: TorchScript fusion groups read data pointers]); a function
optimized before f drops that plan inside f (its fusion groups' check needs a fuser: a GPU or LLVM)."""
import pytest
import torch

from torch_functionalize import functionalize
from torch_functionalize.testing._internal.reference import (
    REMOVE_MODES, TEST_DEVICE, assert_call_and_graphs_match_eager,
)


@torch.jit.script
def _scripted(x, w):
    return torch.relu(x * w)


# A torch.jit.script function warmed up by the profiling executor runs as a DifferentiableGraph,
# which sets its backward node on the wrapper it returns: the leaf got no gradient, silently
# (Note [Wrapper: history set on a wrapper]).
@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_warmed_up_torchscript_function_differentiates_as_in_eager(remove):
    def f(x, w):
        w = w.clone().requires_grad_()
        for _ in range(4):  # the third call onwards runs the optimized graph
            y = _scripted(x, w)
        y.sum().backward()
        return w.grad

    x, w, other = torch.tensor([[1.0, -2.0, 3.0]]), torch.ones(3), torch.tensor([[-1.0, 2.0, 0.5]])
    assert_call_and_graphs_match_eager(f, (x, w), (other, w), remove)


def test_torchscript_runs_unoptimized_inside_f_and_as_before_after_a_raise():
    # On CUDA a fusion group of a script function optimized inside f read the wrappers' null data
    # pointers: an illegal memory access that poisoned the process (first GPU run of the warmed-up
    # test above). See Note [Layer: TorchScript fusion groups read data pointers].
    seen = []

    def f(x):
        seen.append(torch._C._get_graph_executor_optimize())
        return _scripted(x, x) + 1

    def g(x):
        seen.append(torch._C._get_graph_executor_optimize())
        raise ValueError("inside g")

    fuser = torch._C._jit_texpr_fuser_enabled()
    try:
        for setting in (True, False):
            torch._C._set_graph_executor_optimize(setting)
            x = torch.randn(3)
            torch.testing.assert_close(functionalize(f)(x), f(x))
            with pytest.raises(ValueError, match="inside g"):
                functionalize(g)(x)
            assert torch._C._get_graph_executor_optimize() == setting
    finally:
        torch._C._set_graph_executor_optimize(True)
    assert seen == [False, True, False, False, False, False]  # eager's own call of f saw True
    assert torch._C._jit_texpr_fuser_enabled() == fuser


_OPTIMIZED_BEFORE_F = """
import sys
import torch
from torch_functionalize import functionalize
device = sys.argv[1]
if device == "cpu":
    torch._C._jit_override_can_fuse_on_cpu(True)  # CUDA fuses by default; the CPU needs this

@torch.jit.script
def g(x, y):
    return (x * y + 1).sigmoid() * 2

x, y = torch.randn(64, device=device), torch.randn(64, device=device)
for _ in range(5):
    g(x, y)  # optimized before f: the plan holds a fusion group
assert "FusionGroup" in str(torch.jit.last_executed_optimized_graph())

def f(a, b):
    a.add_(1)
    return g(a, b)

torch.testing.assert_close(functionalize(f)(x.clone(), y), f(x.clone(), y))
"""

_HAS_FUSER = TEST_DEVICE != "cpu" or torch._C._llvm_enabled()


@pytest.mark.skipif(not _HAS_FUSER, reason="needs a TorchScript fuser: a GPU, or a CPU build of torch "
                    "with LLVM (torch._C._llvm_enabled() is False here)")
def test_torchscript_fusion_group_optimized_before_f_runs_inside_f():
    # The fused kernel of a plan made before f would read the wrappers' null data pointers (an
    # illegal memory access on the GPU); inside f the plan is dropped
    # (Note [Layer: TorchScript fusion groups read data pointers]).
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _OPTIMIZED_BEFORE_F, TEST_DEVICE],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@torch.jit.script
def _scripted_pointwise(x, y):
    return (x * y + 1).sigmoid() * 2


@pytest.mark.parametrize("remove", REMOVE_MODES)
def test_torchscript_plan_made_before_f_is_not_used_inside_f(remove):
    # A plan optimized before f (here a DifferentiableGraph, on a device with a fuser also fusion
    # groups) is dropped on the first call inside f, which runs the unoptimized plan; after f the
    # function optimizes again (Note [Layer: TorchScript fusion groups read data pointers]).
    def optimized():
        return "DifferentiableGraph" in str(torch.jit.last_executed_optimized_graph())

    x = torch.randn(64, device=TEST_DEVICE, requires_grad=True)
    y = torch.randn(64, device=TEST_DEVICE)
    for _ in range(5):
        _scripted_pointwise(x, y)
    assert optimized()
    seen = []

    def f(a, b):
        for _ in range(3):
            out = _scripted_pointwise(a, b)
            seen.append(optimized())
        out.sum().backward()
        return out.detach()

    actual = functionalize(f, remove=remove)(x, y)
    actual_grad, x.grad = x.grad, None
    assert seen == [False, False, False]
    expected = f(x, y)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_grad, x.grad)
    for _ in range(5):
        _scripted_pointwise(x, y)
    assert optimized()
