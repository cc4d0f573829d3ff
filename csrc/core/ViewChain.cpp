// ViewChain: persistent list of view steps. See Note [Alias: persistent view chains].
#include "core/ViewChain.h"

namespace tfz::detail {

ViewChain::Node::~Node() {
  // Free the ancestors this node alone keeps alive one by one instead of recursively.
  std::shared_ptr<const Node> next = std::move(parent);
  while (next && next.use_count() == 1) {
    std::shared_ptr<const Node> grand = std::move(next->parent);
    next = std::move(grand);
  }
}

ViewChain ViewChain::extended(std::shared_ptr<const ViewMeta> step) const {
  static const auto detach = c10::Dispatcher::singleton().findSchemaOrThrow("aten::detach", "");
  const bool cuts = cuts_history() || step->op == detach;
  ViewChain result;
  result.tail_ = std::make_shared<const Node>(std::move(step), tail_, size() + 1, cuts);
  return result;
}

std::vector<const ViewMeta*> ViewChain::steps() const {
  std::vector<const ViewMeta*> out(size());
  size_t i = out.size();
  for (const Node* n = tail_.get(); n != nullptr; n = n->parent.get()) out[--i] = n->step.get();
  return out;
}

std::pair<bool, bool> ViewChain::bit_flips() const {
  static const c10::OperatorName conj{"aten::_conj", ""}, neg{"aten::_neg_view", ""};
  bool conj_flip = false, neg_flip = false;
  for (const Node* n = tail_.get(); n != nullptr; n = n->parent.get()) {
    const auto& name = n->step->op.operator_name();
    conj_flip ^= name == conj;
    neg_flip ^= name == neg;
  }
  return {conj_flip, neg_flip};
}

bool ViewChain::starts_with(const ViewChain& prefix) const {
  if (prefix.size() > size()) return false;
  const Node* a = tail_.get();
  while (a != nullptr && a->depth > prefix.size()) a = a->parent.get();
  for (const Node* b = prefix.tail_.get(); a != nullptr; a = a->parent.get(), b = b->parent.get()) {
    if (a == b) return true;  // shared from here down
    if (a->step != b->step) return false;
  }
  return true;  // both empty
}

}  // namespace tfz::detail
