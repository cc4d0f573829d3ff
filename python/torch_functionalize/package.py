"""`python -m torch_functionalize.package GRAPH OUT.pt2`: a graph a C++ program saved with
tfz::save -> an ExportedProgram (torch_functionalize.export) -> an AOTInductor package that C++
loads with torch::inductor::AOTIModelPackageLoader (examples/cpp/aoti_*.cpp, docs/export.md).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch


def package(graph_path: str, out_path: str, remove: str = "mutations") -> str:
    """Compiles the graph at graph_path into the AOTInductor package out_path; returns its path.
    The package is specialized to the shapes the graph was captured with."""
    from .capture import example_inputs, load_graph
    from .export import export

    gm = load_graph(graph_path)
    inputs = example_inputs(gm)
    if any(t is None for t in inputs):
        raise ValueError(f"{graph_path}: a graph with undefined inputs cannot be packaged")
    ep = export(gm, tuple(t.detach() for t in inputs), remove=remove)  # type: ignore[union-attr]
    return torch._inductor.aoti_compile_and_package(ep, package_path=out_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_functionalize.package",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("graph", help="a file written by tfz::save")
    parser.add_argument("out", help="the AOTInductor package to write (.pt2)")
    parser.add_argument("--remove", default="mutations",
                        choices=["mutations", "mutations_and_views"])
    args = parser.parse_args(argv)
    print(package(args.graph, args.out, args.remove))
    return 0


if __name__ == "__main__":
    sys.exit(main())
