"""The harness shared by test/python, tools/ and benchmarks/: not public API; it changes with them.

reference.py          assert_matches_eager and the graph checks every behaviour test uses
opinfo_programs.py    OpInfo ops, dtypes and samples, and the small programs that place an op
opinfo_cases.py       the OpInfo cases, their runner and the fast subset (test_opinfo.py,
                      tools/opinfo_sweep.py)
distributed_cases.py  collectives inside functionalize, run on gloo ranks (launch_ranks)
dtensor_cases.py      DTensor programs, run on gloo ranks
fuzz/                 the differential fuzzer's generator and checker (tools/fuzz.py)
hidden_writes.py      the search for undeclared writes (tools/hidden_writes.py)
bad_inputs.py         bad inputs and what each gets (tools/bad_inputs.py)
stress.py             soak and thread stress (tools/stress.py)
workloads.py          the benchmark programs and their inputs (benchmarks/run.py)

Modules here import nothing from test/, tools/ or benchmarks/, and this file imports none of them
(the distributed and DTensor cases run as ``python -m`` modules).
"""
