"""The differential fuzzer's library (tools/fuzz.py is its command line).

program.py    the program model (make_inputs + f as source text) and the helpers writing its code
generator.py  random programs from a seed, built on live eager tensors (the OPS table)
view_ops.py, write_ops.py, value_ops.py   the op generators the generator draws from
check.py      one program through eager and every functionalize path, compared; shrinking;
              run_one (one seed) and failures_of_ours (a range of seeds, in this process)
"""
from .check import failures_of_ours, run_one
from .generator import generate
from .program import Program, compile_program

__all__ = ["Program", "compile_program", "failures_of_ours", "generate", "run_one"]
