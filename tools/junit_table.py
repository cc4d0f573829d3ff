"""Per-file results of a pytest run, as a markdown table, from its --junitxml report.

    python tools/junit_table.py pytest-cuda.xml [more.xml ...]

docs/cuda.md's per-file tables come from this (tools/gpu_check.sh writes the XML). A test counts
as failed for a <failure>, as an error for an <error>, as xfailed for a <skipped> whose type is
pytest.xfail, as skipped for any other <skipped>, and as passed otherwise.
"""

import collections
import sys
import xml.etree.ElementTree as ET

KINDS = ("passed", "failed", "error", "xfailed", "skipped")


def per_file(path):
    counts = collections.defaultdict(collections.Counter)
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        module = next((part for part in name if part.startswith("test_")), ".".join(name))
        kind = "passed"
        for child in case:
            if child.tag == "failure":
                kind = "failed"
            elif child.tag == "error":
                kind = "error"
            elif child.tag == "skipped":
                kind = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        counts[f"{module}.py"][kind] += 1
    return counts


def table(counts):
    lines = ["| file | " + " | ".join(KINDS) + " |", "|---|" + "---:|" * len(KINDS)]
    total = collections.Counter()
    for module in sorted(counts):
        total.update(counts[module])
        lines.append(f"| `{module}` | " + " | ".join(str(counts[module][k]) for k in KINDS) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k in KINDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(f"{path}:\n\n{table(per_file(path))}\n")
