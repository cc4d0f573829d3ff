// LeafGrads: the leaves a .backward() inside a functionalized function can accumulate into, found
// by walking the autograd graph of each new wrapper value, and the pre-hook that hands each such
// leaf's AccumulateGrad the inner value of a wrapper gradient. Owned by a Layer; its destructor
// removes every hook. See Note [Autograd: .backward() inside the function].
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace tfz::detail {

// Autograd's node pointers are std::shared_ptr in some torch releases and c10::intrusive_ptr in
// others; these follow whichever the installed torch uses.
using NodePtr = std::remove_cv_t<
    std::remove_reference_t<decltype(std::declval<torch::autograd::Edge&>().function)>>;
using WeakNodePtr = decltype(torch::autograd::AutogradMeta::grad_accumulator_);

class LeafGrads {
 public:
  explicit LeafGrads(int64_t layer_id) : layer_id_(layer_id) {}
  ~LeafGrads();
  LeafGrads(const LeafGrads&) = delete;
  LeafGrads& operator=(const LeafGrads&) = delete;

  /// Walks the nodes reachable from `fn` not seen before and hooks every AccumulateGrad among
  /// them (`fn` included).
  void note(const NodePtr& fn);

 private:
  int64_t layer_id_;
  // Keyed by address; the weak pointer tells a node seen before from a new one at a freed
  // node's address. Weak, so the layer does not keep graphs (and their saved tensors) alive.
  std::unordered_map<const torch::autograd::Node*, WeakNodePtr> seen_;
  struct Hooked {
    WeakNodePtr node;
    const torch::autograd::FunctionPreHook* pre;
    const torch::autograd::FunctionPostHook* post;
  };
  std::vector<Hooked> hooked_;
};

/// A wrapper of layer `layer_id` took a value whose autograd node is `fn`: notes the graph on that
/// layer when it is this thread's layer (running user code or suspended by an inner call).
void note_autograd_graph(int64_t layer_id, const NodePtr& fn);

}  // namespace tfz::detail
