"""Checking a functionalized program against eager PyTorch, the definition of correct.

``check_against_eager`` runs a program eagerly and through candidates (``functionalize(f)``, a
traced graph, ...) on separate copies of the same inputs and compares the outputs and the final
state of every input; ``compare`` compares two pytrees. The test suite, the benchmarks and the
demo CLI all use these, so "matches eager" means one thing everywhere.

The harness that the tests, tools/ and benchmarks/ share (reference checks, OpInfo and
distributed cases, the fuzzer, the benchmark workloads) is ``testing._internal``: not public API,
it changes with them.
"""
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree

__all__ = ["clone_inputs", "compare", "check_against_eager"]


def _clone_tensor(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor equal to ``t`` with the same sizes, strides (when they do not overlap) and
    requires_grad."""
    with torch.no_grad():
        if t.layout == torch.strided and t.numel() > 0 and torch._debug_has_internal_overlap(t) == 0:
            out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
            out.copy_(t)
        else:
            out = t.clone()
    return out.requires_grad_(t.requires_grad)


def clone_inputs(tree: Any) -> Any:
    """Clones every tensor leaf of a pytree (strides kept), leaving other leaves as they are."""
    return pytree.tree_map_only(torch.Tensor, _clone_tensor, tree)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{type(value).__name__}({str(value.dtype).replace('torch.', '')}{list(value.shape)})"
    return type(value).__name__


def compare(
    actual: Any,
    expected: Any,
    what: str = "output",
    *,
    check_strides: bool = False,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Optional[str]:
    """None if two pytrees agree, else the first difference, in words. Same structure; tensors of
    the same type, dtype and shape (and strides, if asked) whose values are equal within
    ``torch.testing.assert_close``'s tolerances (NaN equal to NaN); other leaves equal."""
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        return f"{what}: structure {actual_spec} != {expected_spec}"
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = f"{what} {i}" if len(expected_leaves) > 1 else what
        if not isinstance(e, torch.Tensor):
            if a != e:
                return f"{where}: got {a!r}, expected {e!r}"
            continue
        if type(a) is not type(e) or a.dtype != e.dtype or a.shape != e.shape:
            return f"{where}: got {_describe(a)}, expected {_describe(e)}"
        if check_strides and a.stride() != e.stride():
            return f"{where}: strides {a.stride()} != {e.stride()}"
        try:
            torch.testing.assert_close(
                a.detach(), e.detach(), rtol=rtol, atol=atol, equal_nan=True
            )
        except AssertionError as error:
            return f"{where}: " + " ".join(str(error).split())
    return None


def check_against_eager(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    candidates: Iterable[Tuple[str, Callable[..., Any]]],
    *,
    check_strides: bool = False,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Optional[str]:
    """None if every candidate matches eager ``fn`` on copies of ``inputs`` (outputs, and the
    final state of every input), else why not. ``candidates`` are (label, callable) pairs."""
    expected_inputs = clone_inputs(tuple(inputs))
    try:
        expected = fn(*expected_inputs)
    except Exception as error:  # noqa: BLE001 - reported, not swallowed
        return f"eager raised {type(error).__name__}: {_first_line(error)}"
    for label, candidate in candidates:
        actual_inputs = clone_inputs(tuple(inputs))
        try:
            actual = candidate(*actual_inputs)
        except Exception as error:  # noqa: BLE001 - reported, not swallowed
            return f"{label} raised {type(error).__name__}: {_first_line(error)}"
        problem = compare(actual, expected, "output", rtol=rtol, atol=atol) or compare(
            actual_inputs, expected_inputs, "input", check_strides=check_strides, rtol=rtol,
            atol=atol,
        )
        if problem:
            return f"{label}: {problem}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
