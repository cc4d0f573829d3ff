#!/usr/bin/env bash
# Runs every test: the GoogleTest suites (C++ API, through ctest) and the pytest suite.
# Expects .ci/setup.sh to have run. Longer sweeps are not part of this run.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build/python --output-on-failure
python3 -m pytest test/python -q -p no:cacheprovider
