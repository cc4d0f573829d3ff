"""The OpInfo differential sweep, under the name issue #10 gives it; the command is
tools/opinfo_sweep.py (same arguments), e.g. `python test/python/opinfo_sweep.py --device cuda`."""

import os
import runpy
import sys

if __name__ == "__main__":
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                        "opinfo_sweep.py")
    sys.argv[0] = os.path.normpath(tool)
    runpy.run_path(sys.argv[0], run_name="__main__")
