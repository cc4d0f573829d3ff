// The capture recorder: turns the op calls it is shown (by the record kernel, kernels/
// RecordKernel.cpp) into a Graph (core/Graph.h), naming each tensor by the value that produced it.
// Also the thread's recording state and the guard that turns recording on.
// See Note [Capture: how ops are recorded].
#pragma once

#include "core/Graph.h"
#include "core/Recording.h"

#include <c10/util/intrusive_ptr.h>

#include <unordered_map>

namespace tfz::detail {

class Recorder {
 public:
  /// `inputs` become the graph's inputs, in order.
  explicit Recorder(const std::vector<at::Tensor>& inputs);

  /// Reads the call's arguments (the last `num_args` entries of `stack`) before it runs.
  GraphNode begin(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  /// Names the call's results (the last entries of `stack`) and appends the node.
  void finish(GraphNode node, const torch::jit::Stack& stack);
  /// Appends a guard that `t` (a value of the graph, or a constant) holds the values it holds now:
  /// an op read them on the host and specialized on them (`what`).
  /// See Note [Capture: guards on values read].
  void guard_values(const at::Tensor& t, const std::string& what);
  /// The graph whose outputs are `outputs`. The recorder is spent afterwards.
  Graph take(const std::vector<at::Tensor>& outputs);
  /// Autograd nodes numbered [begin, end) were made inside an op recorded whole: their saved
  /// tensors are no graph values (Note [Capture: composites taken whole under autograd]).
  void note_hidden_nodes(uint64_t begin, uint64_t end) { hidden_nodes_.emplace_back(begin, end); }
  /// Whether any op recorded whole made autograd nodes (the common capture has none).
  bool has_hidden_nodes() const { return !hidden_nodes_.empty(); }
  /// Whether `sequence_nr` is such a node's.
  bool is_hidden_node(uint64_t sequence_nr) const {
    for (const auto& [begin, end] : hidden_nodes_) {
      if (sequence_nr >= begin && sequence_nr < end) return true;
    }
    return false;
  }

 private:
  int64_t value_of(const at::Tensor& t);  // a known value, or a new constant
  int64_t define(const at::Tensor& t, ValueSource source);
  GraphArg arg_of(const c10::IValue& v);
  // Follows the read of node `index` with a guard node (Note [Capture: guards on values read]).
  void guard_(size_t index, const torch::jit::Stack& stack);
  // Follows a node that returned a number computed from its tensors with a guard node.
  void guard_scalar_op_(size_t index, const torch::jit::Stack& stack);
  bool index_had_mask_ = false;  // the last op with a dynamic output shape had a boolean index
  at::Tensor packed_lengths_;    // _pack_padded_sequence's lengths, read on the host
  std::vector<std::pair<uint64_t, uint64_t>> hidden_nodes_;

  Graph graph_;
  std::unordered_map<const c10::TensorImpl*, int64_t> ids_;
  // Weak references keep each named TensorImpl's memory, hence its address, from being reused by
  // a later tensor while the recorder lives, without keeping its storage alive.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> pinned_;
};

/// The recorder of the capture running on this thread, or nullptr.
Recorder* active_recorder();

/// Makes `recorder` this thread's active recorder (nullptr: none), for a thread that joins another
/// thread's layer (Note [Layer: threads that carry a layer's TLS]).
void set_active_recorder(Recorder* recorder);

/// Records every op run on inner tensors while alive: includes the record key in the thread's
/// dispatch TLS (a layer hides it while user code runs, as it hides Python). Refuses nesting.
class RecordingGuard {
 public:
  explicit RecordingGuard(Recorder& recorder);
  ~RecordingGuard();
  RecordingGuard(const RecordingGuard&) = delete;
  RecordingGuard& operator=(const RecordingGuard&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_tls_;
};

}  // namespace tfz::detail
