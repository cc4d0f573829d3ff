"""The demo command line `python -m torch_functionalize`: built-in programs, user files, errors.

The first tests run the real command in a subprocess; the rest call `cli.command.main` in-process to keep
the suite fast.
"""

import re
import subprocess
import sys
import textwrap

import pytest

from torch_functionalize.cli import command

PROGRAM_NAMES = (
    "clone_add",
    "view_of_mutated_intermediate",
    "input_mutated_through_view",
    "slice_mutation",
    "outstanding_aliases",
    "diagonal_add",
)

USER_PROGRAMS = textwrap.dedent(
    """
    import torch

    def step(x, y):
        x.add_(y.sum())
        return x * 2

    def noisy(x):
        return x + torch.rand_like(x)

    def helper():
        pass

    PROGRAMS = {"step": (step, [(3, 3), (4,)])}
    """
)


def run_demo(*args):
    """`python -m torch_functionalize ARGS` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "torch_functionalize", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_programs.py"
    path.write_text(USER_PROGRAMS)
    return path


def test_default_programs_all_pass():
    result = run_demo()
    assert result.returncode == 0, result.stdout + result.stderr
    for name in PROGRAM_NAMES:
        assert name in result.stdout
    assert result.stdout.count("PASS") == 6, result.stdout
    assert "FAIL" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 120


def test_user_function_with_shapes(user_file):
    result = run_demo(f"{user_file}:step", "--shapes", "3,3;4", "--dtype", "float64")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "inputs: x: float64[3, 3], y: float64[4]" in result.stdout
    assert "mutations removed: 1" in result.stdout
    assert result.stdout.count("PASS") == 1


def test_missing_file_exits_with_message(tmp_path):
    result = run_demo(f"{tmp_path / 'missing.py'}:f", "--shapes", "3")
    assert result.returncode != 0
    assert result.stderr.startswith("functionalize: no such file:"), result.stderr


def test_builtin_programs_without_source_tree(monkeypatch, capsys):
    # From an installed wheel there is no examples/programs.py: the package's copy is used.
    monkeypatch.setattr(command, "_default_programs_file", lambda: None)
    assert command.main(["--program", "diagonal_add"]) == 0
    assert capsys.readouterr().out.count("PASS") == 1


def test_remove_views_counts_views_removed(capsys):
    assert command.main(["--remove", "mutations_and_views", "--program", "outstanding_aliases"]) == 0
    out = capsys.readouterr().out
    # a[0], a[:, 0] and a.view(-1) are gone; select_copy/view_copy take their place.
    assert "views removed: 3 (3 traced, 0 left)" in out
    assert "mutations removed: 2 (2 traced, 0 left)" in out
    assert out.count("PASS") == 1


def test_input_mutation_shows_epilogue(capsys):
    assert command.main(["--program", "input_mutated_through_view"]) == 0
    out = capsys.readouterr().out
    assert "epilogue: 1 write-back(s) into inputs" in out
    assert "E %copy_ = aten.copy_(%x_1" in out


def test_user_file_runs_its_programs(user_file, capsys):
    # A file alone runs its PROGRAMS, with the shapes listed there.
    assert command.main([str(user_file)]) == 0
    out = capsys.readouterr().out
    assert "= step =" in out
    assert out.count("PASS") == 1


def test_function_shapes_default_to_programs_entry(user_file, capsys):
    assert command.main([f"{user_file}:step"]) == 0
    assert "y: float32[4]" in capsys.readouterr().out


def test_mismatch_exits_one(user_file, capsys):
    # Fresh random numbers on every run: the check against eager cannot pass.
    assert command.main([f"{user_file}:noisy", "--shapes", "3"]) == 1
    assert "equivalence with eager: FAIL" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["{file}:nope", "--shapes", "3"],
            "no function 'nope' in .*; functions there: step, noisy, helper",
        ),
        (["{file}:noisy"], "no input shapes for 'noisy'; pass --shapes"),
        (["{file}:step", "--shapes", "3,x"], "bad --shapes '3,x'"),
        (["{file}:step", "--dtype", "floaty"], "unknown --dtype 'floaty'"),
        (["--program", "nope"], "no program 'nope'; available: clone_add, "),
        (["{empty}"], "has no PROGRAMS dict"),
    ],
)
def test_bad_command_line_exits_two(args, message, user_file, tmp_path, capsys):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    argv = [a.format(file=user_file, empty=empty) for a in args]
    assert command.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("functionalize: ")
    assert re.search(message, err), err
