// Per-op cost of the functionalize kernel against plain dispatch, from C++ (no Python in the way).
// Each case runs the same ops on plain tensors ("<case>/plain") and on wrappers inside a
// tfz::FunctionalizeGuard ("<case>/ours"); `per_op` is the time per ATen op. Two modes:
//   bench_dispatch [--benchmark_filter=add/ ...]      Google Benchmark (wall time, noisy machines)
//   bench_dispatch --callgrind=add/ours [--iters=N]   one case N times between callgrind client
//                                                     requests (benchmarks/callgrind.sh)
#include <torch_functionalize/functionalize.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name)
#endif

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

using Step = std::function<void()>;

// What one case needs alive while it runs: the guard (ours only) and its tensors.
struct Fixture {
  std::optional<tfz::FunctionalizeGuard> guard;
  std::vector<at::Tensor> tensors;
  tfz::TensorFn fn;

  // Plain tensors for "plain", wrappers of this guard for "ours".
  at::Tensor input(const at::Tensor& t) const { return guard ? tfz::to_functional(t) : t; }
};

// A 100-op function on tiny tensors: clone, then 33 blocks of a functional mul, a view of its
// result and an add_ through that view (values converge, however often it runs).
std::vector<at::Tensor> hundred_ops(const std::vector<at::Tensor>& in) {
  at::Tensor y = in[0].clone();
  for (int i = 0; i < 33; ++i) {
    y = at::mul(y, 0.9);
    y.view({2, -1}).add_(0.25);
  }
  return {y};
}

struct Case {
  const char* name;
  int ops_per_iter;
  const char* what;
  std::function<Step(Fixture&, bool ours)> make;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"add", 1, "at::add of two 1-element tensors (a functional op: unwrap, call, wrap)",
       [](Fixture& fx, bool) -> Step {
         fx.tensors = {fx.input(at::ones({1})), fx.input(at::ones({1}))};
         return [&fx] { benchmark::DoNotOptimize(at::add(fx.tensors[0], fx.tensors[1])); };
       }},
      {"add_", 1, "a.add_(b) in place on 1-element tensors (functional variant, replace, commit)",
       [](Fixture& fx, bool) -> Step {
         fx.tensors = {fx.input(at::ones({1})), fx.input(at::full({1}, 1e-6))};
         return [&fx] { fx.tensors[0].add_(fx.tensors[1]); };
       }},
      {"mul_out", 1, "at::mul_out(out, a, b) on 1-element tensors (functional variant, write out)",
       [](Fixture& fx, bool) -> Step {
         fx.tensors = {fx.input(at::ones({1})), fx.input(at::ones({1})), fx.input(at::empty({1}))};
         return [&fx] { at::mul_out(fx.tensors[2], fx.tensors[0], fx.tensors[1]); };
       }},
      {"view_mutate_read", 3,
       "slice view of a 4-element base, add_ through it, then read the base (at::mul)",
       [](Fixture& fx, bool) -> Step {
         fx.tensors = {fx.input(at::zeros({4}))};
         return [&fx] {
           at::Tensor v = fx.tensors[0].slice(0, 1, 3);
           v.add_(1e-6);
           benchmark::DoNotOptimize(at::mul(fx.tensors[0], 2));
         };
       }},
      {"functionalize100", 100,
       "a 100-op function called directly vs through tfz::functionalize (guard, wrap, epilogue)",
       [](Fixture& fx, bool ours) -> Step {
         fx.guard.reset();  // tfz::functionalize enters its own guard per call
         fx.tensors = {at::ones({8})};
         fx.fn = ours ? tfz::functionalize(hundred_ops) : tfz::TensorFn(hundred_ops);
         return [&fx] { benchmark::DoNotOptimize(fx.fn(fx.tensors)); };
       }},
  };
  return all;
}

// Sets up `c` (inside a guard for ours) and returns its step; `fx` must outlive the step.
Step prepare(const Case& c, bool ours, Fixture& fx) {
  if (ours) fx.guard.emplace(tfz::Remove::Mutations);
  return c.make(fx, ours);
}

void run_benchmark(benchmark::State& state, const Case& c, bool ours) {
  Fixture fx;
  Step step = prepare(c, ours, fx);
  for (int i = 0; i < 10; ++i) step();  // warm-up: lazy classification, allocator caches
  for (auto _ : state) step();
  const double ops = static_cast<double>(state.iterations()) * c.ops_per_iter;
  state.counters["per_op"] =
      benchmark::Counter(ops, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(c.what);
  fx.tensors.clear();  // wrappers must not outlive their guard
}

// --callgrind=<case>/<plain|ours>: warm up, then run `iters` steps with callgrind collecting
// only those (run under valgrind --tool=callgrind --instr-atstart=no).
int run_callgrind(const std::string& spec, long iters) {
  const auto slash = spec.rfind('/');
  const std::string name = spec.substr(0, slash);
  const std::string variant = slash == std::string::npos ? "" : spec.substr(slash + 1);
  for (const auto& c : cases()) {
    if (name != c.name || (variant != "plain" && variant != "ours")) continue;
    Fixture fx;
    Step step = prepare(c, variant == "ours", fx);
    for (int i = 0; i < 100; ++i) step();
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
    for (long i = 0; i < iters; ++i) step();
    CALLGRIND_DUMP_STATS_AT(spec.c_str());
    CALLGRIND_STOP_INSTRUMENTATION;
    fx.tensors.clear();
    std::printf("case=%s iters=%ld ops_per_iter=%d\n", spec.c_str(), iters, c.ops_per_iter);
    return 0;
  }
  std::fprintf(stderr, "bench_dispatch: unknown case '%s'; cases:", spec.c_str());
  for (const auto& c : cases()) std::fprintf(stderr, " %s/plain %s/ours", c.name, c.name);
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string callgrind;
  long iters = 2000;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--callgrind=", 0) == 0) {
      callgrind = a.substr(12);
    } else if (a.rfind("--iters=", 0) == 0) {
      iters = std::strtol(a.c_str() + 8, nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (!callgrind.empty()) return run_callgrind(callgrind, iters);

  for (const auto& c : cases()) {
    for (bool ours : {false, true}) {
      const std::string name = std::string(c.name) + (ours ? "/ours" : "/plain");
      benchmark::RegisterBenchmark(name.c_str(), [&c, ours](benchmark::State& state) {
        run_benchmark(state, c, ours);
      })->Unit(benchmark::kNanosecond);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
