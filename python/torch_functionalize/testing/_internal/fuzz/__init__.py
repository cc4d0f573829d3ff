"""The differential fuzzer's library (tools/fuzz.py is its command line).

program.py    the program model (make_inputs + f as source text) and the helpers writing its code
generator.py  random programs from a seed, built on live eager tensors (the OPS table)
view_ops.py, write_ops.py, value_ops.py   the op generators the generator draws from
check.py      one program through eager and every functionalize path, compared; shrinking;
              run_one (one seed); path_statuses and failures_of_ours (a range of seeds, in this
              process); COMPILE_PATHS (the torch.compile paths, on request)
"""
from .check import COMPILE_PATHS, NOT_FAILURES, failures_of_ours, path_statuses, run_one
from .generator import generate
from .program import Program, compile_program

__all__ = ["COMPILE_PATHS", "NOT_FAILURES", "Program", "compile_program", "failures_of_ours",
           "generate", "path_statuses", "run_one"]
