// The AccumulateGrad pre-hook of Note [Autograd: .backward() inside the function] and the graph
// walk that installs it.
#include "core/LayerAutograd.h"

#include "core/FunctionalTensorImpl.h"
#include "core/Layer.h"
#include "core/Recorder.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>

namespace tfz::detail {

// Note [Autograd: .backward() inside the function]
// loss.backward() inside f seeds the engine with a wrapper (loss is one), so every gradient it
// computes is a wrapper: the backward ops go through our kernel and are functionalized, which is
// what torch.autograd.grad inside f needs (Note [Wrapper: autograd mirrored]). But .backward()
// also accumulates into leaves, and a leaf is a plain tensor the caller owns (a parameter captured
// by closure, or an input): a wrapper in its .grad escapes the call, and accumulating into a .grad
// that already exists is a write to a tensor captured from outside f, which is refused. So every
// AccumulateGrad node reachable from a wrapper value's graph gets, for the layer's lifetime, a
// pre-hook that replaces a wrapper gradient of this layer by its (synced) inner value: the
// accumulation then runs as eager's, on plain tensors, and .grad holds eager's value after the
// call. Under a tracer the gradient the leaf receives is the traced inner value, as for
// make_fx(f). The walk visits each node once per layer (graphs built outside f included, through
// captured non-leaf tensors); a value's nodes are walked when the wrapper takes it.
// Rejected: fixing leaves' .grad after f returns (the leaves are not known then, and an existing
// .grad would already have refused the write), and hooks registered through the leaf's own hook
// list (the user's tensor hooks: ours are node pre-hooks, removed on exit).
namespace {

class UnwrapGradHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit UnwrapGradHook(int64_t layer_id) : layer_id_(layer_id) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    torch::autograd::variable_list out = grads;
    for (auto& g : out) {
      auto* impl = g.defined() ? maybe_get_impl(g) : nullptr;
      if (impl == nullptr || impl->layer_id() != layer_id_) continue;
      impl->sync_();
      g = impl->value();
    }
    return out;
  }

 private:
  int64_t layer_id_;
};

// The gradient AccumulateGrad stored, when it is a wrapper of this layer: a new .grad is
// stolen through detach(), a view op, which without views lifts even a plain gradient into a
// wrapper (Note [Kernel: views of captured tensors]).
class UnwrapStoredGradHook final : public torch::autograd::FunctionPostHook {
 public:
  UnwrapStoredGradHook(int64_t layer_id, torch::autograd::AccumulateGrad* node)
      : layer_id_(layer_id), node_(node) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    auto& variable = node_->variable;  // the node owns this hook, so it is alive
    if (!variable.defined()) return outputs;
    at::Tensor& grad = variable.mutable_grad();
    auto* impl = grad.defined() ? maybe_get_impl(grad) : nullptr;
    if (impl != nullptr && impl->layer_id() == layer_id_) {
      impl->sync_();
      grad = impl->value();
    }
    return outputs;
  }

 private:
  int64_t layer_id_;
  torch::autograd::AccumulateGrad* node_;
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
      auto pre = std::make_unique<UnwrapGradHook>(layer_id_);
      auto post = std::make_unique<UnwrapStoredGradHook>(layer_id_, acc);
      hooked_.push_back(Hooked{WeakNodePtr(node), pre.get(), post.get()});
      node->add_pre_hook(std::move(pre));
      node->add_post_hook(std::move(post));
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
// the layer exits, under a tracer only. Rejected: un-hiding the Python key while backward nodes
// run (node hooks): an exception between the hooks would leave the TLS changed, and the mode then
// sees autograd's bookkeeping (the detach of every unpacked output) as ops of the program.
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

void note_traced_output(int64_t layer_id, const at::Tensor& value) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || layer->id != layer_id || !layer->autograd) return;
  layer->autograd->note_output(value);
}

void LayerAutograd::note_output(const at::Tensor& value) {
  outputs_[OutputKey{value.grad_fn().get(), static_cast<uint32_t>(value.output_nr())}] = value;
}

std::optional<at::Tensor> LayerAutograd::traced_output(const at::Tensor& t) const {
  if (outputs_.empty()) return std::nullopt;
  const auto& fn = t.grad_fn();
  if (!fn) return std::nullopt;
  auto it = outputs_.find(OutputKey{fn.get(), static_cast<uint32_t>(t.output_nr())});
  if (it == outputs_.end()) return std::nullopt;
  const at::Tensor& original = it->second;
  if (original.unsafeGetTensorImpl() == t.unsafeGetTensorImpl() || !original.has_storage() ||
      !t.has_storage() || !original.is_alias_of(t) || original.dtype() != t.dtype() ||
      original.sym_sizes() != t.sym_sizes() || original.sym_strides() != t.sym_strides() ||
      original.sym_storage_offset() != t.sym_storage_offset()) {
    return std::nullopt;
  }
  return original;
}

std::optional<at::Tensor> traced_saved_output(const at::Tensor& plain) {
  Layer* layer = this_threads_layer();
  if (layer == nullptr || !layer->autograd) return std::nullopt;
  return layer->autograd->traced_output(plain);
}

LayerAutograd::~LayerAutograd() {
  for (const auto& h : hooked_) {
    auto node = h.node.lock();
    if (!node) continue;
    remove_hook(node->pre_hooks(), h.pre);
    remove_hook(node->post_hooks(), h.post);
  }
}

}  // namespace tfz::detail
