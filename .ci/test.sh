#!/usr/bin/env bash
# Runs every test: the GoogleTest suites (through ctest), the C++ consumer example built against
# the installed CMake package, and the pytest suite. Expects .ci/setup.sh to have run. Longer
# sweeps are not part of this run.
set -euo pipefail
cd "$(dirname "$0")/.."
# C++ formatting follows .clang-format (.ci/setup.sh installs clang-format).
clang-format --dry-run --Werror $(git ls-files '*.cpp' '*.h')
ctest --test-dir build/python --output-on-failure
# C++ users: install the CMake package, then build and run examples/cpp against it.
rm -rf build/install
cmake --install build/python --prefix build/install > /dev/null
cmake -S examples/cpp -B build/example -DCMAKE_PREFIX_PATH="$PWD/build/install" > /dev/null
cmake --build build/example > /dev/null
build/example/functionalize_example > /dev/null
echo "examples/cpp: built against the installed package, matches eager"
# A C++ model captured and saved, compiled by AOTInductor from Python, loaded and run from C++.
build/example/aoti_example save build/example/model.tfz > /dev/null
python3 -m torch_functionalize.package build/example/model.tfz build/example/model.pt2 > /dev/null
build/example/aoti_example run build/example/model.pt2 > /dev/null
echo "examples/cpp: C++ model -> saved graph -> AOTInductor package -> run from C++, matches eager"
# pytest exits 5 when it collects no test; with `set -e` that fails the run, as it must.
python3 -m pytest test/python -q -p no:cacheprovider
