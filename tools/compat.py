"""Builds and tests torch-functionalize against several torch releases, each in its own virtual
environment, and writes the compatibility table (docs/reports/compat.md).

  python tools/compat.py --torch 2.13.0 2.14.1 [--envs /work/venvs/compat] [--out docs/reports/compat.md]

For each version: a virtual environment <envs>/torch-<version> is created once and reused (torch
wheels are several GB: keep --envs outside the repository), `pip install torch==<version>` plus
the package's test extra; a clean clone of this checkout's HEAD is built there with
`pip install --no-build-isolation -e .[test]` and tested with ctest and pytest. The table gives
the torch build (CPU or CUDA), the build result, the test counts and each failure's first line.

Not part of CI (about 10 minutes per version on 2 cores, more when torch must be downloaded); run
it when torch publishes a release or the build changes. pip on the development machine may carry a
global constraint capping torch (PIP_CONSTRAINT or `constraint` in /etc/xdg/pip/pip.conf): this
command points PIP_CONSTRAINT at an empty file (os.devnull) for its own installs, which overrides
the configured one (an empty PIP_CONSTRAINT does not: pip ignores empty variables), so that newer
releases can be tried, and says so in the table.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, cwd=None, env=None, log=None):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if log is not None:
        log.write(f"$ {' '.join(map(str, cmd))}\n{result.stdout}\n{result.stderr}\n")
    return result


def _env_for(venv: Path) -> dict:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["PIP_CONSTRAINT"] = os.devnull  # see the module docstring
    env.setdefault("MAX_JOBS", "2")
    env["TFZ_BUILD_TESTS"] = "1"
    return env


def check_version(version: str, envs: Path, log) -> dict:
    venv = envs / f"torch-{version}"
    py = venv / "bin" / "python"
    row = {"torch": version, "build": "", "ctest": "", "pytest": "", "failures": []}
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log=log)
    env = _env_for(venv)
    pip = _run([str(py), "-m", "pip", "install", "-q", f"torch=={version}", "setuptools>=77",
                "wheel"], env=env, log=log)
    if pip.returncode != 0:
        row["build"] = "torch not installable"
        row["failures"].append((pip.stderr.strip().splitlines() or ["?"])[-1])
        return row
    info = _run([str(py), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                env=env, log=log).stdout.split()
    row["torch"] = info[0] if info else version
    row["flavour"] = f"CUDA {info[1]}" if len(info) > 1 and info[1] != "None" else "CPU"
    with tempfile.TemporaryDirectory(prefix=f"tfz-compat-{version}-") as tmp:
        clone = Path(tmp) / "src"
        _run(["git", "clone", "-q", str(ROOT), str(clone)], log=log)
        row["commit"] = _run(["git", "rev-parse", "--short", "HEAD"], cwd=clone).stdout.strip()
        build = _run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", "-e",
                      ".[test]"], cwd=clone, env=env, log=log)
        if build.returncode != 0:
            errors = [line for line in (build.stdout + build.stderr).splitlines()
                      if "error:" in line]
            row["build"] = "FAILED"
            row["failures"] += errors[:3] or ["see the log"]
            return row
        row["build"] = "ok"
        ctest = _run(["ctest", "--test-dir", "build/python"], cwd=clone, env=env, log=log)
        m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", ctest.stdout)
        row["ctest"] = f"{int(m.group(3)) - int(m.group(2))}/{m.group(3)}" if m else "?"
        pytest = _run([str(py), "-m", "pytest", "test/python", "-q", "-p", "no:cacheprovider",
                       "-rfE"], cwd=clone, env=env, log=log)
        summary = (pytest.stdout.strip().splitlines() or ["?"])[-1]
        row["pytest"] = summary.strip("= ").split(" in ")[0]
        for line in pytest.stdout.splitlines():
            if line.startswith(("FAILED ", "ERROR ")):
                row["failures"].append(line[:160])
    return row


def read_rows(out: Path) -> list:
    """The rows of an existing table (for --update), as write_table's dicts."""
    rows = []
    if not out.exists():
        return rows
    for line in out.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 7 or not re.match(r"\d+\.\d+", cells[0]):
            continue
        rows.append({"torch": cells[0], "flavour": cells[1], "commit": cells[2].strip("`"),
                     "build": cells[3], "ctest": cells[4], "pytest": cells[5],
                     "failures": [] if cells[6] == "none" else cells[6].split("<br>")})
    return rows


def write_table(rows, out: Path, command: str):
    lines = [
        "# Compatibility",
        "",
        f"Generated by `{command}` on {datetime.date.today()} (2 CPU cores, no GPU: CUDA builds "
        "of torch run on the CPU, which is what most users of the PyPI wheels have). Each torch "
        "is installed in its own virtual environment (pip's configured constraint overridden by "
        "PIP_CONSTRAINT pointing at an empty file); a clean clone of the commit in the row is "
        "built with `pip install --no-build-isolation -e .[test]` and tested with ctest and "
        "pytest. With `--update`, rows of versions not run this time are kept from the previous "
        "table, with their own commit.",
        "",
        "| torch | build of torch | commit | our build | ctest | pytest | failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        failures = "<br>".join(f.replace("|", "\\|") for f in r["failures"][:10]) or "none"
        if len(r["failures"]) > 10:
            failures += f"<br>... {len(r['failures']) - 10} more"
        lines.append(f"| {r['torch']} | {r.get('flavour', '?')} | `{r.get('commit', '?')}` | "
                     f"{r['build']} | {r['ctest']} | {r['pytest']} | {failures} |")
    out.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", nargs="+", default=["2.13.0", "2.14.1"])
    parser.add_argument("--envs", type=Path, default=Path("/work/venvs/compat"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reports" / "compat.md")
    parser.add_argument("--update", action="store_true",
                        help="keep the rows of other versions from the existing --out table")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "tfz-compat.log")
    args = parser.parse_args(argv)
    args.envs.mkdir(parents=True, exist_ok=True)
    kept = read_rows(args.out) if args.update else []
    rows = []
    with open(args.log, "w") as log:
        for version in args.torch:
            print(f"torch {version} ...", flush=True)
            row = check_version(version, args.envs, log)
            print(f"  {row}", flush=True)
            rows.append(row)
            # After each version, so an interrupted run keeps the rows it has.
            run = {r["torch"].split("+")[0] for r in rows} | set(args.torch)
            table = [r for r in kept if r["torch"].split("+")[0] not in run] + rows
            table.sort(key=lambda r: [int(p) for p in re.findall(r"\d+", r["torch"])[:3]])
            write_table(table, args.out, "python tools/compat.py --torch " + " ".join(args.torch)
                        + (" --update" if args.update else ""))
    print(f"wrote {args.out} (log: {args.log})")
    return 0 if all(r["build"] == "ok" and "failed" not in r["pytest"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
