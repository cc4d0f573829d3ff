"""The build: the extension records the torch it was built against and refuses another torch
release at import with a clear ImportError (Note [Build: torch version skew]); the core library
links only torch, torch_cpu and c10 (Note [Build: link only what we use]) and the shared libstdc++
(Note [Build: one libstdc++ in the process])."""

import subprocess
from pathlib import Path

import pytest
import torch

import torch_functionalize
from torch_functionalize import _compat


def test_version_skew_raises_import_error_naming_both_versions_and_the_fix():
    with pytest.raises(ImportError) as info:
        _compat.check_torch_version("2.11.0+cu130", "2.13.0+cpu")
    message = str(info.value)
    assert "2.11.0+cu130" in message and "2.13.0+cpu" in message
    assert "pip install --no-build-isolation" in message


def test_cpu_and_cuda_builds_of_one_release_are_compatible():
    _compat.check_torch_version("2.13.0+cu130", "2.13.0+cpu")  # no error


def test_installed_extension_recorded_the_running_torch():
    from torch_functionalize._build_info import TORCH_VERSION

    assert TORCH_VERSION == torch.__version__


def test_core_library_links_only_torch_cpu_and_c10():
    lib = Path(torch_functionalize.__file__).with_name("libtfz_core.so")
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    torch_libs = {line.split("[")[1].rstrip("]") for line in needed.splitlines()
                  if "NEEDED" in line and ("torch" in line or "c10" in line or "cuda" in line
                                           or "nvrtc" in line)}
    assert torch_libs <= {"libtorch.so", "libtorch_cpu.so", "libc10.so"}, torch_libs


# libstdc++'s own symbols (mangled): a library that defines them carries a copy of libstdc++.
_LIBSTDCXX_SYMBOLS = ("_ZNSt6locale7classicEv", "_ZNSt8ios_base4InitC1Ev", "_ZNSt11logic_errorD1Ev")


@pytest.mark.parametrize("name", ["libtfz_core.so", "_C"])
def test_libraries_use_the_shared_libstdcxx(name):
    # See Note [Build: one libstdc++ in the process]: a static copy crashed the first call.
    folder = Path(torch_functionalize.__file__).parent
    lib = next(p for p in folder.iterdir() if p.name == name or
               (p.name.startswith(name + ".") and p.suffix == ".so"))
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    assert "[libstdc++.so.6]" in needed, f"{lib.name} does not load the shared libstdc++:\n{needed}"
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True,
                             text=True, check=True).stdout
    defined = {line.split()[-1] for line in symbols.splitlines()
               if len(line.split()) >= 8 and line.split()[6] != "UND"}
    assert not defined & set(_LIBSTDCXX_SYMBOLS), f"{lib.name} defines libstdc++ symbols"


def test_importing_under_another_torch_release_fails_cleanly(tmp_path):
    # A copy of the installed package whose record says another release: importing it must raise
    # our ImportError before the loader reaches _C.
    import shutil
    import sys

    package = Path(torch_functionalize.__file__).parent
    copy = tmp_path / "torch_functionalize"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # "Another release": one that is not the running torch (under torch 2.11 itself, 2.13).
    other = "2.13.0+cpu" if torch.__version__.startswith("2.11.") else "2.11.0+cu130"
    (copy / "_build_info.py").write_text(f'TORCH_VERSION = "{other}"\n')
    result = subprocess.run([sys.executable, "-c", "import torch_functionalize"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert f"ImportError: torch_functionalize was built against torch {other}" in result.stderr
    assert torch.__version__ in result.stderr
