// Public C++ API of torch-functionalize (namespace tfz).
// What a LibTorch user includes: the whole-call transform `tfz::functionalize`, the RAII guard for
// manual use, and the wrapper helpers. Everything else lives in tfz::detail and may change.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tfz {

namespace detail {
struct Graph;
}  // namespace detail

/// What the transform removes, mirroring torch.func.functionalize's `remove=` argument.
enum class Remove {
  /// In-place, out= and mutable ops become functional ops; views stay views.
  Mutations,
  /// As above, and every view op becomes its `*_copy` variant.
  MutationsAndViews,
};

/// Parses "mutations" / "mutations_and_views"; throws c10::ValueError naming the allowed values.
Remove parse_remove(const std::string& remove);

/// True if `t` is a functional wrapper created by this library (never a torch.func one).
/// NB: a wrapper has no data of its own; ops on it work, but code that reads raw memory
/// (operator<< on a tensor, data_ptr()) must be given from_functional(t) instead.
bool is_functional(const at::Tensor& t);

/// Wraps `t` for the functionalize call active on this thread. Throws if none is active.
/// A wrapper of the active call is returned as is (at:: factories inside a call already return
/// wrappers); a wrapper of another call is refused.
at::Tensor to_functional(const at::Tensor& t);

/// Wraps several inputs at once. Inputs that share a storage share one alias storage, so a
/// write through one is seen through the others, as in eager (see Note [Inputs: aliased inputs]).
std::vector<at::Tensor> to_functional(const std::vector<at::Tensor>& ts);

/// Applies pending updates to `t` and returns its current inner value (a plain tensor).
/// Plain tensors are returned unchanged.
at::Tensor from_functional(const at::Tensor& t);

/// Brings a wrapper up to date with its alias storage (no-op for plain tensors).
void sync(const at::Tensor& t);

/// True if data was written to `t`'s storage since it was wrapped (through any alias).
bool has_data_mutation(const at::Tensor& t);

/// True if `t`'s own sizes/strides were changed in place (transpose_, squeeze_, ...).
bool has_metadata_mutation(const at::Tensor& t);

/// The input epilogue: replays on the user's `original` tensor whatever `wrapper` went through
/// (metadata mutations first, then one copy_ of the new data). Call it after the guard is gone,
/// so that tracers record it as part of the caller's program.
void propagate_input_mutation(const at::Tensor& original, const at::Tensor& wrapper);

/// The epilogue for all inputs of one call (wrappers from one to_functional(vector) call):
/// inputs that share a storage are written back together, once where possible.
void propagate_input_mutations(const std::vector<at::Tensor>& originals,
                               const std::vector<at::Tensor>& wrappers);

/// RAII guard for manual use: while alive, every op on wrappers of this guard is functionalized.
/// On destruction the thread's dispatch state is restored exactly, also during unwinding.
/// Nesting guards (or functionalize calls) on one thread is refused with a clear error.
class FunctionalizeGuard {
 public:
  explicit FunctionalizeGuard(Remove remove = Remove::Mutations);
  ~FunctionalizeGuard();
  FunctionalizeGuard(const FunctionalizeGuard&) = delete;
  FunctionalizeGuard& operator=(const FunctionalizeGuard&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
using IValueFn = std::function<c10::IValue(const std::vector<c10::IValue>&)>;

/// Returns a callable with the contract of torch.func.functionalize: it runs `fn` on wrappers of
/// its inputs, returns plain tensors, and writes input mutations back with a copy_ epilogue.
TensorFn functionalize(TensorFn fn, Remove remove = Remove::Mutations);

/// Same over IValues: tensors anywhere in the arguments (also inside lists, tuples and dicts) are
/// wrapped; tensors anywhere in the result are unwrapped.
IValueFn functionalize(IValueFn fn, Remove remove = Remove::Mutations);

/// Wraps a plain tensor for the active call, leaving wrappers as they are. Factories inside the
/// call (at::, torch:: and Python ones) are wrapped automatically (Note [Kernel: factories]);
/// this is for plain tensors the function wants functionalized, e.g. a buffer it allocated
/// before the call.
at::Tensor wrap_fresh(const at::Tensor& t);

/// A functional program recorded by tfz::capture: ATen ops over the inputs, in program order,
/// ending with the input epilogue (copy_, as_strided_, resize_). Cheap to copy (shared, const).
class CapturedGraph {
 public:
  explicit CapturedGraph(std::shared_ptr<const detail::Graph> graph);
  /// Runs the graph through the dispatcher; inputs are written as the functionalized call writes
  /// them. `inputs` must match the captured ones in number, sizes, strides, dtype, device,
  /// requires_grad and memory sharing, else it raises (Note [Capture: guards on inputs]).
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;
  /// One line per op: `%3 = aten::add.Tensor(%0, 1)`.
  std::string str() const;
  size_t num_nodes() const;
  const detail::Graph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const detail::Graph> graph_;
};

/// Functionalizes `fn` on `inputs` (running it once, as make_fx does: inputs are written as by
/// the functionalized call) and returns the functional program it ran, recorded in C++ as the
/// engine runs it. Inputs may be meta tensors, so nothing is computed. Ops that only build views
/// or values nothing uses are dropped. Refused (with an error naming the alternative,
/// make_fx(functionalize(f))): symbolic sizes, active torch.func transforms, autocast, tracing
/// modes, a capture inside a functionalized function. See Note [Capture: how ops are recorded].
CapturedGraph capture(const TensorFn& fn, const std::vector<at::Tensor>& inputs,
                      Remove remove = Remove::Mutations);

}  // namespace tfz
