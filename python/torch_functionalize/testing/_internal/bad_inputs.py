"""Bad inputs given to functionalize, and what each gets (issue #12, item 5). `python
tools/bad_inputs.py` prints `table()`, the table of docs/reliability.md.

Every case states its expected outcome: "eager" (the same result, or the same error, as running
the function without functionalize, with the inputs left as eager leaves them) or "error: <regex>"
(a clear error from us, inputs untouched). test/python/test_bad_inputs.py checks every case, and
that the thread's dispatch state is as before the call afterwards.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from torch_functionalize import functionalize
from torch_functionalize.testing import compare


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Callable], object]  # run(wrap): calls the program through wrap (identity = eager)
    expected: str  # "eager" or "error: <regex>"
    note: str = ""


def _plain(fn, remove="mutations"):
    return lambda wrap: wrap(fn, remove)


def _with_inputs(fn, make_inputs, remove="mutations"):
    """The case runs fn on fresh inputs; returns (outputs, inputs after) for comparison."""

    def run(wrap):
        inputs = make_inputs()
        return wrap(fn, remove)(*inputs), inputs

    return run


_ESCAPED = []


def _keep_wrapper(x):
    _ESCAPED.append(x * 2)
    return x + 1


def _use_escaped(wrap):
    _ESCAPED.clear()
    wrap(_keep_wrapper, "mutations")(torch.ones(3))
    if not _ESCAPED:
        raise RuntimeError("nothing escaped")  # eager keeps a plain tensor, usable
    return _ESCAPED[0] + 1


def _nested_call(wrap):
    inner = functionalize(lambda y: y.add_(1))
    return wrap(lambda x: inner(x) * 2, "mutations")(torch.ones(3))


def _mutate_captured(wrap):
    captured = torch.zeros(3)

    def f(x):
        captured.add_(1)
        return x + captured

    return wrap(f, "mutations")(torch.ones(3)), captured


def _write_view_of_captured(wrap):
    captured = torch.zeros(3)

    def f(x):
        captured.view(-1)[0].add_(1)
        return x

    return wrap(f, "mutations_and_views")(torch.ones(3)), captured


def _inference_tensor():
    with torch.inference_mode():
        return (torch.ones(3),)


def _inference_inside(x):
    with torch.inference_mode():
        y = x * 2
        y.add_(1)
    return y


def _no_grad_inside(x):
    with torch.no_grad():
        x.add_(1)
    return x * 2


def _requires_grad_leaf():
    return (torch.ones(3, requires_grad=True),)


def _sparse():
    return (torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (3,)),)


def _quantized():
    return (torch.quantize_per_tensor(torch.linspace(-1, 1, 4), 0.1, 0, torch.qint8),)


def _nested():
    return (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),)


CASES = [
    Case("string where a tensor is expected", _with_inputs(lambda x: x + 1, lambda: ("abc",)),
         "eager", "eager's TypeError"),
    Case("None among the arguments", _with_inputs(lambda x, y: x + 1, lambda: (torch.ones(3), None)),
         "eager"),
    Case("remove='views'", lambda wrap: wrap(lambda x: x, "views")(torch.ones(3)),
         'error: remove must be "mutations" or "mutations_and_views"; got "views"'),
    Case("remove=None", lambda wrap: wrap(lambda x: x, None)(torch.ones(3)),
         'error: remove must be "mutations" or "mutations_and_views"; got "None"'),
    Case("wrapper kept past the call and used", _use_escaped,
         "error: escaped the functionalize call"),
    Case("functionalize inside a functionalized function", _nested_call,
         "eager", "the inner call runs in the outer layer"),
    Case("mutation of a tensor captured from outside f", _mutate_captured,
         "eager", "the captured tensor is mutated as in eager; a traced graph cannot hold it"),
    Case("write through a view of a captured tensor, without views", _write_view_of_captured,
         "eager", "written through the captured tensor's own view as in eager; a traced graph "
         "cannot hold it"),
    Case("sparse COO input, read", _with_inputs(lambda s: s * 2, _sparse), "eager"),
    Case("sparse COO input, written in place", _with_inputs(lambda s: s.mul_(2), _sparse), "eager"),
    Case("quantized input", _with_inputs(lambda q: q.dequantize() + 1, _quantized), "eager"),
    Case("nested tensor input", _with_inputs(lambda n: n * 2, _nested),
         "error: is a nested tensor, which functionalize does not support"),
    Case("meta input, written in place",
         _with_inputs(lambda m: m.add_(1) * 2, lambda: (torch.empty(3, device="meta"),)), "eager"),
    Case("inference tensor written outside inference mode",
         _with_inputs(lambda x: x.add_(1), _inference_tensor), "eager", "eager's RuntimeError"),
    Case("inference_mode inside f", _with_inputs(_inference_inside, lambda: (torch.ones(3),)),
         "eager"),
    Case("torch.no_grad inside f, in-place on an input",
         _with_inputs(_no_grad_inside, lambda: (torch.ones(3),)), "eager"),
    Case("in-place on a leaf that requires grad",
         _with_inputs(lambda x: x.add_(1), _requires_grad_leaf), "eager", "eager's RuntimeError"),
]


def _eager_wrap(fn, remove):
    return fn


def _ours_wrap(fn, remove):
    return functionalize(fn, remove=remove)


def outcome(case: Case, wrap) -> tuple[str, object]:
    """("ok", value) or ("error", exception)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", case.run(wrap)
        except Exception as error:  # noqa: BLE001 - the outcome is what we report
            return "error", error


def check(case: Case) -> str | None:
    """None if the case behaves as it states, else why not."""
    ours_kind, ours = outcome(case, _ours_wrap)
    if case.expected.startswith("error: "):
        pattern = case.expected[len("error: "):]
        if ours_kind != "error":
            return f"expected an error matching {pattern!r}, got {ours!r}"
        if not re.search(re.escape(pattern), str(ours)) or "functionalize" not in str(ours):
            return f"error {str(ours)[:200]!r} does not match {pattern!r}"
        return None
    eager_kind, eager = outcome(case, _eager_wrap)
    if eager_kind == "error":
        if ours_kind != "error" or type(ours) is not type(eager):
            return f"eager raised {type(eager).__name__}, ours gave {ours_kind}: {ours!r}"
        return None
    if ours_kind == "error":
        return f"eager ran, ours raised {type(ours).__name__}: {ours}"
    dense = lambda v: v.to_dense() if isinstance(v, torch.Tensor) and v.is_sparse else v  # noqa: E731
    if case.name.startswith("meta"):  # meta tensors have no values: compare metadata only
        same = [(t.shape, t.dtype) for t in torch.utils._pytree.tree_leaves(ours)] == [
            (t.shape, t.dtype) for t in torch.utils._pytree.tree_leaves(eager)]
        return None if same else "meta results differ"
    return compare(torch.utils._pytree.tree_map(dense, ours),
                   torch.utils._pytree.tree_map(dense, eager), "result")


def table() -> str:
    lines = ["| bad input | what it gets | checked |", "|---|---|---|"]
    for case in CASES:
        kind, value = outcome(case, _ours_wrap)
        if case.expected == "eager":
            got = "eager's behaviour" + (f" ({case.note})" if case.note else "")
        else:
            got = "error: `" + str(value).splitlines()[0][:150].replace("|", "\\|") + "`"
        lines.append(f"| {case.name} | {got} | {'yes' if check(case) is None else 'NO'} |")
    return "\n".join(lines)

