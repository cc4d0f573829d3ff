#!/usr/bin/env bash
# The CUDA checks of docs/cuda.md as one command, for a machine with an NVIDIA GPU and a CUDA build
# of torch: build with all cores (CMake directly, no pip), then, side by side, the suite on CUDA
# tensors, the suite on CPU tensors with ctest, the OpInfo sweep and the hidden-write search on
# CUDA, and last, alone on the machine, the CUDA benchmarks. Logs and reports land in OUT_DIR.
#
# Usage: bash tools/gpu_check.sh OUT_DIR
# Environment: PYTHON (default python3); GTEST_SRC, a GoogleTest source tree to build first where
# GoogleTest is not installed (Debian's /usr/src/googletest); TFZ_GPU_BUDGET, seconds for the
# side-by-side checks (default 360), and TFZ_GPU_BENCH_BUDGET for the benchmarks (default 100):
# with a 90 s build that fits one 10-minute call of a lent GPU machine. TFZ_GPU_SKIP, step names
# to leave out (e.g. "hidden-writes-cuda", whose result depends on torch alone, not on our code);
# TFZ_GPU_BENCH_ARGS, the workload selection of benchmarks/run.py (default: 8 quick workloads);
# TFZ_GPU_CUDA_WORKERS, pytest-xdist processes for the suite on CUDA tensors (default 10);
# TFZ_GPU_REINPLACE_BUDGET and TFZ_GPU_REINPLACE_ARGS, the same for benchmarks/reinplace.py (150 s).
# Each step runs under `timeout`; a step cut short says so in summary.txt instead of stopping the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/gpu_check.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
cores=$(nproc)
budget=${TFZ_GPU_BUDGET:-360}
bench_budget=${TFZ_GPU_BENCH_BUDGET:-100}
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

note "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); $cores cores"
note "$("$py" -c 'import torch, sys; print(f"torch {torch.__version__}, cuda {torch.version.cuda}, Python {sys.version.split()[0]}, cuda available {torch.cuda.is_available()}")')"
note "compiler: $(c++ --version | head -1); cmake $(cmake --version | head -1 | awk '{print $3}')"

prefix=""
if [ -n "${GTEST_SRC:-}" ]; then
  cmake -S "$GTEST_SRC" -B /tmp/tfz-gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX=/tmp/tfz-gtest -DBUILD_GMOCK=OFF >"$out/build.log" 2>&1 \
    && cmake --build /tmp/tfz-gtest-build -j "$cores" >>"$out/build.log" 2>&1 \
    && cmake --install /tmp/tfz-gtest-build >>"$out/build.log" 2>&1 \
    && prefix="-DCMAKE_PREFIX_PATH=/tmp/tfz-gtest"
fi
build=build/gpu
configure() {  # configure TESTS: the GoogleTest executables too (ON) or not (OFF)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTFZ_BUILD_TESTS="$1" \
    -DTFZ_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$(command -v "$py")" \
    -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/$build/lib" $prefix >>"$out/build.log" 2>&1
}
cpp_tests=ON
if ! configure ON; then
  note "build: GoogleTest not found (set GTEST_SRC); building without the C++ tests"
  cpp_tests=OFF
  rm -rf "$build"
  configure OFF
fi
# -k 0: a C++ test that does not compile against this torch (its headers differ between versions)
# costs the ctest step, not the run: the Python module is built regardless and the rest goes on.
if ! cmake --build "$build" -j "$cores" -- -k 0 >>"$out/build.log" 2>&1; then
  if ls "$build"/lib/_C*.so "$build"/lib/libtfz_core.so >/dev/null 2>&1; then
    note "build: the C++ tests did not build (build.log); going on without ctest"
    cpp_tests=OFF
  else
    note "build: FAILED after $(elapsed) s (build.log)"
    tail -30 "$out/build.log"
    exit 1
  fi
fi
cp "$build"/lib/*.so python/torch_functionalize/
# What setup.py writes beside the module: the torch it was built against (Note [Build: torch version skew])
"$py" -c 'import torch; print(f"TORCH_VERSION = {torch.__version__!r}")' >python/torch_functionalize/_build_info.py
# What pip install would add besides: the package's metadata with its entry points, through which
# torch.compile finds backend="tfz" (pyproject.toml, [project.entry-points.torch_dynamo_backends]).
meta=$(mktemp -d)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
mkdir -p "$meta/torch_functionalize-$version.dist-info"
printf 'Metadata-Version: 2.1\nName: torch-functionalize\nVersion: %s\n' "$version" \
  >"$meta/torch_functionalize-$version.dist-info/METADATA"
printf '[torch_dynamo_backends]\ntfz = torch_functionalize.dynamo:backend\n' \
  >"$meta/torch_functionalize-$version.dist-info/entry_points.txt"
export PYTHONPATH="$PWD/python:$meta${PYTHONPATH:+:$PYTHONPATH}"
note "build: ok in $(elapsed) s"

plugins() {  # pytest-xdist over N processes, and pytest-timeout, where they are installed
  "$py" -c "import xdist" 2>/dev/null && echo "-n $1"
  "$py" -c "import pytest_timeout" 2>/dev/null && echo "--timeout 240"
}
step() {  # step NAME COMMAND...: run under the budget, log to OUT/NAME.log, note the result
  local name=$1; shift
  case " ${TFZ_GPU_SKIP:-} " in *" $name "*) note "$name: skipped (TFZ_GPU_SKIP)"; return 0 ;; esac
  local t0; t0=$(date +%s)
  # SIGINT first: pytest then still prints its summary and writes its XML report
  timeout -s INT -k 30 "$budget" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local tail; tail=$(grep -E "passed|failed|error" "$out/$name.log" | tail -1)
  if [ -z "$tail" ]; then  # no summary line (cut short): count pytest's progress characters
    tail="progress: $(grep -E '^[.FxEsX]+ +\[ *[0-9]+%\]' "$out/$name.log" | sed 's/ *\[.*//' |
      tr -d '\n' | fold -w1 | sort | uniq -c | tr -s ' \n' ' ')"
  fi
  [ $rc -eq 124 ] && tail="CUT SHORT at the ${budget} s budget; $tail"
  note "$name: rc $rc in $(($(date +%s) - t0)) s: $tail"
}
step pytest-cuda env TFZ_TEST_DEVICE=cuda "$py" -m pytest test/python -q -p no:cacheprovider -rfEx \
  --junitxml="$out/pytest-cuda.xml" \
  $(plugins "${TFZ_GPU_CUDA_WORKERS:-10}") &
step pytest-cpu "$py" -m pytest test/python -q -p no:cacheprovider -rfEx \
  --junitxml="$out/pytest-cpu.xml" $(plugins 3) &
[ $cpp_tests = ON ] && step ctest ctest --test-dir "$build" --output-on-failure &
step sweep-cuda "$py" tools/opinfo_sweep.py --full --device cuda --jobs 3 --max-samples 1 \
  --out "$out/coverage-cuda.md" --json "$out/coverage-cuda.json" &
step hidden-writes-cuda "$py" tools/hidden_writes.py --device cuda --jobs 2 \
  --out "$out/hidden_writes-cuda.md" --json "$out/hidden_writes-cuda.json" &
wait
for run in cuda cpu; do
  [ -f "$out/pytest-$run.xml" ] && "$py" tools/junit_table.py "$out/pytest-$run.xml" >"$out/per-file-$run.md"
done
# The benchmarks' CUDA workers take ~20 s each (CUDA start-up per process): by default the quick
# workloads that matter most on a GPU, in an order that puts the real programs inside the budget.
# shellcheck disable=SC2086
budget=$bench_budget step bench-cuda "$py" benchmarks/run.py --device cuda \
  ${TFZ_GPU_BENCH_ARGS:---quick --only tiny/inplace --only large/inplace --only large/view_mutate \
  --only real/mlp_train --only real/resnet_block --only real/gpt_kv_cache \
  --only real/transformer_stack --only real/adam_foreach} \
  --out "$out/results-cuda.md" --plot "$out/scaling-cuda.png"
# Issue #33's table on CUDA tensors: every variant of a workload in one process (the benchmark's
# header says why); TFZ_GPU_REINPLACE_ARGS selects workloads (default: all nine).
# shellcheck disable=SC2086
budget=${TFZ_GPU_REINPLACE_BUDGET:-150} step reinplace-cuda "$py" benchmarks/reinplace.py \
  --device cuda ${TFZ_GPU_REINPLACE_ARGS:-} --out "$out/results_reinplace-cuda.md"
note "total: $(elapsed) s"
