#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine for torch-functionalize: system packages, the CPU
# build of torch==2.13.0, test tools, and an editable build of the package together with its
# GoogleTest executables (build/python). Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pkg in cmake ninja-build g++ ccache libgtest-dev clang-format; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}"
fi

python3 -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || python3 -m pip install -q torch==2.13.0   # pinned: an unpinned torch pulls CUDA wheels
# Build tools first (--no-build-isolation builds with what is installed), then the package with
# its test extra: every test dependency is declared once, in pyproject.toml.
python3 -m pip install -q "setuptools>=77" wheel  # 77: PEP 639 license metadata
TFZ_BUILD_TESTS=1 python3 -m pip install -q --no-build-isolation -e ".[test]"
