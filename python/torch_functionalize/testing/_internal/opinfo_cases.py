"""Cases and the case runner of the OpInfo differential sweep (issue #3, points 1 and 2).

A case is one OpInfo sample placed in one small program (`PLACEMENTS`: the plain op, its in-place
variant on an intermediate / an input / a view of an intermediate, its out= variant, and, for ops
whose result aliases an argument, a mutation through that alias). `run_case` runs the program
eagerly and then through each implementation (ours and torch.func.functionalize) in each remove
mode, and returns one `RunResult` per (implementation, mode): the outputs and the final state of
the inputs must match eager, the make_fx graph must be functional, and that graph, run again on
fresh inputs, must match eager too. Cases that cannot be compared (eager raises, eager is not
deterministic, uninitialized outputs) are kept with a "not applicable" reason, never dropped.
The ops, their samples and the program builder are in opinfo_programs.py. This module knows
nothing of pytest or reports: test_opinfo.py and tools/opinfo_sweep.py drive it.
"""

import contextlib
import dataclasses
import functools
import math
import signal
import threading
import time
from typing import Callable, Optional

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from . import reference
from .opinfo_programs import (
    Probe, Sample, _clone, _first_line, _quiet, _seed, all_ops, build_program, dtype_name,
    dtypes_for, probe, samples_for,
)

DEFAULT_TIMEOUT_S = 60.0
REMOVE_MODES = reference.REMOVE_MODES

# Placement -> what the program does with the op (report wording).
PLACEMENTS = {
    "plain": "plain op on the inputs",
    "inplace_intermediate": "in-place variant on an intermediate",
    "inplace_input": "in-place variant on an input",
    "inplace_view": "in-place variant on a view of an intermediate",
    "out": "out= into an intermediate",
    "out_resized": "out= into a 0-size intermediate (resized)",
    "view_mutate": "alias of an intermediate mutated, base returned",
    "view_input_mutate": "alias of an input mutated",
    "view_base_mutate": "base mutated, alias returned",
}

# Run statuses, from best to worst for the "not worse than torch.func" rule: an error is loud,
# an escaped mutation or view is silent but structural, a wrong number is silent and wrong.
SEVERITY = {
    "passed": 0,
    "error": 1,
    "trace_error": 1,
    "timeout": 1,
    "crash": 1,
    "state_leak": 2,
    "graph_not_functional": 2,
    "view_in_graph": 2,
    "wrong_value": 3,
    "wrong_input_state": 3,
    "graph_wrong_value": 3,
}
WRONG_VALUE_STATUSES = frozenset({"wrong_value", "wrong_input_state", "graph_wrong_value"})

# Ops whose results are not defined by their inputs: nothing to compare.
UNINITIALIZED_OUTPUT = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)
# Ops whose results are not defined by their inputs when they grow the tensor.
RESIZE_OPS = frozenset({"resize_", "resize_as_"})


def uninitialized_reason(op, sample) -> Optional[str]:
    """Why this sample's result holds uninitialized memory, or None."""
    if op.name in UNINITIALIZED_OUTPUT:
        return "returns uninitialized memory"
    if op.name in RESIZE_OPS:
        inp, args, _ = sample.unpack(sample.tensors)
        target = args[0].numel() if isinstance(args[0], torch.Tensor) else math.prod(args[0])
        if target > inp.numel():
            return "grows the tensor: the new elements are uninitialized"
    return None

# Ops whose outputs share storage with an input without saying so in their schema: torch
# documents that mutating those outputs is undefined, so no alias placement applies.
UNDECLARED_ALIAS = {
    "unsafe_chunk": "outputs alias the input undeclared (schema has no alias annotation); "
                    "mutating them is documented as undefined",
    "unsafe_split": "outputs alias the input undeclared (schema has no alias annotation); "
                    "mutating them is documented as undefined",
}


# ---------------------------------------------------------------------------------------------
# Cases.


@dataclasses.dataclass
class Case:
    op_key: str
    placement: str
    dtype: str
    sample_index: int
    sample: Optional[Sample] = None
    program: Optional[Callable] = None
    na: Optional[str] = None  # not-applicable reason, decided before any implementation runs
    regression: bool = False  # one of REGRESSION_CASES (its id names the sample)

    @property
    def id(self) -> str:
        return f"{self.op_key}-{self.placement}-{self.dtype}-s{self.sample_index}"


def applicable_placements(op, sample: Sample, pr: Probe) -> dict:
    """placement -> None (applies) or a not-applicable reason, for the placements that exist."""
    result = {"plain": None}
    if op.inplace_variant is not None and sample.input_is_tensor:
        reason = "sample broadcasts the input (OpInfo)" if sample.broadcasts_input else None
        for p in ("inplace_intermediate", "inplace_input", "inplace_view"):
            result[p] = reason
    if op.supports_out:
        if pr.error is not None:
            reason = f"eager plain op raises: {pr.error}"
        elif pr.out_meta is None:
            reason = "the op's outputs are not all strided tensors"
        else:
            reason = None
        result["out"] = result["out_resized"] = reason
    if pr.alias is not None:
        for p in ("view_mutate", "view_input_mutate", "view_base_mutate"):
            result[p] = UNDECLARED_ALIAS.get(op.name)
    return result


def cases_for_op(key: str, max_samples: Optional[int] = None, dtypes=None, placements=None):
    """Every Case of one op (all samples up to max_samples, each chosen dtype, each placement)."""
    op = all_ops()[key]
    for dtype in dtypes or dtypes_for(op):
        dname = dtype_name(dtype)
        try:
            samples = samples_for(key, dname, max_samples)
        except Exception as e:  # noqa: BLE001 - an OpInfo whose samples fail is recorded
            yield Case(key, "*", dname, -1, na=f"sample_inputs raises: {_first_line(e)}")
            continue
        for i, sample in enumerate(samples):
            pr = probe(op, sample)
            for placement, reason in applicable_placements(op, sample, pr).items():
                if placements is not None and placement not in placements:
                    continue
                yield _make_case(op, key, placement, dname, i, sample, pr, reason)


def _make_case(op, key, placement, dtype, index, sample, pr, reason) -> Case:
    case = Case(key, placement, dtype, index, sample)
    case.na = uninitialized_reason(op, sample) or reason
    if case.na is None:
        case.program = build_program(op, placement, sample, pr)
    return case


def build_case(key: str, placement: str, dtype: str, sample_index: int) -> Case:
    """The one Case with this id (used by pytest, which stores ids, not programs)."""
    op = all_ops()[key]
    sample = samples_for(key, dtype, sample_index + 1)[sample_index]
    pr = probe(op, sample)
    reason = applicable_placements(op, sample, pr).get(placement, "placement does not apply")
    return _make_case(op, key, placement, dtype, sample_index, sample, pr, reason)


# ---------------------------------------------------------------------------------------------
# Running.


@dataclasses.dataclass
class RunResult:
    status: str
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclasses.dataclass
class CaseResult:
    id: str
    op: str
    placement: str
    dtype: str
    sample: int
    description: str = ""
    na: Optional[str] = None
    runs: dict = dataclasses.field(default_factory=dict)  # "impl/remove" -> RunResult
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["runs"] = {k: dataclasses.asdict(v) for k, v in self.runs.items()}
        return d

    @staticmethod
    def from_dict(d) -> "CaseResult":
        d = dict(d)
        d["runs"] = {k: RunResult(**v) for k, v in d["runs"].items()}
        return CaseResult(**d)


def run_key(impl: str, remove: str) -> str:
    return f"{impl}/{remove}"


IMPLS = ("ours", "torch.func")


def impl_fn(impl: str):
    if impl == "ours":
        return reference.default_impl()
    if impl == "torch.func":
        return torch.func.functionalize
    raise ValueError(impl)


class CaseTimeout(BaseException):
    """Raised by the per-run alarm; a BaseException so that no `except Exception` swallows it."""


@contextlib.contextmanager
def deadline(seconds: Optional[float]):
    """Raises CaseTimeout in this thread after `seconds` (main thread only; otherwise no limit)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"exceeded the per-run limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _dispatch_state():
    """Thread-local dispatch state a run must leave as it found it."""
    return (
        str(torch._C._dispatch_tls_local_include_set()),
        str(torch._C._dispatch_tls_local_exclude_set()),
        torch._C._len_torch_function_stack(),
        torch._C._len_torch_dispatch_stack(),
    )


def compare_values(actual, expected, what: str, check_structure: bool = True) -> Optional[str]:
    """None if equal (tensors: dtype, shape, assert_close with equal_nan), else a description."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if check_structure and a_spec != e_spec:
        return f"{what}: structure {a_spec} != {e_spec}"
    if len(a_leaves) != len(e_leaves):
        return f"{what}: {len(a_leaves)} leaves != {len(e_leaves)}"
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        where = f"{what} {i}" if len(e_leaves) > 1 else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{where}: expected a tensor, got {type(a).__name__}"
            if a.dtype != e.dtype:
                return f"{where}: dtype {a.dtype} != {e.dtype}"
            if a.shape != e.shape:
                return f"{where}: shape {tuple(a.shape)} != {tuple(e.shape)}"
            try:
                torch.testing.assert_close(a.detach(), e.detach(), equal_nan=True)
            except AssertionError as err:
                return f"{where}: " + _first_line(err).split(": ", 1)[1]
        elif isinstance(e, float) and isinstance(a, float):
            if not (math.isclose(a, e, rel_tol=1e-6, abs_tol=1e-6)
                    or (math.isnan(a) and math.isnan(e)) or a == e):
                return f"{where}: {a!r} != {e!r}"
        elif a != e:
            return f"{where}: {a!r} != {e!r}"
    return None


def compare_inputs(actual, expected) -> Optional[str]:
    """Final input states: values as compare_values, plus strides (metadata mutations)."""
    for i, (a, e) in enumerate(zip(actual, expected)):
        msg = compare_values(a, e, f"input {i}")
        if msg:
            return msg
        if e.layout == torch.strided and a.stride() != e.stride():
            return f"input {i}: stride {a.stride()} != {e.stride()}"
    return None


def run_eager(program, sample: Sample):
    """(outputs, final inputs) of one seeded eager run."""
    inputs = _clone(sample.tensors)
    _seed()
    out = program(*inputs)
    return out, inputs


def run_impl(program, sample: Sample, impl: str, remove: str, expected,
             timeout: Optional[float] = DEFAULT_TIMEOUT_S) -> RunResult:
    """One implementation in one mode: direct call, make_fx graph check, graph replay."""
    expected_out, expected_inputs = expected
    functionalize = impl_fn(impl)
    before = _dispatch_state()
    try:
        with deadline(timeout), _quiet():
            result = _run_impl_checks(program, sample, functionalize, remove,
                                      expected_out, expected_inputs)
    except CaseTimeout as e:
        result = RunResult("timeout", str(e))
    after = _dispatch_state()
    if after != before and result.passed:
        result = RunResult("state_leak", f"dispatch state changed: {before} -> {after}")
    return result


def _run_impl_checks(program, sample, functionalize, remove, expected_out, expected_inputs):
    inputs = _clone(sample.tensors)
    _seed()
    try:
        out = functionalize(program, remove=remove)(*inputs)
    except Exception as e:  # noqa: BLE001 - any failure is a result
        return RunResult("error", _first_line(e))
    msg = compare_values(out, expected_out, "output")
    if msg:
        return RunResult("wrong_value", msg)
    msg = compare_inputs(inputs, expected_inputs)
    if msg:
        return RunResult("wrong_input_state", msg)

    inputs = _clone(sample.tensors)
    _seed()
    try:
        # Real-mode tracing may read values (item(), equal()): the graph is then specialized
        # to these inputs, which the replay below uses again.
        gm = make_fx(functionalize(program, remove=remove),
                     _error_on_data_dependent_ops=False)(*inputs)
    except Exception as e:  # noqa: BLE001
        return RunResult("trace_error", _first_line(e))
    try:
        reference.assert_functional_graph(gm, remove)
    except AssertionError as e:
        text = str(e).splitlines()[0]
        status = "view_in_graph" if text.startswith("view op") else "graph_not_functional"
        return RunResult(status, text)

    inputs = _clone(sample.tensors)
    _seed()
    try:
        replayed = gm(*inputs)
    except Exception as e:  # noqa: BLE001
        return RunResult("graph_wrong_value", "graph replay raises: " + _first_line(e))
    # make_fx graphs return plain tuples where the op returned a named tuple: leaves only.
    msg = compare_values(replayed, expected_out, "graph output", check_structure=False)
    msg = msg or compare_inputs(inputs, expected_inputs)
    if msg:
        return RunResult("graph_wrong_value", msg)
    return RunResult("passed")


def eager_reference(case: Case, timeout: Optional[float] = DEFAULT_TIMEOUT_S):
    """(expected, None) or (None, not-applicable reason): a seeded eager run, checked against a
    second one."""
    try:
        with deadline(timeout), _quiet():
            try:
                expected = run_eager(case.program, case.sample)
            except Exception as e:  # noqa: BLE001
                return None, f"eager raises: {_first_line(e)}"
            try:
                again = run_eager(case.program, case.sample)
            except Exception as e:  # noqa: BLE001
                return None, f"eager raises on a second run: {_first_line(e)}"
    except CaseTimeout as e:
        return None, f"eager times out: {e}"
    exact = functools.partial(torch.testing.assert_close, rtol=0, atol=0, equal_nan=True)
    try:
        exact(pytree.tree_leaves(again[0]), pytree.tree_leaves(expected[0]))
        exact(again[1], expected[1])
    except (AssertionError, TypeError, ValueError, RuntimeError):
        return None, "eager is not deterministic: two seeded eager runs differ"
    return expected, None


def run_case(case: Case, removes=REMOVE_MODES, impls=IMPLS,
             timeout: Optional[float] = DEFAULT_TIMEOUT_S, on_begin=None,
             forced: Optional[dict] = None) -> CaseResult:
    """Eager once, then every (impl, remove) run; `forced` holds results decided elsewhere
    (a run that crashed its process), `on_begin(run)` is called before each run."""
    forced = forced or {}
    started = time.perf_counter()
    result = CaseResult(case.id, case.op_key, case.placement, case.dtype, case.sample_index,
                        case.sample.description if case.sample else "", case.na)
    if case.na is not None:
        return result
    if "eager" in forced:
        result.na = f"eager crashes: {forced['eager'].message}"
        return result
    if on_begin:
        on_begin("eager")
    expected, reason = eager_reference(case, timeout)
    if reason is not None:
        result.na = reason
        return result
    for impl in impls:
        for remove in removes:
            key = run_key(impl, remove)
            if key in forced:
                result.runs[key] = forced[key]
                continue
            if on_begin:
                on_begin(key)
            result.runs[key] = run_impl(case.program, case.sample, impl, remove, expected,
                                        timeout)
    result.seconds = round(time.perf_counter() - started, 4)
    return result


def not_worse(ours: RunResult, ref: RunResult) -> bool:
    """Ours is acceptable next to torch.func: it passes, or fails no worse than torch.func does."""
    return ours.passed or SEVERITY[ours.status] <= SEVERITY[ref.status]


# ---------------------------------------------------------------------------------------------
# The fast subset: a fixed stratified selection of ops, first eager-comparable sample each.

# Ops of every kind op_db has (unary / binary ufuncs, reductions, indexing and scatter, linear
# algebra, nn.functional, factories, random ops, shape ops) and every view op family, chosen so
# that every placement has cases. Keep sorted by kind; add, never reorder silently.
SUBSET_OPS = (
    # unary and binary elementwise, with in-place and out= variants
    "abs", "neg", "exp", "sigmoid", "bitwise_not", "logical_not", "clamp", "nan_to_num",
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "remainder", "bitwise_and",
    "eq", "maximum", "where", "lerp", "addcmul", "float_power", "round.decimals_3",
    # reductions and scans
    "sum", "mean", "amax", "max.reduction_with_dim", "argmax", "std", "cumsum",
    "logsumexp", "sort", "topk", "unique",
    # indexing, scatter, fills
    "__getitem__", "index_select", "index_add", "index_copy", "index_fill", "index_put",
    "masked_fill", "masked_scatter", "masked_select", "scatter", "scatter_add",
    "scatter_reduce.sum", "gather", "take", "put", "fill", "zero_", "tril", "triu",
    "select_scatter", "slice_scatter", "diagonal_scatter", "as_strided_scatter",
    # linear algebra
    "mm", "addmm", "bmm", "matmul", "kron", "linalg.solve", "linalg.cholesky",
    # nn.functional and normalization
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.softplus",
    "nn.functional.hardtanh", "nn.functional.conv2d", "nn.functional.linear",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.pad.constant", "softmax",
    "nn.functional.max_pool1d",
    "native_batch_norm",
    # factories and conversions
    "zeros_like", "ones", "full", "arange", "new_zeros", "to", "float", "clone",
    # random ops (reseeded before each run)
    "bernoulli", "normal", "uniform", "nn.functional.dropout", "rand_like", "multinomial",
    # shape ops that copy
    "cat", "stack", "repeat", "flip", "roll", "constant_pad_nd",
    # view ops (every family; views of views through as_strided and unfold)
    "view", "view.dtype", "view_as", "reshape", "flatten", "unflatten", "squeeze",
    "unsqueeze", "t", "transpose", "permute", "movedim", "swapdims", "expand", "expand_as",
    "select", "narrow", "slice", "diagonal", "as_strided", "unfold", "split", "chunk",
    "unbind", "tensor_split", "split_with_sizes", "view_as_real", "view_as_complex",
    "real", "imag", "alias", "detach", "contiguous", "broadcast_to", "mT", "_neg_view",
    "atleast_2d", "ravel",
)


# Cases the full sweep found failing (or fixed), by id parts (op, placement, dtype, sample index
# in the op's full sample list): the subset runs them too, so CI keeps watching them.
REGRESSION_CASES = (
    ("nn.functional.max_pool1d", "plain", "float32", 1),
    ("nn.functional.ctc_loss", "plain", "float32", 1),
    ("kron", "out", "float32", 0),
    ("matmul", "out_resized", "float32", 10),
    ("linalg.matrix_power", "out_resized", "float32", 7),
    ("linalg.multi_dot", "out_resized", "float32", 2),
    ("unfold", "view_mutate", "float32", 0),
    ("resize_", "inplace_view", "float32", 0),
)


def subset_op_keys() -> list:
    """SUBSET_OPS, then the ops that only REGRESSION_CASES name."""
    return list(dict.fromkeys(SUBSET_OPS + tuple(c[0] for c in REGRESSION_CASES)))


def subset_cases_for_op(key: str, max_tries: int = 4):
    """The subset's cases of one op. For an op of SUBSET_OPS, per (dtype, placement): the first
    of the op's first `max_tries` samples whose case eager runs deterministically (when none
    does, the first case, with its not-applicable reason). Then the op's REGRESSION_CASES."""
    chosen = {}
    if key in SUBSET_OPS:
        for case in cases_for_op(key, max_samples=max_tries):
            slot = (case.dtype, case.placement)
            if slot in chosen and chosen[slot].na is None:
                continue
            if case.na is None:
                _, reason = eager_reference(case)
                if reason is not None:
                    case.na = reason
            if slot not in chosen or (chosen[slot].na is not None and case.na is None):
                chosen[slot] = case
    cases = list(chosen.values())
    ids = {c.id for c in cases}
    for op, placement, dtype, index in REGRESSION_CASES:
        if op == key:
            case = build_case(op, placement, dtype, index)
            if case.id not in ids:
                case.regression = True
                cases.append(case)
    return cases
