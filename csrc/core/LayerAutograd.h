// LayerAutograd: a layer's autograd bookkeeping. The leaves a .backward() inside the function can
// accumulate into (found by walking the graph of each new wrapper value; each AccumulateGrad gets
// a hook that lifts a plain .grad into a wrapper before a wrapper gradient is added, and finish()
// makes .grad plain again; Note [Autograd: .backward() inside the function]), and, under a
// tracer, the forward outputs a backward formula may read back
// (Note [Autograd: saved outputs under a tracer]). Owned by a Layer until the call's epilogue;
// its destructor removes every hook (and, if finish() never ran, puts each .grad back).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace tfz::detail {

// Autograd's node pointers are std::shared_ptr in some torch releases and c10::intrusive_ptr in
// others; these follow whichever the installed torch uses.
using NodePtr = std::remove_cv_t<
    std::remove_reference_t<decltype(std::declval<torch::autograd::Edge&>().function)>>;
using WeakNodePtr = decltype(torch::autograd::AutogradMeta::grad_accumulator_);

class LayerAutograd {
 public:
  explicit LayerAutograd(int64_t layer_id) : layer_id_(layer_id) {}
  ~LayerAutograd();
  LayerAutograd(const LayerAutograd&) = delete;
  LayerAutograd& operator=(const LayerAutograd&) = delete;

  /// Walks the nodes reachable from `fn` not seen before and hooks every AccumulateGrad among
  /// them (`fn` included).
  void note(const NodePtr& fn);
  /// The pre-hook of `node`: a gradient is about to be accumulated into a leaf. A plain gradient
  /// (a formula's temporary: Note [Autograd: formula temporaries written in place]) becomes a
  /// wrapper, of its traced value under a tracer; a plain .grad then becomes a wrapper too.
  /// Returns the gradients to accumulate.
  torch::autograd::variable_list before_accumulate(size_t index,
                                                   torch::autograd::AccumulateGrad& node,
                                                   const torch::autograd::variable_list& grads);
  /// After a call that returned: every leaf's .grad is plain again (copied into the tensor that
  /// was .grad before the call when not `traced`). Without it, the destructor restores .grad.
  void finish(bool traced);
  /// `leaf`'s .grad slot is about to be assigned through a leaf wrapper (`w.grad = t`, not an
  /// accumulation): finish() makes it plain as it does an accumulated one, replacing the tensor
  /// as eager's assignment does; a call that raises puts the .grad before it back.
  void note_assigned(const at::Tensor& leaf);
  /// Under a tracer: `value` (with a grad_fn) is the traced output (grad_fn, output_nr).
  void note_output(const at::Tensor& value);
  /// Under a tracer: `value` (without a grad_fn) is a traced result, found by its memory only.
  void note_memory(const at::Tensor& value);
  /// The traced output `t` is a copy of (same node, output number, memory and geometry), or else
  /// the traced result with t's memory and geometry, if any.
  std::optional<at::Tensor> traced_output(const at::Tensor& t) const;
  /// Under a tracer: the plain temporary `plain` stands for the traced `value` from now on
  /// (Note [Autograd: formula temporaries written in place]).
  void note_rewritten(const at::Tensor& plain, const at::Tensor& value);
  /// What `plain` stands for after such a write, if anything.
  std::optional<at::Tensor> rewritten(const at::Tensor& plain) const;

 private:
  int64_t layer_id_;
  // Keyed by address; the weak pointer tells a node seen before from a new one at a freed
  // node's address. Weak, so the layer does not keep graphs (and their saved tensors) alive.
  std::unordered_map<const torch::autograd::Node*, WeakNodePtr> seen_;
  struct Hooked {
    WeakNodePtr node;
    const torch::autograd::FunctionPreHook* pre;
    // The leaf, weakly: its AccumulateGrad node may be freed with the graph before finish().
    c10::weak_intrusive_ptr<c10::TensorImpl> leaf;
    std::optional<at::Tensor> grad_before;  // the leaf's .grad before its first accumulation
    bool assigned = false;                  // .grad was assigned, not only accumulated into
  };
  /// The leaf of entry `h`, if it is alive.
  static at::Tensor leaf_of(const Hooked& h);
  bool is_ours(const at::Tensor& t) const;
  bool finished_ = false;
  std::vector<Hooked> hooked_;
  struct OutputKey {
    const torch::autograd::Node* node;
    uint32_t output_nr;
    bool operator==(const OutputKey& o) const { return node == o.node && output_nr == o.output_nr; }
  };
  struct OutputKeyHash {
    size_t operator()(const OutputKey& k) const {
      return std::hash<const void*>()(k.node) ^ (static_cast<size_t>(k.output_nr) << 1);
    }
  };
  // Strong: the wrapper of an output is often gone by the time backward reads the output back,
  // and the tracer only knows the tensor while it is alive. Filled only under a tracer.
  std::unordered_map<OutputKey, at::Tensor, OutputKeyHash> outputs_;
  // The same outputs by storage, with plain results that have no grad_fn: an output a
  // saved-tensor hook stored and gave back (torch.utils.checkpoint's recomputation) has its node
  // but another output's memory, and an unpack hook's result reaches a formula as a copy.
  std::unordered_map<const c10::StorageImpl*, std::vector<at::Tensor>> by_storage_;
  // Temporaries written in place under a tracer: (the temporary, what it stands for). Strong, so
  // an address is not reused by another tensor while the layer runs.
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> rewritten_;
};

/// A wrapper of layer `layer_id` took a value whose autograd node is `fn`: notes the graph on that
/// layer when it is this thread's layer (running user code or suspended by an inner call).
void note_autograd_graph(int64_t layer_id, const NodePtr& fn);
/// A leaf wrapper of layer `layer_id` hands out `leaf`'s .grad slot for assignment: notes it on
/// that layer when it is this thread's layer (LayerAutograd::note_assigned).
void note_grad_assigned(int64_t layer_id, const at::Tensor& leaf);
/// Under a tracer, a wrapper of layer `layer_id` took `value`, an output with a grad_fn.
void note_traced_output(int64_t layer_id, const at::Tensor& value);
/// Under a tracer, this thread's layer ran an op on plain values only and `value` is a result: one
/// with a grad_fn (a backward that builds a graph) is noted like a wrapper's output, one without
/// (an unpack hook's result) by its memory.
void note_traced_plain_output(const at::Tensor& value);
/// A plain tensor reached the kernel of this thread's layer: under a tracer, the traced forward
/// output it copies, if any (Note [Autograd: saved outputs under a tracer]).
std::optional<at::Tensor> traced_saved_output(const at::Tensor& plain);
/// Under a tracer, this thread's layer: `plain` (a temporary a formula wrote in place) stands for
/// the traced `value` (LayerAutograd::note_rewritten).
void note_rewritten_temporary(const at::Tensor& plain, const at::Tensor& value);

}  // namespace tfz::detail
