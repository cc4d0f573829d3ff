#!/usr/bin/env bash
# Instructions per ATen op of bench_dispatch's cases under callgrind, ours vs plain dispatch.
# Instruction counts are stable on shared, noisy machines, unlike wall time.
#
#   benchmarks/callgrind.sh                     # every case
#   benchmarks/callgrind.sh add add_            # some of: add add_ mul_out view_mutate_read
#                                               #          functionalize100
#   ITERS=5000 benchmarks/callgrind.sh add      # more iterations (default 2000)
#
# Builds bench_dispatch in $BUILD_DIR (default /tmp/tfz-bench) if it is missing. Prints Ir/op per
# case, then (BREAKDOWN=0 to skip) inclusive Ir/op of the kernel's main functions for each ours
# case. The profiles stay in $OUT_DIR (default /tmp/tfz-callgrind) for callgrind_annotate.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-/tmp/tfz-bench}"
OUT_DIR="${OUT_DIR:-/tmp/tfz-callgrind}"
ITERS="${ITERS:-2000}"
BIN="$BUILD_DIR/benchmarks/cpp/bench_dispatch"

if ! command -v valgrind >/dev/null; then
  echo "callgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2
  exit 1
fi
if [ ! -x "$BIN" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DTFZ_BUILD_TESTS=OFF -DTFZ_BUILD_PYTHON=OFF \
    -DTFZ_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
  cmake --build "$BUILD_DIR" --target bench_dispatch -j2
fi

cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(add add_ mul_out view_mutate_read functionalize100)
mkdir -p "$OUT_DIR"

# Ir collected between the client requests around the measured loop (the .1 dump).
instructions() {
  local spec="$1" out="$OUT_DIR/callgrind.${1//\//.}"
  rm -f "$out" "$out".*
  # --instr-atstart=no: LibTorch's start-up runs uninstrumented (fast); the binary switches
  # instrumentation on around the loop and dumps it as "$out.1".
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$BIN" --callgrind="$spec" --iters="$ITERS" >"$out.stdout" 2>"$out.log" \
    || { echo "callgrind.sh: $spec failed, see $out.log" >&2; return 1; }
  local ops total
  ops=$(sed -n 's/.*ops_per_iter=\([0-9]*\).*/\1/p' "$out.stdout")
  total=$(sed -n 's/^summary: //p' "$out.1")
  echo "$total $ops"
}

printf '%-18s %14s %14s %8s\n' "case" "plain Ir/op" "ours Ir/op" "ours/plain"
for c in "${cases[@]}"; do
  read -r plain_total ops < <(instructions "$c/plain")
  read -r ours_total _ < <(instructions "$c/ours")
  awk -v c="$c" -v p="$plain_total" -v o="$ours_total" -v n="$ITERS" -v k="$ops" 'BEGIN {
    pp = p / (n * k); po = o / (n * k);
    printf "%-18s %14.0f %14.0f %7.2fx\n", c, pp, po, po / pp }'
done
[ "${BREAKDOWN:-1}" = 0 ] && exit 0
command -v callgrind_annotate >/dev/null || exit 0

# Where ours' instructions go: inclusive Ir per op of the kernel's main functions (they nest, so
# rows do not add up). Patterns that match nothing (renamed or inlined functions) are left out.
for c in "${cases[@]}"; do
  ops=$(sed -n 's/.*ops_per_iter=\([0-9]*\).*/\1/p' "$OUT_DIR/callgrind.$c.ours.stdout")
  echo
  echo "== $c/ours: inclusive Ir per op (averaged over the case's $ops ops)"
  callgrind_annotate --inclusive=yes --threshold=100 "$OUT_DIR/callgrind.$c.ours.1" 2>/dev/null |
    python3 -c '
import re, sys
per = float(sys.argv[1])
rows = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(\S.*)", line)
    if m:
        rows[m.group(2)] = int(m.group(1).replace(",", ""))
LABELS = [
    ("tfz::detail::run_boxed_kernel(", "our boxed kernel, all of it (run_boxed_kernel)"),
    ("tfz::detail::(anonymous namespace)::Unboxed<", "our unboxed functional kernel, all of it"),
    ("tfz::detail::(anonymous namespace)::UnboxedMutable<",
     "our unboxed in-place / out= kernel, all of it"),
    ("tfz::detail::write_back(", "  write_back (replace, commit, sync)"),
    ("tfz::detail::FunctionalTensorImpl::copy_metadata_(", "  copy_metadata_ (mirror sizes, flags)"),
    ("tfz::detail::make_fresh_wrapper(", "  make_fresh_wrapper (new output wrapper)"),
    ("c10::Dispatcher::callBoxed(*libtfz_core", "  the op itself, redispatched below our key"),
    ("tfz::detail::functional_kernel(", "  functional_kernel"),
    ("tfz::detail::mutable_kernel(", "  mutable_kernel (in-place / out=)"),
    ("tfz::detail::view_kernel(", "  view_kernel"),
    ("tfz::detail::wrap_outputs(", "  wrap_outputs (new wrappers)"),
    ("tfz::detail::make_view_wrapper(", "  make_view_wrapper"),
    ("tfz::detail::sync_and_unwrap(", "  sync_and_unwrap (arguments)"),
    ("tfz::detail::FunctionalTensorImpl::sync_(", "  FunctionalTensorImpl::sync_"),
    ("tfz::detail::AliasStorage::apply_updates(", "  AliasStorage::apply_updates"),
    ("tfz::detail::ViewMeta::forward(", "  ViewMeta::forward (view replay)"),
    ("tfz::detail::ViewMeta::inverse(", "  ViewMeta::inverse (scatter back)"),
    ("tfz::detail::FunctionalTensorImpl::replace_(", "  replace_"),
    ("tfz::detail::FunctionalTensorImpl::commit_update_(", "  commit_update_"),
    ("for_each_tensor<tfz::detail::run_boxed_kernel(", "  argument scan (one pass: ours? same layer?)"),
    ("tfz::detail::maybe_get_impl(", "  maybe_get_impl (all callers)"),
    ("__dynamic_cast", "    of which __dynamic_cast"),
    ("tfz::detail::InnerCallGuard::InnerCallGuard(", "  InnerCallGuard constructor (TLS write)"),
    ("tfz::detail::InnerCallGuard::~InnerCallGuard(", "  InnerCallGuard destructor (TLS write)"),
    ("__tls_get_addr", "  __tls_get_addr (thread-local lookups)"),
    ("tfz::detail::FunctionalTensorImpl::~FunctionalTensorImpl(",
     "wrapper destruction (~FunctionalTensorImpl)"),
    ("malloc.c:malloc ", "malloc (all callers)"),
    ("malloc.c:free ", "free (all callers)"),
]
for pattern, label in LABELS:
    parts = pattern.split("*")
    hits = [v for k, v in rows.items() if all(p in k for p in parts)
            and (k.find(parts[0]) >= 0)]
    if hits:
        print(f"{max(hits) / per:10.0f}  {label}")
' "$((ITERS * ops))"
done
echo
echo "Profiles: $OUT_DIR/callgrind.<case>.<plain|ours>.1; all functions, inclusive:"
echo "  callgrind_annotate --inclusive=yes $OUT_DIR/callgrind.${cases[0]}.ours.1 | less"
