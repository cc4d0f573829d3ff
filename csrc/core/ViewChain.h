// ViewChain: the view steps from a wrapper's base to the wrapper, as a persistent list. Taking a
// view extends its input's chain in O(1), sharing the prefix; replaying reads the steps in order.
// See Note [Alias: persistent view chains].
#pragma once

#include "core/ViewMeta.h"

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace tfz::detail {

// Note [Alias: persistent view chains]
// Every view wrapper knows the steps from its base (to regenerate itself, and to invert a write).
// Stored as a vector copied into each new view, a chain of D views cost O(D^2) time and memory to
// build (scale/depth/1000 ran 11x eager, slope 1.4). Here a chain is a pointer to its last node,
// each node holding one step and its parent: extending is O(1) and shares the prefix, size() is
// stored, and the O(D) readers (replay, inversion) already pay O(D). Nodes are freed iteratively,
// so a chain of any depth cannot overflow the stack when it dies.
// Rejected: a vector shared copy-on-write (still O(D) per view when two views of one view differ)
// and a std::list (no sharing).
class ViewChain {
 public:
  ViewChain() = default;
  /// The chain of these steps, first to last.
  ViewChain(std::initializer_list<std::shared_ptr<const ViewMeta>> steps) {
    for (const auto& s : steps) push_back(s);
  }

  bool empty() const { return tail_ == nullptr; }
  /// The last step (nullptr for an empty chain). O(1).
  const ViewMeta* back() const { return tail_ ? tail_->step.get() : nullptr; }
  size_t size() const { return tail_ ? tail_->depth : 0; }
  void clear() { tail_.reset(); }
  /// This chain followed by `step` (this one is unchanged).
  ViewChain extended(std::shared_ptr<const ViewMeta> step) const;
  void push_back(std::shared_ptr<const ViewMeta> step) { *this = extended(std::move(step)); }
  /// The steps, first (applied to the base) to last. O(size()).
  std::vector<const ViewMeta*> steps() const;
  /// Whether the chain's _conj and _neg_view steps flip the conjugate and the negative bit (an
  /// odd number of each): without views the values carry no bit, the chain does. O(size()).
  std::pair<bool, bool> bit_flips() const;
  /// Whether a step of the chain is a detach: writes through it are hidden from autograd at the
  /// base (Note [Autograd: writes autograd does not see]). O(1).
  bool cuts_history() const { return tail_ != nullptr && tail_->cuts_history; }
  /// Whether `prefix` is this chain's beginning: the same step objects at its first positions.
  bool starts_with(const ViewChain& prefix) const;

 private:
  struct Node {
    Node(std::shared_ptr<const ViewMeta> s, std::shared_ptr<const Node> p, size_t d, bool cuts)
        : step(std::move(s)), parent(std::move(p)), depth(d), cuts_history(cuts) {}
    ~Node();
    std::shared_ptr<const ViewMeta> step;
    mutable std::shared_ptr<const Node> parent;  // mutable: unlinked iteratively on destruction
    size_t depth;
    bool cuts_history;  // this step or an earlier one is a detach
  };
  std::shared_ptr<const Node> tail_;
};

}  // namespace tfz::detail
