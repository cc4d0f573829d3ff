"""Layout replays of the fuzzer's programs: make_fx(functionalize(f)) traced on a program's own
inputs and replayed on the same values laid out otherwise (contiguous clones; each input at
offset 3 of a larger buffer). A replay gives eager's outputs and input values on those inputs, or
raises our layout guard (Note [Inputs: storage coordinates under a tracer]). Driven by
tools/fuzz_layouts.py and test_fuzz.py.
"""
from __future__ import annotations

import collections

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_functionalize
from torch_functionalize.testing._internal.fuzz.check import values_equal
from torch_functionalize.testing._internal.fuzz.generator import generate
from torch_functionalize.testing._internal.fuzz.program import compile_program

MODES = ("mutations", "mutations_and_views")
GUARD = "make_fx graph depends on the layout of"


def contiguous(inputs):
    return [t.clone(memory_format=torch.contiguous_format) for t in inputs]


def at_offset_3(inputs):
    out = []
    for t in inputs:
        if t.numel() == 0 or any(s < 0 for s in t.stride()):
            out.append(t.clone())
            continue
        # The elements t spans, copied whole (t may overlap itself or have gaps), 3 further on.
        extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        buffer = torch.zeros(extent + 7, dtype=t.dtype)
        with torch.no_grad():
            buffer[3:3 + extent] = t.detach().as_strided((extent,), (1,), t.storage_offset())
        out.append(buffer.as_strided(t.shape, t.stride(), 3))
    return out


RELAYOUTS = {"contiguous": contiguous, "offset 3": at_offset_3}


def _same(actual, expected):
    # Relaid inputs may take other kernels (vectorized or not, another alignment) than the traced
    # ones: floating values within a rounding tolerance, everything else exact.
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return False
        a, e = actual.detach(), expected.detach()
        if a.dtype != e.dtype or a.shape != e.shape:
            return False
        if e.dtype.is_floating_point or e.dtype.is_complex:
            return torch.allclose(a, e, rtol=1e-5, atol=1e-6, equal_nan=True)
        return values_equal(a, e)
    return actual == expected


def _all_same(a, b):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _replay(fn, inputs, rng_seed):
    torch.manual_seed(rng_seed)
    out = fn(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_program(seed: int) -> list[tuple[str, str, str]]:
    """(mode, relayout, outcome) per replay of program `seed`; [("-", "-", why)] if skipped."""
    prog, _ = generate(seed)
    make_inputs, f = compile_program(prog)
    try:
        f(*make_inputs())
    except Exception:  # noqa: BLE001
        return [("-", "-", "invalid")]
    results = []
    for mode in MODES:
        try:
            graph = make_fx(torch_functionalize.functionalize(f, remove=mode))(*make_inputs())
        except Exception:  # noqa: BLE001  (tracing is tools/fuzz.py's to judge)
            results.append((mode, "-", "untraced"))
            continue
        for name, relayout in RELAYOUTS.items():
            results.append((mode, name, _judge(prog, make_inputs, f, graph, relayout)))
    return results


def _judge(prog, make_inputs, f, graph, relayout) -> str:
    base = make_inputs()
    e_in, e2_in, g_in = relayout(base), relayout(base), relayout(base)
    try:
        expected = _replay(f, e_in, prog.rng_seed)
        again = _replay(f, e2_in, prog.rng_seed)
    except Exception:  # noqa: BLE001
        return "eager error"
    if not (_all_same(again, expected) and _all_same(e2_in, e_in)):
        return "not deterministic"
    try:
        actual = _replay(graph, g_in, prog.rng_seed)
    except Exception as error:  # noqa: BLE001
        if GUARD in str(error):
            return "guarded"
        return "error: " + str(error).split("\n")[0][:200]
    if _all_same(actual, expected) and _all_same(g_in, e_in):
        return "ok"
    # A program that reads uninitialized memory (torch.empty, empty_strided, new_empty) may
    # repeat in eager by chance and not in the graph.
    if "empty" in prog.f_source():
        return "not deterministic"
    return "wrong"


def make_fx_own(seed: int, relayout_name: str) -> bool:
    """Whether plain make_fx(f) is wrong on the same relaid inputs (its own specialization)."""
    prog, _ = generate(seed)
    make_inputs, f = compile_program(prog)
    try:
        graph = make_fx(f)(*make_inputs())
        base = make_inputs()
        e_in, g_in = RELAYOUTS[relayout_name](base), RELAYOUTS[relayout_name](base)
        expected = _replay(f, e_in, prog.rng_seed)
        actual = _replay(graph, g_in, prog.rng_seed)
    except Exception:  # noqa: BLE001
        return True
    return not (_all_same(actual, expected) and _all_same(g_in, e_in))


Failure = tuple[int, str, str, str]  # (seed, mode, relayout, outcome)


def sweep(first_seed: int, count: int) -> tuple[collections.Counter, list[Failure]]:
    """Outcome counts over programs first_seed.. first_seed+count-1, and the failures of ours as
    (seed, mode, relayout, outcome). A wrong value or error that plain make_fx(f) shows on the same
    relaid inputs is make_fx's own specialization, counted as such."""
    counts: collections.Counter = collections.Counter()
    failures: list[Failure] = []
    for seed in range(first_seed, first_seed + count):
        for mode, relayout, outcome in run_program(seed):
            if outcome == "wrong" or outcome.startswith("error"):
                if make_fx_own(seed, relayout):
                    outcome = "make_fx's own"
                else:
                    failures.append((seed, mode, relayout, outcome))
                    outcome = "failed"
            counts[outcome] += 1
    return counts, failures
