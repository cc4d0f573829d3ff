"""Bad inputs given to functionalize, and what each gets (issue #12, item 5).

  python tools/bad_inputs.py        prints the table for docs/reliability.md

The cases and their check are in torch_functionalize.testing._internal.bad_inputs;
test/python/test_bad_inputs.py checks every case. Exit status 1 if a case does not behave as its
row states.
"""
import sys

from torch_functionalize.testing._internal.bad_inputs import CASES, check, table

if __name__ == "__main__":
    print(table())
    sys.exit(0 if all(check(c) is None for c in CASES) else 1)
