"""Runs one fuzz program through eager and the functionalize paths and compares them (the
comparison rules are in tools/fuzz.py's header), shrinks a failing one, and runs a range of seeds
in this process (failures_of_ours, for test/python/test_fuzz.py). Shared by tools/fuzz.py and the
tests; no process management here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import traceback
import warnings

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize

from .generator import generate
from .program import Program, compile_program

# ours_* / fx_* / cap_* / tf_*: our functionalize called directly, our functionalize traced by
# make_fx and the graph replayed on fresh inputs, torch_functionalize.capture's graph replayed on
# fresh inputs, torch.func.functionalize called directly; rip_* / fxrip_*: capture's / make_fx's
# graph after torch_functionalize.reinplace, replayed on fresh inputs; cpprip_*: capture's C++
# graph after the C++ pass (tfz::reinplace), replayed on fresh inputs.
# dyn_*: torch.compile(f, backend=torch_functionalize.backend(remove=...)), on request
# (tools/fuzz.py --compile): dynamo's compile of each program costs about as much as all the
# other paths together.
OURS_PATHS = ("ours_mut", "ours_mav", "fx_mut", "fx_mav", "cap_mut", "cap_mav",
              "rip_mut", "rip_mav", "fxrip_mut", "cpprip_mut", "cpprip_mav")
COMPILE_PATHS = ("dyn_mut", "dyn_mav")
TF_PATHS = ("tf_mut", "tf_mav")
ALL_PATHS = OURS_PATHS + TF_PATHS
MODE = {"mut": "mutations", "mav": "mutations_and_views"}

# Kinds, worst first. Contract kinds are what torch.func's contract promises (values of outputs,
# values and metadata of inputs afterwards, and no error); the others are this engine's claims.
KINDS = ("crash", "hang", "error", "unsupported", "value", "input_meta", "alias", "output_meta")
CONTRACT = {"crash", "hang", "error", "unsupported", "value", "input_meta"}


def setup_process():
    """Process-wide settings every run uses: one thread (deterministic reductions), and
    deterministic fill of uninitialized memory (torch.empty, resize_ growth: NaN / max int), so a
    program that reads memory it never wrote gives the same values eagerly and functionalized."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    warnings.simplefilter("ignore")


@dataclasses.dataclass
class TSnap:
    dtype: torch.dtype
    shape: tuple
    stride: tuple
    offset: int
    values: torch.Tensor   # a copy (complex as view_as_real, conj/neg resolved)
    storage: int           # storage data pointer, 0 for an empty storage
    nbytes: int


def _plain(t):
    t = t.detach().resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.clone()


def snap(t):
    st = t.untyped_storage()
    return TSnap(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), _plain(t),
                 st.data_ptr() if st.nbytes() else 0, st.nbytes())


def storage_values(t, dtype):
    """The whole storage of t, reinterpreted as dtype (uint8 if the size does not divide)."""
    st = t.untyped_storage()
    size = torch.empty(0, dtype=dtype).element_size()
    if st.nbytes() % size:
        dtype, size = torch.uint8, 1
    whole = torch.empty(0, dtype=dtype).set_(st, 0, (st.nbytes() // size,), (1,))
    return _plain(whole)


@dataclasses.dataclass
class Outcome:
    """What one path did: the outputs and inputs afterwards, or the error it raised."""
    outputs: list | None = None
    inputs: list | None = None
    out_alias: list | None = None     # per output: frozenset of input indices sharing storage
    out_is: list | None = None        # per output: index of the input it is, or None
    in_groups: list | None = None     # per input: smallest input index sharing its storage
    storages: dict | None = None      # input group -> whole-storage values
    error: BaseException | None = None
    error_stmt: int | None = None
    error_tb: str = ""


def _record(outs, inputs):
    if not isinstance(outs, (tuple, list)):
        outs = (outs,)
    o = Outcome()
    o.outputs = [snap(t) if isinstance(t, torch.Tensor) else t for t in outs]
    o.inputs = [snap(t) for t in inputs]
    ptr = [s.storage for s in o.inputs]
    o.out_alias = [frozenset(j for j, p in enumerate(ptr) if p and isinstance(t, torch.Tensor)
                             and t.untyped_storage().nbytes()
                             and t.untyped_storage().data_ptr() == p) for t in outs]
    o.out_is = [next((j for j, x in enumerate(inputs) if x is t), None) for t in outs]
    o.in_groups = [next(k for k in range(len(ptr)) if (ptr[k] == ptr[j] and ptr[j]) or k == j)
                   for j in range(len(ptr))]
    # The storage of each group, read as its first floating input's dtype (so float values are
    # compared with a tolerance even when an integer view of the same bytes is an input too).
    o.storages = {}
    for g in sorted(set(o.in_groups)):
        members = [inputs[j] for j in range(len(inputs)) if o.in_groups[j] == g]
        fl = [m for m in members if m.dtype.is_floating_point or m.dtype.is_complex]
        o.storages[g] = storage_values(members[0], (fl or members)[0].dtype)
    return o


def error_stmt(prog, exc):
    """Index of the statement of f the exception came from (deepest '<fuzz>' frame of f)."""
    k = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<fuzz>" and frame.f_code.co_name == "f":
            k = prog.stmt_of_line(lineno)
    return k


def run_path(prog: Program, path: str, compiled=None) -> Outcome:
    """Runs prog eagerly (path "eager") or through one functionalize path on fresh inputs."""
    make_inputs, f = compiled or compile_program(prog)
    try:
        if path == "eager":
            inputs = make_inputs()
            outs = f(*inputs)
        elif path.startswith("ours_"):
            inputs = make_inputs()
            outs = torch_functionalize.functionalize(f, remove=MODE[path[5:]])(*inputs)
        elif path.startswith("tf_"):
            inputs = make_inputs()
            outs = torch.func.functionalize(f, remove=MODE[path[3:]])(*inputs)
        elif path.startswith("dyn_") or path == "dynamo_eager":
            backend = "eager" if path == "dynamo_eager" else \
                torch_functionalize.backend(remove=MODE[path[4:]])
            torch._dynamo.reset()  # every program is a fresh compile, whatever ran before
            inputs = make_inputs()
            outs = torch.compile(f, backend=backend)(*inputs)
        elif path.startswith(("fx_", "cap_", "rip_", "fxrip_", "cpprip_")):
            # rip_: capture's graph after reinplace; fxrip_: make_fx's graph after reinplace;
            # cpprip_: capture's C++ graph after the C++ pass.
            mode = MODE[path.split("_")[1]]
            if path.startswith(("fx_", "fxrip_")):
                gm = make_fx(torch_functionalize.functionalize(f, remove=mode))(*make_inputs())
            elif path.startswith("cpprip_"):
                from torch_functionalize.capture import _capture
                gm = _capture(f, tuple(make_inputs()), {}, mode, False,
                              graph_pass=lambda c: torch_functionalize._C._reinplace_graph(c)[0])
            else:
                gm = torch_functionalize.capture(f, *make_inputs(), remove=mode)
            if path.startswith(("rip_", "fxrip_")):
                gm = torch_functionalize.reinplace(gm)
            inputs = make_inputs()
            # f seeds the generator at its start; the graph does not, so its replay does.
            torch.manual_seed(prog.rng_seed)
            outs = gm(*inputs)
        else:
            raise ValueError(path)
        return _record(outs, inputs)
    except Exception as e:  # noqa: BLE001  (every error is a result here)
        return Outcome(error=e, error_stmt=error_stmt(prog, e),
                       error_tb="".join(traceback.format_exception(e))[-3000:])


# ---------------------------------------------------------------------------------------------
# Comparison

TOL = {torch.float64: (1e-9, 1e-9), torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2),
       torch.float16: (2e-3, 2e-3)}


# Integers read from the bytes of floats (x.view(torch.int64) of complex64 values) are compared
# as NaNs where the floats were: IEEE 754 leaves which NaN an operation returns (sign and payload)
# to the implementation, and eager's own kernels disagree (in place and out of place, vectorized
# and scalar loops; tests in test_fuzz.py). An integer may differ only where, read as a float
# format of its width or as pieces of a narrower one, every differing piece is a NaN in both.
_FLOATS_OF_WIDTH = {2: (torch.float16, torch.bfloat16), 4: (torch.float32, torch.float16,
                                                           torch.bfloat16),
                    8: (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
_INTS_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def differ_only_in_nan_bits(a, e) -> bool:
    width = a.element_size()
    if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype == torch.bool or \
            width not in _FLOATS_OF_WIDTH:
        return False
    # Fresh 1-D copies: a one-element tensor can keep another stride through flatten().
    a = torch.empty(a.numel(), dtype=a.dtype).copy_(a.reshape(-1))
    e = torch.empty(e.numel(), dtype=e.dtype).copy_(e.reshape(-1))
    differing = a != e
    explained = torch.zeros_like(differing)
    for fmt in _FLOATS_OF_WIDTH[width]:
        pieces = width // torch.empty(0, dtype=fmt).element_size()
        fa, fe = a.view(fmt).view(-1, pieces), e.view(fmt).view(-1, pieces)
        bits = _INTS_OF_WIDTH[fa.element_size()]
        same = fa.view(bits) == fe.view(bits)
        explained |= (same | (fa.isnan() & fe.isnan())).all(dim=1)
    return bool((explained | ~differing).all())


def values_equal(a, e):
    if a.dtype != e.dtype or a.shape != e.shape:
        return False
    if a.dtype.is_floating_point:
        rtol, atol = TOL.get(a.dtype, (1e-5, 1e-5))
        return bool(torch.allclose(a.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True))
    return bool(torch.equal(a, e)) or differ_only_in_nan_bits(a, e)


def strides_equal(a: TSnap, e: TSnap):
    """Strides of dims of size > 1 (others are meaningless); none for empty tensors."""
    if a.shape != e.shape or 0 in e.shape:
        return a.shape == e.shape
    return all(x == y for x, y, s in zip(a.stride, e.stride, e.shape) if s > 1)


@dataclasses.dataclass
class Diff:
    kind: str
    where: str
    detail: str


def _desc(s: TSnap):
    vals = s.values.flatten()[:8].tolist()
    return (f"{str(s.dtype)[6:]}{list(s.shape)} stride={s.stride} offset={s.offset} "
            f"values[:8]={[round(v, 4) if isinstance(v, float) else v for v in vals]}")


def compare(eager: Outcome, got: Outcome, path: str) -> list[Diff]:
    """Differences of got from eager under the rules of path (see tools/fuzz.py's header)."""
    diffs = []
    graph = path.startswith(("fx_", "cap_", "rip_", "fxrip_", "cpprip_"))
    ours = not path.startswith("tf_")
    keep_views = path.endswith("_mut")
    if len(got.outputs) != len(eager.outputs):
        return [Diff("value", "outputs", f"{len(got.outputs)} outputs, eager {len(eager.outputs)}")]
    for i, (a, e) in enumerate(zip(got.outputs, eager.outputs)):
        w = f"output {i}"
        if not isinstance(e, TSnap) or not isinstance(a, TSnap):
            if type(a) is not type(e):
                diffs.append(Diff("value", w, f"type {type(a).__name__}, eager {type(e).__name__}"))
            continue
        if a.dtype != e.dtype or a.shape != e.shape or not values_equal(a.values, e.values):
            diffs.append(Diff("value", w, f"got {_desc(a)}; eager {_desc(e)}"))
            continue
        if not graph and not strides_equal(a, e):
            diffs.append(Diff("output_meta", w, f"stride {a.stride}, eager {e.stride}"))
        if ours:
            extra = got.out_alias[i] - eager.out_alias[i]
            if extra:
                diffs.append(Diff("alias", w, f"shares storage with input(s) {sorted(extra)}; "
                                              f"eager's does not"))
            if keep_views and not graph:
                missing = eager.out_alias[i] - got.out_alias[i]
                if missing:
                    diffs.append(Diff("alias", w, f"does not share storage with input(s) "
                                                  f"{sorted(missing)}; eager's does"))
                elif eager.out_is[i] is not None and got.out_is[i] != eager.out_is[i]:
                    diffs.append(Diff("alias", w, f"is not input {eager.out_is[i]} itself"))
                elif eager.out_alias[i] and a.offset != e.offset:
                    diffs.append(Diff("output_meta", w, f"storage offset {a.offset}, eager "
                                                        f"{e.offset}"))
    for j, (a, e) in enumerate(zip(got.inputs, eager.inputs)):
        w = f"input {j}"
        if a.dtype != e.dtype or a.shape != e.shape or not values_equal(a.values, e.values):
            diffs.append(Diff("value", w, f"got {_desc(a)}; eager {_desc(e)}"))
            continue
        if not strides_equal(a, e) or a.offset != e.offset:
            diffs.append(Diff("input_meta", w, f"stride {a.stride} offset {a.offset}, eager "
                                               f"{e.stride} offset {e.offset}"))
        elif a.nbytes != e.nbytes:
            diffs.append(Diff("input_meta", w, f"storage of {a.nbytes} bytes, eager {e.nbytes}"))
    if got.in_groups != eager.in_groups:
        diffs.append(Diff("input_meta", "inputs", f"storage sharing {got.in_groups}, eager "
                                                  f"{eager.in_groups}"))
    else:
        for g, ev in eager.storages.items():
            av = got.storages[g]
            if not values_equal(av, ev):
                diffs.append(Diff("value", f"storage of input {g}",
                                  f"bytes outside the inputs' elements differ "
                                  f"(got {av.flatten()[:8].tolist()}, eager "
                                  f"{ev.flatten()[:8].tolist()})"))
    order = {k: n for n, k in enumerate(KINDS)}
    return sorted(diffs, key=lambda d: order[d.kind])


def is_named_error(e: BaseException) -> bool:
    """Our named errors: NotImplementedError/RuntimeError whose message starts 'functionalize:'."""
    return isinstance(e, (NotImplementedError, RuntimeError)) and \
        str(e).lstrip().startswith("functionalize:")


def error_kind(e):
    return "unsupported" if is_named_error(e) else "error"


def norm_message(msg: str) -> str:
    """An error message with numbers, shapes and names blurred (for grouping)."""
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    first = re.sub(r"\[[^\]]*\]", "[..]", first)
    first = re.sub(r"\([^)]*\)", "(..)", first)
    first = re.sub(r"\b\d+\b", "N", first)
    first = re.sub(r"0x[0-9a-f]+", "P", first)
    return first[:110]


@dataclasses.dataclass
class PathResult:
    status: str            # "ok" or a kind
    diffs: list = dataclasses.field(default_factory=list)
    message: str = ""
    stmt: int | None = None


# A make_fx path's error that plain make_fx(f), without functionalize, raises too (same type, same
# blurred first line): make_fx cannot trace or print the program at all (its FX code generator
# writes aten.random.from as a syntax error; data-dependent indexing reads a tracing tensor's
# value). Counted apart from ours; the check runs only where the make_fx path already failed.
MAKE_FX_ITSELF = "make_fx_itself"


def plain_make_fx_error(compiled) -> BaseException | None:
    make_inputs, f = compiled
    try:
        make_fx(f)(*make_inputs())
    except Exception as e:  # noqa: BLE001  (every error is a result here)
        return e
    return None


# A dyn_ path's failure that dynamo with its plain "eager" backend (no functionalization: the
# graphs run as captured) shows too, a contract difference from eager or an error: dynamo's own
# (it rewrites the program around graph breaks). Counted apart from ours.
DYNAMO_ITSELF = "dynamo_itself"


def _dynamo_fails_alone(prog: Program, eager: Outcome, compiled) -> bool:
    got = run_path(prog, "dynamo_eager", compiled)
    if got.error is not None:
        return True
    return any(d.kind in CONTRACT for d in compare(eager, got, "dyn_mut"))


def _backend_error(e: BaseException) -> BaseException:
    """The backend's own exception where dynamo wrapped it (BackendCompilerFailed)."""
    inner = getattr(e, "inner_exception", None)
    return inner if isinstance(inner, BaseException) else e


def judge(prog: Program, eager: Outcome, path: str, compiled=None) -> PathResult:
    compiled = compiled or compile_program(prog)
    got = run_path(prog, path, compiled)
    if got.error is not None and path.startswith("dyn_"):
        got.error = _backend_error(got.error)
    result = _judged(prog, eager, path, compiled, got)
    if path.startswith("dyn_") and result.status not in ("ok", "unsupported") and \
            _dynamo_fails_alone(prog, eager, compiled):
        return PathResult(DYNAMO_ITSELF, message=result.message, stmt=result.stmt)
    return result


def _judged(prog: Program, eager: Outcome, path: str, compiled, got: Outcome) -> PathResult:
    if got.error is not None:
        e = got.error
        message = f"{type(e).__name__}: {str(e)[:2000]}"
        if path.startswith(("fx_", "fxrip_")) and not is_named_error(e):
            plain = plain_make_fx_error(compiled)
            if type(plain) is type(e) and norm_message(str(plain)) == norm_message(str(e)):
                return PathResult(MAKE_FX_ITSELF, message=message, stmt=got.error_stmt)
        return PathResult(error_kind(e), message=message,
                          stmt=got.error_stmt, diffs=[Diff(error_kind(e), "call", got.error_tb)])
    diffs = compare(eager, got, path)
    if not diffs:
        return PathResult("ok")
    return PathResult(diffs[0].kind, diffs=diffs)


def defined_names(stmt_code: str):
    m = re.match(r"^\s*((?:v\d+\s*,\s*)*v\d+)\s*=[^=]", stmt_code)
    return [n.strip() for n in m.group(1).split(",")] if m else []


def prefix_program(prog: Program, k: int) -> Program:
    """Statements 0..k, returning every variable they define (and the inputs when none)."""
    stmts = prog.stmts[:k + 1]
    names = []
    for s in stmts:
        for n in defined_names(s.code):
            if n not in names:
                names.append(n)
    return prog.replace(stmts=stmts, returns=names or list(prog.params()))


def eager_outcome(prog: Program, compiled=None):
    """Eager's outcome, or (None, reason) when the program is not a valid test: eager raises, or
    two eager runs disagree (the program reads memory or random state it does not control)."""
    compiled = compiled or compile_program(prog)
    e1 = run_path(prog, "eager", compiled)
    if e1.error is not None:
        return None, "eager_error"
    e2 = run_path(prog, "eager", compiled)
    if e2.error is not None or compare(e1, e2, "ours_mut"):
        return None, "eager_nondeterministic"
    return e1, None


def first_divergence(prog: Program, path: str, kind: str) -> int | None:
    """Smallest k such that the prefix program of statements 0..k (returning all it defines)
    fails on path with the same kind: the statement after which the states first differ."""
    for k in range(len(prog.stmts)):
        p = prefix_program(prog, k)
        try:
            compiled = compile_program(p)
        except Exception:  # noqa: BLE001
            continue
        eager, _ = eager_outcome(p, compiled)
        if eager is None:
            continue
        if judge(p, eager, path, compiled).status == kind:
            return k
    return None


# Path statuses that are not failures of ours: named refusals, make_fx's and dynamo's own.
NOT_FAILURES = ("ok", "unsupported", MAKE_FX_ITSELF, DYNAMO_ITSELF)


def shrink(prog, path, kind):
    """A smaller program failing `path` with the same kind: the first failing prefix, then single
    statements dropped greedily while the failure stays."""
    k = first_divergence(prog, path, kind)
    if k is not None:
        prog = prefix_program(prog, k)

    def still_fails(p):
        try:
            compiled = compile_program(p)
            eager, _ = eager_outcome(p, compiled)
            return eager is not None and judge(p, eager, path, compiled).status == kind
        except Exception:  # noqa: BLE001 - a candidate that does not compile is not kept
            return False

    i = len(prog.stmts) - 2  # keep the last (failing) statement
    while i >= 0:
        candidate = prog.replace(stmts=prog.stmts[:i] + prog.stmts[i + 1:])
        names = {n for s in candidate.stmts for n in defined_names(s.code)}
        candidate = candidate.replace(
            returns=[r for r in candidate.returns if r in names or r in candidate.params()]
            or list(candidate.params()))
        if still_fails(candidate):
            prog = candidate
        i -= 1
    return prog


def run_one(seed: int, shrink_failures: bool = True, with_compile: bool = False) -> dict:
    """Runs program `seed` through every path (and the dyn_ paths with `with_compile`); a
    compact, picklable summary."""
    prog, _ = generate(seed)
    compiled = compile_program(prog)
    eager, reason = eager_outcome(prog, compiled)
    if eager is None:
        return {"seed": seed, "invalid": reason}
    result = {"seed": seed, "paths": {}, "messages": {}, "failures": []}
    for path in ALL_PATHS + (COMPILE_PATHS if with_compile else ()):
        r = judge(prog, eager, path, compiled)
        if r.status == "output_meta" and path.endswith("_mav"):
            # Without views, outputs are *_copy values: their strides are not eager's by design.
            r = PathResult("ok")
        result["paths"][path] = r.status
        if r.status == "unsupported":
            result["messages"][path] = norm_message(r.message.split(": ", 1)[-1])
        if r.status not in NOT_FAILURES and path not in TF_PATHS:
            small = shrink(prog, path, r.status) if shrink_failures else prog
            detail = r.message or (r.diffs[0].where + ": " + r.diffs[0].detail if r.diffs else "")
            result["failures"].append({"path": path, "kind": r.status, "detail": detail[:500],
                                       "program": small.to_json()})
    return result


@contextlib.contextmanager
def _settings_of_a_run():
    """setup_process() for the block; the caller's process settings (a test session) after."""
    saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    with warnings.catch_warnings():
        setup_process()
        try:
            yield
        finally:
            torch.set_num_threads(saved[0])
            torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
            torch.utils.deterministic.fill_uninitialized_memory = saved[3]


def path_statuses(first_seed: int, count: int,
                  with_compile: bool = False) -> list[tuple[int, str, str]]:
    """(seed, path, status) of every path of programs first_seed.. (in this process, no
    shrinking; the dyn_ paths too with `with_compile`)."""
    found = []
    with _settings_of_a_run():
        for seed in range(first_seed, first_seed + count):
            r = run_one(seed, shrink_failures=False, with_compile=with_compile)
            found.extend((seed, path, status) for path, status in r.get("paths", {}).items())
    return found


def failures_of_ours(first_seed: int, count: int,
                     with_compile: bool = False) -> list[tuple[int, str, str]]:
    """(seed, path, kind) of every failure of ours on programs first_seed.. (see path_statuses):
    what test_fuzz.py compares with the known list."""
    return [(seed, path, status) for seed, path, status in
            path_statuses(first_seed, count, with_compile)
            if path not in TF_PATHS and status not in NOT_FAILURES]
