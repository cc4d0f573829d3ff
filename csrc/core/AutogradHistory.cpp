// Writes that eager's autograd does not see: the new value keeps the written tensor's gradient
// edge. See Note [Autograd: writes autograd does not see].
#include "core/AutogradHistory.h"

#include "core/Layer.h"
#include "core/Recorder.h"
#include "core/Recording.h"

#include <ATen/Functions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <typeinfo>
#include <unordered_set>
#include <vector>

namespace tfz::detail {

// Note [Autograd: writes autograd does not see]
// Eager:                                  Functionalized:
//   h = w * 2                               h0 = mul(w, 2)                  grad_fn MulBackward
//   with torch.no_grad(): h.clamp_(0)       h1 = clamp(h0, 0), under no_grad, given h0's edge
//   loss = (h * x).sum()                    loss = sum(mul(h1, x))     d loss/d w flows through
//                                                                      h0's MulBackward, as eager
// A write under no_grad, or through an alias autograd does not connect to the tensor (x.detach(),
// x.data), changes the tensor's data and nothing else: eager's in-place kernel writes the memory,
// and the tensor keeps its grad_fn, or stays a leaf that requires grad (an SGD update of a
// parameter). Functionalized, the write makes a new value, computed without history, so the
// tensor would stop requiring grad ("element 0 of tensors does not require grad" at the next
// backward) or, for a write through x.data under grad mode, take the write's own history (wrong
// gradients, silently). So such a new value is given the old value's gradient edge: its grad_fn
// and output number, or, for a leaf, the leaf's own grad accumulator as grad_fn. Later ops record
// that edge, so backward reaches the same nodes eager's would, and gradients of a leaf still
// accumulate into the leaf's .grad. A wrapper whose value has a grad accumulator as grad_fn reads
// as that leaf (Note [Wrapper: autograd mirrored]): is_leaf, requires_grad and .grad as in eager.
// The rule applies where a write is made hidden (FunctionalTensorImpl::replace_ under no_grad),
// where it reaches the base of its aliases (AliasStorage::apply_updates, for a write under no_grad
// or through a chain that holds a detach step; through such a detached alias, a base that
// requires no grad stays so, whatever history of its own the alias has: p = nn.Parameter(w) or
// w.detach().requires_grad_() is a leaf, and an optimizer's update of it must not make w require
// grad),
// and where an input is written back (an input
// whose final value has its own edge is copied under no_grad, so it keeps its grad_fn or stays a
// leaf). Rejected: `old + (new - old).detach()` (one expression with the right gradient, but not
// the right values: inf and NaN do not cancel, and rounding moves the last bit), and a custom
// autograd node passing the gradient through (a node eager does not have: grad_fn reads
// otherwise, and every hidden write adds one to the backward graph).
namespace {
bool same_edge(const torch::autograd::Edge& a, const torch::autograd::Edge& b) {
  return a.function.get() == b.function.get() && a.input_nr == b.input_nr;
}
}  // namespace

bool may_be_tracked(const at::Tensor& value) {
  return calls_may_be_traced() || value.key_set().has_any(c10::python_ks) ||
         value.key_set().has_any(c10::DispatchKeySet(
             {c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper}));
}

at::Tensor with_history_of(const at::Tensor& value, const at::Tensor& old,
                           std::initializer_list<const at::Tensor*> holders, bool views_kept) {
  namespace ag = torch::autograd;
  if (!old.defined() || !value.defined() || !old.requires_grad() || value.is_same(old)) {
    return value;
  }
  ag::Edge edge = ag::impl::gradient_edge(old);
  if (value.requires_grad() && same_edge(ag::impl::gradient_edge(value), edge)) return value;
  bool shared = ag::impl::get_autograd_meta(value) != nullptr;
  for (const at::Tensor* h : holders) shared |= h->defined() && h->is_same(value);
  at::Tensor out = value;
  if (shared) {
    at::AutoGradMode no_grad(false);
    if (!may_be_tracked(value)) {
      out = value.variable_data();
    } else {
      out = views_kept ? at::alias(value) : at::clone(value);
    }
  }
  ag::impl::set_gradient_edge(out, std::move(edge));
  return out;
}

// Note [Graphs: writes autograd does not see]
// A graph has no grad modes and no gradient edges: run under autograd (the tfz torch.compile
// backend runs its graph so; a make_fx or captured graph called with inputs that require grad),
// it recomputes the hidden write's functional op with the op's own derivative, so embedding's
// renorm of its weight under no_grad cut the weight's gradient (the renorm has none), and
// `h.data.clamp_(0)` gave clamp's. Where ops are recorded, the new value of a hidden write is
// therefore tfz::_with_gradient_of(new, old) (kernels/GradientOf.cpp): new's data in a new tensor
// which, when autograd records the call, takes old's gradient edge as the eager engine gives it.
// It is only written where old's gradient reaches a leaf from outside the function (an input, a
// closed-over parameter): a leaf made inside f (nn.Parameter(w), requires_grad_()) is a graph
// value that requires no grad at replay, and its hidden writes (a module's init, an optimizer
// built in f) have no gradient to pass. A graph pass drops the ones whose value is only written
// back into an input (an optimizer's step: the input's own identity is what
// the caller sees, Note [API: epilogue writes of leaves in graphs]), so inference graphs and
// optimizer steps keep no extra copy. Rejected: a view-returning op (no copy, but graphs without
// views may hold none), and recording grad-mode switches in the graph (the functional op would
// still give new a history of its own, not old's).
namespace {
// Whether `old`'s gradient reaches a leaf made outside the layer (an input, a closed-over
// parameter): a graph run under autograd gives old a history only then. A walk of old's backward
// graph; a large one counts as reaching.
bool history_reaches_outside(const at::Tensor& old) {
  namespace ag = torch::autograd;
  const auto& fn = old.grad_fn();
  if (!fn) return !is_leaf_made_inside(old.unsafeGetTensorImpl());
  constexpr size_t kMostNodes = 4096;
  std::vector<ag::Node*> pending{fn.get()};
  std::unordered_set<ag::Node*> seen{fn.get()};
  while (!pending.empty()) {
    ag::Node* node = pending.back();
    pending.pop_back();
    if (typeid(*node) == typeid(ag::AccumulateGrad)) {
      const at::Tensor& leaf = static_cast<ag::AccumulateGrad*>(node)->variable;
      if (!leaf.defined() || !is_leaf_made_inside(leaf.unsafeGetTensorImpl())) return true;
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function && seen.insert(edge.function.get()).second) {
        if (seen.size() > kMostNodes) return true;
        pending.push_back(edge.function.get());
      }
    }
  }
  return false;
}
}  // namespace

at::Tensor with_history_of_hidden_write(const at::Tensor& value, const at::Tensor& old,
                                        std::initializer_list<const at::Tensor*> holders,
                                        bool views_kept) {
  if (!ops_are_recorded() || !old.defined() || !value.defined() || !old.requires_grad() ||
      value.is_same(old) || !history_reaches_outside(old)) {
    return with_history_of(value, old, holders, views_kept);
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tfz::_with_gradient_of", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  // Called in grad mode, so the op's autograd kernel gives the result old's edge now, and a
  // capture records the node as one that runs under autograd (Note [Capture: grad mode]).
  at::AutoGradMode grad_mode(true);
  return op.call(value, old);
}

at::Tensor without_history(const at::Tensor& value, bool views_kept) {
  if (!value.defined() || !value.requires_grad()) return value;
  at::AutoGradMode no_grad(false);
  if (!may_be_tracked(value)) return value.variable_data();
  return views_kept ? at::alias(value) : at::clone(value);
}

at::Tensor restrided_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!src.requires_grad() || !c10::GradMode::is_enabled()) return at::copy(dst, src);
  at::Tensor out;
  {
    at::AutoGradMode no_grad(false);
    out = at::copy(dst, src);
  }
  return with_history_of(out, src, {&dst}, /*views_kept=*/true);
}

at::Tensor leaf_standing_for(const at::Tensor& value) {
  const auto& fn = value.grad_fn();
  if (!fn || typeid(*fn) != typeid(torch::autograd::AccumulateGrad)) return at::Tensor();
  return static_cast<torch::autograd::AccumulateGrad*>(fn.get())->variable;
}

bool has_history_of(const at::Tensor& value, const at::Tensor& original) {
  namespace ag = torch::autograd;
  if (!value.requires_grad() || !original.requires_grad()) return false;
  return same_edge(ag::impl::gradient_edge(value), ag::impl::gradient_edge(original));
}

}  // namespace tfz::detail
