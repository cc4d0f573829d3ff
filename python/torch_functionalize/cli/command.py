"""The `python -m torch_functionalize` demo: show what functionalization does to small programs.

For each program it prints the source, the make_fx graph before and after side by side, how many
mutations (and views) were removed, and an equivalence check against eager on random inputs.
This module owns the command line and the run of one program; rendering is in render.py, the
built-in programs in programs.py, the check against eager in torch_functionalize.testing.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ..api import Remove, functionalize
from ..capture import capture
from ..testing import check_against_eager, clone_inputs
from .render import (
    WIDTH,
    count_mutations,
    count_views,
    dtype_name,
    epilogue_nodes,
    graph_lines,
    side_by_side,
    source,
    truncate,
)

_REMOVE_OPTIONS = typing.get_args(Remove)
Shape = tuple[int, ...]
# Seeds of the random inputs: one set to trace on, a different one to check the traced graph.
_TRACE_SEED, _CHECK_SEED = 0, 1

_DESCRIPTION = """\
Trace programs with make_fx, capture them functionalized, show both graphs side by side,
count the mutations (and views) removed, and check the result against eager on random inputs."""

_EPILOG = """\
programs files:
  A programs file is a Python file with a dict PROGRAMS = {name: (function, shapes)}, where
  shapes lists one input shape per positional argument, e.g. [(3, 3), (4,)]. The default is
  examples/programs.py of the source tree (or the copy inside the package when installed).

examples:
  python -m torch_functionalize
  python -m torch_functionalize --remove mutations_and_views --program slice_mutation
  python -m torch_functionalize my_programs.py
  python -m torch_functionalize my_programs.py:step --shapes "3,3;4" --dtype float64

exit status: 0 when every equivalence check passes, 1 when one fails, 2 for usage errors.
"""


class _UsageError(Exception):
    """A bad command line: missing file, function or shapes."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo command line and return its exit status."""
    opts = _parser().parse_args(argv)
    try:
        dtype = _parse_dtype(opts.dtype)
        shapes = _parse_shapes(opts.shapes) if opts.shapes is not None else None
        programs = _select_programs(opts.target, opts.program, shapes)
    except _UsageError as error:
        print(f"functionalize: {error}", file=sys.stderr)
        return 2

    print(f"functionalize demo, remove={opts.remove!r}")
    print("graphs: before = make_fx(f), after = capture(f, remove) (recorded by the engine)")
    print("marks: M = mutation, V = view, E = epilogue (write-back into an input)")
    print("equivalence: outputs and final input values against eager f, on fresh random inputs")
    passed = [
        _demo_program(name, fn, sizes, dtype, opts.remove) for name, (fn, sizes) in programs.items()
    ]
    print(f"\n{sum(passed)}/{len(passed)} programs match eager")
    return 0 if all(passed) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_functionalize",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target",
        nargs="?",
        help="FILE.py (every program in its PROGRAMS dict) or FILE.py:FUNCTION (one function; "
        "its shapes come from --shapes or the file's PROGRAMS). Default: the built-in programs.",
    )
    parser.add_argument(
        "--remove",
        choices=_REMOVE_OPTIONS,
        default="mutations",
        help="what functionalize removes (default: mutations)",
    )
    parser.add_argument(
        "--program", metavar="NAME", help="run only the program NAME of the programs file"
    )
    parser.add_argument(
        "--shapes",
        metavar="SHAPES",
        help='input shapes, one per positional argument, separated by ";", e.g. "3,3;4"; '
        '"" or "()" is a 0-d tensor. Overrides the shapes of the programs file.',
    )
    parser.add_argument(
        "--dtype", default="float32", help="dtype of the random inputs (default: float32)"
    )
    return parser


# --- choosing the programs ---------------------------------------------------------------------


def _select_programs(
    target: str | None, program: str | None, shapes: list[Shape] | None
) -> dict[str, tuple[Callable[..., Any], list[Shape]]]:
    """The {name: (function, shapes)} to run, as chosen on the command line."""
    programs: dict[str, Any]
    if target is None:
        path = _default_programs_file()
        if path is None:
            from .programs import PROGRAMS

            programs = PROGRAMS
        else:
            programs = _programs_of(_load_module(path), path)
    else:
        path, function = _split_target(target)
        module = _load_module(path)
        if function is None:
            programs = _programs_of(module, path)
        else:
            programs = {
                function: (_function_of(module, function, path), _shapes_of(module, function))
            }

    if program is not None:
        if program not in programs:
            raise _UsageError(f"no program {program!r}; available: {', '.join(programs)}")
        programs = {program: programs[program]}
    result = {}
    for name, entry in programs.items():
        fn, default_shapes = _unpack_entry(name, entry)
        chosen = shapes if shapes is not None else default_shapes
        if chosen is None:
            raise _UsageError(f'no input shapes for {name!r}; pass --shapes, e.g. --shapes "3,3;4"')
        result[name] = (fn, [tuple(s) for s in chosen])
    return result


def _default_programs_file() -> Path | None:
    """examples/programs.py of the source tree this package runs from, if there is one."""
    path = Path(__file__).resolve().parents[3] / "examples" / "programs.py"
    return path if path.is_file() else None


def _split_target(target: str) -> tuple[Path, str | None]:
    """FILE.py[:FUNCTION] -> (Path, FUNCTION or None)."""
    path: str = target
    function: str | None = None
    head, sep, tail = target.rpartition(":")
    if sep and head and tail.isidentifier() and not os.path.exists(target):
        path, function = head, tail
    if not Path(path).is_file():
        raise _UsageError(f"no such file: {path!r}")
    return Path(path), function


def _load_module(path: str | Path) -> ModuleType:
    """Import a Python file by path; its folder is importable while it loads."""
    path = Path(path).resolve()
    spec = importlib.util.spec_from_file_location(f"_tfz_programs_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise _UsageError(f"cannot import {str(path)!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise _UsageError(
            f"importing {str(path)!r} failed: {type(error).__name__}: {error}"
        ) from error
    finally:
        sys.path.remove(str(path.parent))
    return module


def _programs_of(module: ModuleType, path: Path) -> dict[str, Any]:
    """The non-empty PROGRAMS dict of a programs file."""
    programs = getattr(module, "PROGRAMS", None)
    if not isinstance(programs, dict) or not programs:
        raise _UsageError(
            f"{str(path)!r} has no PROGRAMS dict of name -> (function, shapes); "
            f"name one function instead: {path}:FUNCTION --shapes ..."
        )
    return programs


def _function_of(module: ModuleType, function: str, path: Path) -> Callable[..., Any]:
    """module.function, which must be callable."""
    fn = getattr(module, function, None)
    if not callable(fn):
        names = [
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
        ]
        raise _UsageError(
            f"no function {function!r} in {str(path)!r}; "
            f"functions there: {', '.join(names) or 'none'}"
        )
    return fn


def _shapes_of(module: ModuleType, function: str) -> Any:
    """The shapes the file's PROGRAMS gives `function`, if any."""
    programs = getattr(module, "PROGRAMS", None)
    entry = programs.get(function) if isinstance(programs, dict) else None
    return entry[1] if isinstance(entry, (tuple, list)) and len(entry) == 2 else None


def _unpack_entry(name: str, entry: Any) -> tuple[Callable[..., Any], Any]:
    """(function, shapes or None) from a PROGRAMS entry, checked."""
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and callable(entry[0])):
        raise _UsageError(f"PROGRAMS[{name!r}] must be (function, shapes); got {entry!r}")
    return entry[0], entry[1]


def _parse_shapes(text: str) -> list[Shape]:
    """'3,3;4' -> [(3, 3), (4,)]."""
    shapes = []
    for part in text.split(";"):
        part = part.strip().strip("()[] ")
        try:
            shape = tuple(int(d) for d in part.split(",") if d.strip()) if part else ()
        except ValueError:
            raise _UsageError(f'bad --shapes {text!r}; expected integers like "3,3;4"') from None
        if any(d < 0 for d in shape):
            raise _UsageError(f"bad --shapes {text!r}; sizes must be >= 0")
        shapes.append(shape)
    return shapes


def _parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise _UsageError(
            f"unknown --dtype {name!r}; expected a torch dtype name such as float32 or int64"
        )
    return dtype


# --- one program -------------------------------------------------------------------------------


def _functional_graph(
    fn: Callable[..., Any], trace_inputs: list[torch.Tensor], remove: Remove
) -> torch.fx.GraphModule:
    """capture(fn); make_fx(functionalize(fn)) where capture does not apply, said on stdout."""
    try:
        return capture(fn, *clone_inputs(trace_inputs), remove=remove)
    except NotImplementedError as error:
        print(f"(capture does not apply, traced with make_fx: {_first_line(error)})")
        return make_fx(functionalize(fn, remove=remove))(*clone_inputs(trace_inputs))


def _demo_program(
    name: str, fn: Callable[..., Any], shapes: list[Shape], dtype: torch.dtype, remove: Remove
) -> bool:
    """Print the demo of one program; return whether it matches eager."""
    print(f"\n{(' ' + name + ' ').center(WIDTH, '=')}")
    print(source(fn))
    names = _arg_names(fn, shapes)
    print(
        "inputs: " + ", ".join(f"{a}: {dtype_name(dtype)}{list(s)}" for a, s in zip(names, shapes))
    )
    trace_inputs = _random_inputs(shapes, dtype, _TRACE_SEED)
    try:
        before = make_fx(fn)(*clone_inputs(trace_inputs))
        after = _functional_graph(fn, trace_inputs, remove)
    except Exception as error:
        print(
            "equivalence with eager: FAIL "
            f"(tracing raised {type(error).__name__}: {_first_line(error)})"
        )
        return False

    print(
        side_by_side(
            graph_lines(before, with_epilogue=False), graph_lines(after, with_epilogue=True)
        )
    )
    before_mut, after_mut = count_mutations(before), count_mutations(after)
    epilogue = len(epilogue_nodes(after))
    left = after_mut - epilogue
    print(
        f"mutations removed: {before_mut - left} ({before_mut} traced, {left} left); "
        f"epilogue: {epilogue} write-back(s) into inputs"
    )
    if remove == "mutations_and_views":
        before_views, after_views = count_views(before), count_views(after)
        print(
            f"views removed: {before_views - after_views} "
            f"({before_views} traced, {after_views} left)"
        )

    problem = _check_equivalence(fn, after, remove, _random_inputs(shapes, dtype, _CHECK_SEED))
    verdict = "PASS" if problem is None else f"FAIL ({problem})"
    print(f"equivalence with eager: {verdict}")
    return problem is None


def _arg_names(fn: Callable[..., Any], shapes: list[Shape]) -> list[str]:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        names = []
    return names[: len(shapes)] + [f"arg{i}" for i in range(len(names), len(shapes))]


def _random_inputs(shapes: list[Shape], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    # on torch.get_default_device(), where the inputs are made (torch.set_default_device)
    generator = torch.Generator(torch.get_default_device()).manual_seed(seed)
    inputs = []
    for shape in shapes:
        if dtype == torch.bool:
            inputs.append(torch.randint(0, 2, shape, generator=generator).bool())
        elif dtype.is_floating_point or dtype.is_complex:
            inputs.append(torch.randn(shape, generator=generator, dtype=dtype))
        else:
            inputs.append(torch.randint(-5, 6, shape, generator=generator).to(dtype))
    return inputs


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return truncate(text[0] if text else "", 80)


# --- equivalence -------------------------------------------------------------------------------


def _check_equivalence(
    fn: Callable[..., Any], after: torch.fx.GraphModule, remove: Remove, inputs: list[torch.Tensor]
) -> str | None:
    """None if the traced graph and functionalize(fn) match eager fn on `inputs`; else why not."""
    candidates = (("traced graph", after), ("functionalize(f)", functionalize(fn, remove=remove)))
    return check_against_eager(fn, inputs, candidates)
