// The layer's autograd bookkeeping: the AccumulateGrad hooks of
// Note [Autograd: .backward() inside the function] and the graph walk that installs them, and
// the traced outputs of Note [Autograd: saved outputs under a tracer].
#include "core/LayerAutograd.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/Recorder.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace tfz::detail {

// Note [Autograd: .backward() inside the function]
// loss.backward() inside f seeds the engine with a wrapper (loss is one), so every gradient it
// computes is a wrapper: the backward ops go through our kernel and are functionalized, as
// torch.autograd.grad inside f needs (Note [Wrapper: autograd mirrored]). .backward() also
// accumulates into leaves, and most leaves are plain tensors the caller owns (a parameter captured
// by closure, an input). Inside f their .grad must be a functional value (later code reads it:
// clipping, an optimizer step, a traced graph that returns it); after the call it must be eager's
// plain tensor. So every AccumulateGrad node reachable from a wrapper value's graph (walked once
// per node and layer, graphs built outside f included) gets a pre-hook for the layer's lifetime:
// when a wrapper gradient arrives for a leaf whose .grad is a plain tensor from before the call,
// that .grad is lifted into a wrapper first, so AccumulateGrad's in-place `grad += new` is a
// functionalized write instead of a refused write to a captured tensor. After the call
// (finish(), with the input epilogue) each such leaf's .grad is plain again: eagerly, the value is
// copied into the tensor that was .grad before the call (eager accumulates in place, and code such
// as DDP's gradient buckets holds that tensor) or becomes the new .grad; under a tracer the traced
// value becomes .grad, so the graph writes no captured tensor. A call that raises puts back every
// .grad it changed. A leaf wrapper's own .grad reads its value's (MirroredLeafMeta, found
// beside Note [Wrapper: autograd mirrored]), so `w.grad` inside f sees the accumulated gradient
// for leaves made inside f too. An assignment `w.grad = t` through a leaf wrapper reaches no hook:
// the wrapper's metadata notes the leaf when it hands out the .grad slot, and finish() makes that
// .grad plain too, as the new tensor (eager's assignment replaces, it does not copy).
// Rejected: handing AccumulateGrad plain gradients (the accumulation then ran eagerly, .grad read
// inside f was a plain tensor no tracer saw, and without views AccumulateGrad's detach() of it
// lifted it back into a wrapper), and hooks in the leaf's own hook list (the user's tensor hooks:
// ours are node pre-hooks, removed on exit).
namespace {

class LiftGradHook final : public torch::autograd::FunctionPreHook {
 public:
  LiftGradHook(LayerAutograd* owner, torch::autograd::AccumulateGrad* node, size_t index)
      : owner_(owner), node_(node), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    return owner_->before_accumulate(index_, *node_, grads);  // the owner removes this hook first
  }

 private:
  LayerAutograd* owner_;
  torch::autograd::AccumulateGrad* node_;  // the node owns this hook, so it is alive
  size_t index_;                           // this node's entry in the owner's list
};

template <class Hooks, class Hook>
void remove_hook(Hooks& hooks, const Hook* hook) {
  hooks.erase(
      std::remove_if(hooks.begin(), hooks.end(), [hook](const auto& h) { return h.get() == hook; }),
      hooks.end());
}

}  // namespace

void LayerAutograd::note(const NodePtr& fn) {
  std::vector<NodePtr> todo;
  auto visit = [&](const NodePtr& node) {
    if (!node) return;
    auto [it, fresh] = seen_.try_emplace(node.get(), WeakNodePtr(node));
    if (!fresh) {
      if (!it->second.expired()) return;
      it->second = WeakNodePtr(node);  // a new node at the address of a freed one
    }
    todo.push_back(node);
  };
  visit(fn);
  while (!todo.empty()) {
    auto node = std::move(todo.back());
    todo.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
      auto pre = std::make_unique<LiftGradHook>(this, acc, hooked_.size());
      hooked_.push_back(
          Hooked{WeakNodePtr(node),
                 pre.get(),
                 c10::weak_intrusive_ptr<c10::TensorImpl>(acc->variable.getIntrusivePtr()),
                 {}});
      node->add_pre_hook(std::move(pre));
      continue;
    }
    for (const auto& edge : node->next_edges()) visit(edge.function);
  }
}

// Note [Autograd: saved outputs under a tracer]
// Autograd runs on inner values, below our key. A backward formula that reads its op's output
// (tanh_backward(grad, result), threshold_backward for relu, exp's grad * result) gets it from a
// SavedVariable, which unpacks an output as a new tensor sharing its memory. That copy is made
// while backward runs under the layer, which hides the Python key, so make_fx's mode does not see
// the copy being made, and neither does capture's recorder: both then met a tensor they never
// traced and recorded it as a constant, and the joint graph replayed the traced forward's values
// in its backward (wrong gradients on any other input). So under a tracer the layer keeps each
// output a wrapper takes (with a grad_fn) keyed by (grad_fn, output number), and the kernel hands
// the tracer that traced tensor in place of a plain argument that has the same grad_fn, output
// number, memory and geometry: the same values, by construction. Outputs are kept alive until
// the layer exits, under a tracer only. A saved-tensor hook may give back other memory for a
// saved output: torch.utils.checkpoint(use_reentrant=False) stores the activations it recomputes
// in the backward and hands them out for the forward's saved outputs, which made the graph hold
// them as constants (silently wrong on other inputs); such an argument is matched by memory and
// geometry to the recomputed output the tracer traced. That output is known only once a wrapper
// takes it, which checkpoint's early stop prevents for the last op it recomputes (it stops from
// inside that op's autograd, a constant again), so traced calls recompute whole
// (set_checkpoint_early_stop(False) around them; api.py, capture.py). A backward that builds a
// graph (create_graph=True: a Hessian-vector product, MAML, a SiLU critic's gradient penalty)
// computes new outputs on plain values only (silu's backward takes sigmoid of its saved input),
// whose nodes save them in turn; no wrapper takes those, so the kernel notes every plain result
// with a grad_fn it runs under a tracer too (note_traced_plain_output). A saved_tensors_hooks pair
// inside f runs its unpack hook in the backward (traced: the kernel runs ops on plain values with
// the tracer's key restored), and autograd hands the formula a shallow copy of the hook's result,
// which no tracer saw; plain results without a grad_fn are therefore noted by memory alone, and a
// plain argument with no node match is looked up by memory and geometry the same way. A pack hook
// that makes a new tensor (t.clone()) runs inside the forward op's inner call, where the layer
// sees no op, and an unpack hook that returns it as is hands autograd that tensor (so does
// allow_mutation_on_saved_tensors with the clone its dispatch mode makes before a write): the
// Python package wraps every pair of hooks pushed to note what both return the same way
// (saved_tensor_hooks.py). Rejected:
// un-hiding the
// Python key while backward nodes run (node hooks): an exception between the hooks would leave the
// TLS changed, and the mode then sees autograd's bookkeeping (the detach of every unpacked output)
// as ops of the program.
namespace {
Layer* this_threads_layer() {
  Layer* layer = current_layer();
  return layer != nullptr ? layer : suspended_layer();
}
}  // namespace

void note_autograd_graph(int64_t layer_id, const NodePtr& fn) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || layer->id != layer_id) return;
  if (!layer->autograd) layer->autograd = std::make_unique<LayerAutograd>(layer_id);
  layer->autograd->note(fn);
}

void note_grad_assigned(int64_t layer_id, const at::Tensor& leaf) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || layer->id != layer_id) return;
  if (!layer->autograd) layer->autograd = std::make_unique<LayerAutograd>(layer_id);
  layer->autograd->note_assigned(leaf);
}

void note_traced_plain_output(const at::Tensor& value) {
  if (!value.defined()) return;
  Layer* layer = this_threads_layer();
  if (layer == nullptr) return;
  if (value.grad_fn() == nullptr) {
    if (!value.has_storage()) return;
    if (!layer->autograd) layer->autograd = std::make_unique<LayerAutograd>(layer->id);
    layer->autograd->note_memory(value);
    return;
  }
  if (!layer->autograd) return;
  layer->autograd->note_output(value);
}

void note_traced_output(int64_t layer_id, const at::Tensor& value) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || layer->id != layer_id || !layer->autograd) return;
  layer->autograd->note_output(value);
}

void LayerAutograd::note_output(const at::Tensor& value) {
  outputs_[OutputKey{value.grad_fn().get(), static_cast<uint32_t>(value.output_nr())}] = value;
  note_memory(value);
}

void LayerAutograd::note_memory(const at::Tensor& value) {
  if (value.has_storage()) by_storage_[value.storage().unsafeGetStorageImpl()].push_back(value);
}

namespace {
// `t` is a copy of `original`: the same memory and geometry, another TensorImpl. The conjugate
// and negative bits count as geometry: x.conj() shares x's memory, sizes and strides but reads
// other values.
bool same_memory(const at::Tensor& original, const at::Tensor& t) {
  return original.unsafeGetTensorImpl() != t.unsafeGetTensorImpl() && original.has_storage() &&
         t.has_storage() && original.is_alias_of(t) && original.dtype() == t.dtype() &&
         original.is_conj() == t.is_conj() && original.is_neg() == t.is_neg() &&
         original.sym_sizes() == t.sym_sizes() && original.sym_strides() == t.sym_strides() &&
         original.sym_storage_offset() == t.sym_storage_offset();
}
}  // namespace

std::optional<at::Tensor> LayerAutograd::traced_output(const at::Tensor& t) const {
  if (by_storage_.empty()) return std::nullopt;
  const auto& fn = t.grad_fn();
  auto it = fn ? outputs_.find(OutputKey{fn.get(), static_cast<uint32_t>(t.output_nr())})
               : outputs_.end();
  if (it != outputs_.end()) {
    // The traced output itself (a saved input is stored as is): nothing to substitute.
    if (it->second.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return std::nullopt;
    if (same_memory(it->second, t)) return it->second;
  }
  // A saved-tensor hook gave back other memory for this node's output (checkpoint's recomputed
  // activation), or an unpack hook's result reached the formula as autograd's copy of it: the
  // traced tensor that holds that memory.
  if (!t.has_storage()) return std::nullopt;
  auto found = by_storage_.find(t.storage().unsafeGetStorageImpl());
  if (found == by_storage_.end()) return std::nullopt;
  for (const at::Tensor& candidate : found->second) {
    if (same_memory(candidate, t)) return candidate;
  }
  return std::nullopt;
}

std::optional<at::Tensor> traced_saved_output(const at::Tensor& plain) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || !layer->autograd || !plain.defined()) return std::nullopt;
  if (auto value = layer->autograd->rewritten(plain)) return value;
  return layer->autograd->traced_output(plain);
}

void note_rewritten_temporary(const at::Tensor& plain, const at::Tensor& value) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr) return;
  if (!layer->autograd) layer->autograd = std::make_unique<LayerAutograd>(layer->id);
  layer->autograd->note_rewritten(plain, value);
}

void LayerAutograd::note_rewritten(const at::Tensor& plain, const at::Tensor& value) {
  rewritten_[plain.unsafeGetTensorImpl()] = {plain, value};
}

std::optional<at::Tensor> LayerAutograd::rewritten(const at::Tensor& plain) const {
  if (rewritten_.empty()) return std::nullopt;
  auto it = rewritten_.find(plain.unsafeGetTensorImpl());
  if (it == rewritten_.end()) return std::nullopt;
  return it->second.second;
}

bool LayerAutograd::is_ours(const at::Tensor& t) const {
  auto* impl = t.defined() ? maybe_get_impl(t) : nullptr;
  return impl != nullptr && impl->layer_id() == layer_id_;
}

torch::autograd::variable_list LayerAutograd::before_accumulate(
    size_t index, torch::autograd::AccumulateGrad& node,
    const torch::autograd::variable_list& grads) {
  torch::autograd::variable_list lifted = grads;
  for (at::Tensor& g : lifted) {
    if (!g.defined() || maybe_get_impl(g) != nullptr || g.layout() != c10::kStrided) continue;
    std::optional<at::Tensor> traced = ops_are_recorded() ? traced_saved_output(g) : std::nullopt;
    g = make_fresh_wrapper(traced ? *traced : g, layer_id_);
  }
  at::Tensor& grad = node.variable.mutable_grad();
  auto& before = hooked_[index].grad_before;
  if (!before.has_value()) before = grad;  // what the caller had
  if (!grad.defined() || maybe_get_impl(grad) != nullptr) return lifted;
  if (std::none_of(lifted.begin(), lifted.end(), [&](const at::Tensor& g) { return is_ours(g); })) {
    return lifted;
  }
  grad = make_fresh_wrapper(grad, layer_id_);
  return lifted;
}

void LayerAutograd::note_assigned(const at::Tensor& leaf) {
  const auto* impl = leaf.unsafeGetTensorImpl();
  for (auto& h : hooked_) {
    if (h.leaf.lock().get() != impl) continue;
    if (!h.grad_before.has_value()) h.grad_before = leaf.grad();
    h.assigned = true;
    return;
  }
  hooked_.push_back(Hooked{WeakNodePtr(NodePtr()), nullptr,
                           c10::weak_intrusive_ptr<c10::TensorImpl>(leaf.getIntrusivePtr()),
                           leaf.grad(), /*assigned=*/true});
}

at::Tensor LayerAutograd::leaf_of(const Hooked& h) {
  auto impl = h.leaf.lock();
  return impl ? at::Tensor(std::move(impl)) : at::Tensor();
}

void LayerAutograd::finish(bool traced) {
  finished_ = true;
  for (auto& h : hooked_) {
    if (!h.grad_before.has_value()) continue;  // never accumulated into
    at::Tensor variable = leaf_of(h);
    if (!variable.defined()) continue;
    at::Tensor& grad = variable.mutable_grad();
    if (!is_ours(grad)) continue;
    auto* impl = unsafe_get_impl(grad);
    impl->sync_();
    const at::Tensor value = impl->value();
    at::Tensor& before = *h.grad_before;
    if (!traced && !h.assigned && before.defined() && before.sizes() == value.sizes() &&
        before.dtype() == value.dtype()) {
      at::NoGradGuard no_grad;
      before.copy_(value);  // eager accumulated into this tensor
      grad = before;
    } else {
      grad = value;
    }
  }
}

LayerAutograd::~LayerAutograd() {
  for (auto& h : hooked_) {
    if (auto node = h.node.lock(); node && h.pre != nullptr) remove_hook(node->pre_hooks(), h.pre);
    if (finished_ || !h.grad_before.has_value()) continue;
    // The call raised: every .grad it changed is put back.
    at::Tensor variable = leaf_of(h);
    if (variable.defined() && is_ours(variable.grad())) variable.mutable_grad() = *h.grad_before;
  }
}

}  // namespace tfz::detail
