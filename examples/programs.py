"""The default programs file of `python -m torch_functionalize`, and the template for your own.

A programs file defines PROGRAMS = {name: (function, input shapes)}, one shape per positional
argument. The six programs here are the demo's built-in ones; they are defined in the package
(torch_functionalize/cli/programs.py) so the demo also runs from an installed wheel.
"""

from torch_functionalize.cli.programs import (  # noqa: F401  (re-exported for `FILE.py:FUNCTION`)
    PROGRAMS as _BUILTIN_PROGRAMS,
    clone_add,
    diagonal_add,
    input_mutated_through_view,
    outstanding_aliases,
    slice_mutation,
    view_of_mutated_intermediate,
)

PROGRAMS = dict(_BUILTIN_PROGRAMS)

# To try a program of your own, add it here or to a file of your own and pass that file:
#
#     def scale_rows(x, s):
#         x.mul_(s.unsqueeze(1))
#         return x.sum()
#
#     PROGRAMS["scale_rows"] = (scale_rows, [(3, 4), (3,)])
