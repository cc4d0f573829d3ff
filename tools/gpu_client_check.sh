#!/usr/bin/env bash
# The CUDA checks of issue #31's client-code suite as one command, for a machine with an NVIDIA GPU
# and a CUDA build of torch: build the extension with all cores (no C++ tests), then the client
# suites (writes autograd does not see, every optimizer incl. fused and capturable, modules with
# hidden state, guards, control flow) on CUDA tensors and on CPU tensors. Logs land in OUT_DIR.
#
# Usage: bash tools/gpu_client_check.sh OUT_DIR   (PYTHON, default python3; TFZ_GPU_CUDA_BUDGET and
# TFZ_GPU_CPU_BUDGET, seconds for each run, default 220 and 140)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/gpu_client_check.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)
note "machine: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
note "$("$py" -c 'import torch; print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}")')"
build=build/gpu
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTFZ_BUILD_TESTS=OFF \
  -DTFZ_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$(command -v "$py")" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$PWD/$build/lib" >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1 ||
  { note "build: FAILED"; tail -30 "$out/build.log"; exit 1; }
cp "$build"/lib/*.so python/torch_functionalize/
"$py" -c 'import torch; print(f"TORCH_VERSION = {torch.__version__!r}")' >python/torch_functionalize/_build_info.py
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
note "build: ok in $(($(date +%s) - start)) s"
files="test/python/test_unseen_writes.py test/python/test_client_training.py
  test/python/test_client_modules.py test/python/test_guards.py test/python/test_control_flow.py"
for device in cuda cpu; do
  budget=${TFZ_GPU_CUDA_BUDGET:-220}
  [ "$device" = cpu ] && budget=${TFZ_GPU_CPU_BUDGET:-140}
  TFZ_TEST_DEVICE=$device timeout "$budget" "$py" -m pytest $files -q \
    -p no:cacheprovider --junitxml="$out/client-$device.xml" >"$out/client-$device.log" 2>&1
  note "client suite on $device tensors (rc $?): $(tail -1 "$out/client-$device.log")"
done
note "total $(($(date +%s) - start)) s"
