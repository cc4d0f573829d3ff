"""Text rendering for the `python -m torch_functionalize` demo: a function's source, and two FX
graphs side by side with mutations (M), views (V) and epilogue write-backs (E) marked.
"""
from __future__ import annotations

import inspect
import itertools
import textwrap
from typing import Any, Callable, Sequence

import torch

WIDTH = 120
_SEPARATOR = " | "
_COLUMN = (WIDTH - len(_SEPARATOR)) // 2
_MAX_SOURCE_LINES = 16


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def source(fn: Callable[..., Any]) -> str:
    """The function's source, indented, at most _MAX_SOURCE_LINES lines of at most WIDTH columns."""
    try:
        lines = textwrap.dedent(inspect.getsource(fn)).rstrip().splitlines()
    except (OSError, TypeError):
        return f"    <no source for {fn!r}>"
    if len(lines) > _MAX_SOURCE_LINES:
        lines = lines[: _MAX_SOURCE_LINES - 1] + [
            f"... ({len(lines) - _MAX_SOURCE_LINES + 1} more lines)"
        ]
    return "\n".join(truncate("    " + line, WIDTH) for line in lines)


def _is_mutable(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema is not None and schema.is_mutable


def _is_view(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def epilogue_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The trailing mutable ops that write into inputs (directly or via earlier epilogue ops)."""
    epilogue = set()
    for node in reversed(gm.graph.nodes):
        if not _is_mutable(node):
            continue
        written = node.args[0] if node.args else None
        if not isinstance(written, torch.fx.Node) or written.op not in ("placeholder", "get_attr"):
            break
        epilogue.add(node)
    return epilogue


def count_mutations(gm: torch.fx.GraphModule) -> int:
    return sum(_is_mutable(n) for n in gm.graph.nodes)


def count_views(gm: torch.fx.GraphModule) -> int:
    return sum(_is_view(n) for n in gm.graph.nodes)


def graph_lines(gm: torch.fx.GraphModule, with_epilogue: bool) -> list[str]:
    """One line per node, e.g. 'M %add_ = aten.add_.Tensor(%clone, 1)'."""
    epilogue = epilogue_nodes(gm) if with_epilogue else set()
    lines = []
    for node in gm.graph.nodes:
        mark = (
            "E"
            if node in epilogue
            else "M"
            if _is_mutable(node)
            else "V"
            if _is_view(node)
            else " "
        )
        lines.append(f"{mark} {_format_node(node)}")
    return lines


def _format_node(node: torch.fx.Node) -> str:
    if node.op == "placeholder":
        return f"%{node.name} = input"
    if node.op == "get_attr":
        return f"%{node.name} = self.{node.target}"
    if node.op == "output":
        return f"return {_format_arg(node.args[0])}"
    args = [_format_arg(a) for a in node.args]
    args += [f"{k}={_format_arg(v)}" for k, v in node.kwargs.items() if k not in ("pin_memory",)]
    return f"%{node.name} = {_format_target(node.target)}({', '.join(args)})"


def _format_target(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        name = str(target)
        return name[: -len(".default")] if name.endswith(".default") else name
    return getattr(target, "__name__", str(target))


def _format_arg(arg: Any) -> str:
    if isinstance(arg, torch.fx.Node):
        return f"%{arg.name}"
    if isinstance(arg, list):
        return "[" + ", ".join(_format_arg(a) for a in arg) + "]"
    if isinstance(arg, tuple):
        return "(" + ", ".join(_format_arg(a) for a in arg) + ("," if len(arg) == 1 else "") + ")"
    if isinstance(arg, torch.device):
        return repr(str(arg))
    if isinstance(arg, torch.dtype):
        return dtype_name(arg)
    return repr(arg)


def side_by_side(left: Sequence[str], right: Sequence[str]) -> str:
    header = ("before: make_fx(f)", "after: capture(f, remove)")
    rows = [header, ("-" * _COLUMN, "-" * _COLUMN)]
    rows += itertools.zip_longest(left, right, fillvalue="")
    return "\n".join(
        (truncate(a, _COLUMN).ljust(_COLUMN) + _SEPARATOR + truncate(b, _COLUMN)).rstrip()
        for a, b in rows
    )


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
