// The C++ reinplacing pass's scatter rewrite: `X_scatter(a, src, args...)` becomes a copy_ of
// src through the view X of a, and the node that made src writes that view itself where it can.
// See Note [Reinplace: the C++ pass] (core/GraphReinplace.cpp); the rules it checks live there.
#include "core/GraphReinplacer.h"

#include "core/GraphEdit.h"
#include "core/GraphRun.h"
#include "core/MemoryOverlap.h"
#include "core/OpVariants.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace tfz::detail {

Verdict Reinplacer::scatter(int64_t n, const ScatterView& sv) {
  const GraphNode& node = g_.nodes[n];
  if (node.args.size() < 2 || node.args[0].kind != GraphArg::Kind::kValue ||
      node.args[1].kind != GraphArg::Kind::kValue || node.args[0].values[0] < 0 ||
      node.args[1].values[0] < 0) {
    return "rule 2: its base or source is not a tensor";
  }
  for (size_t k = 2; k < node.args.size(); ++k) {
    if (node.args[k].kind != GraphArg::Kind::kConstant) {
      return "rule 2: the view it writes through has a tensor argument";
    }
  }
  const int64_t a = node.args[0].values[0], src = node.args[1].values[0];
  const int64_t out = node.returns[0].values[0];
  if (auto why = deterministic_and_not_recorded(node)) return why;
  if (auto why = laid_out_as(a, out)) return why;
  if (storage_of(src) == storage_of(a)) return "rule 3: the source lies in the written storage";
  auto& d = c10::Dispatcher::singleton();
  GraphNode view{d.findSchemaOrThrow(sv.view, sv.view_overload), {value_arg(a)}, {}};
  view.args.insert(view.args.end(), node.args.begin() + 2, node.args.end());
  const at::Tensor w = meta_result(view);
  int64_t copy_back = -1, region_copy = -1;
  const int64_t x = identity_[a];
  if (outside_.count(storage_of(a)) != 0 && g_.values[x].kind == ValueSource::Kind::kInput &&
      later_copy(n, x, /*as_target=*/true) < 0) {
    // The program may write this input region by region.
    if (auto why = region_written_later(n, a, out, src, w, region_copy)) return why;
  } else if (auto why = dead_after(n, a, out, copy_back)) {
    return why;
  }
  const int64_t folded = source_to_fold(n, src, region_copy, w);
  const int64_t view_id = new_node_value(g_);
  view.returns.push_back(value_arg(view_id));
  view.grad_enabled = node.grad_enabled;
  GraphArg non_blocking;
  non_blocking.constant = false;
  GraphNode copy{d.findSchemaOrThrow("aten::copy_", ""),
                 {value_arg(view_id), value_arg(src), non_blocking},
                 {value_arg(new_node_value(g_))}};
  copy.grad_enabled = node.grad_enabled;
  std::string done =
      std::string("scatter in place: the source copied through ") + sv.view +
      (std::string(sv.view_overload).empty() ? "" : "." + std::string(sv.view_overload));
  if (folded >= 0) {
    // See Note [Reinplace: a region assignment writes its value directly].
    const GraphNode& c = g_.nodes[folded];
    if (is_functional_copy(c.op)) {  // y itself through the view, with copy's non_blocking
      copy.args[1] = c.args[1];
      if (c.args.size() > 2) copy.args[2] = c.args[2];
    } else {  // the op computes into the view
      copy = c;
      copy.op = *out_variant(c.op);
      copy.args.push_back(value_arg(view_id));
      copy.returns = {value_arg(new_node_value(g_))};
    }
    for (const auto& arg : copy.args) {
      for_each_value(arg, [&](int64_t id) {
        if (id < static_cast<int64_t>(readers_.size())) {
          readers_[id].insert(std::upper_bound(readers_[id].begin(), readers_[id].end(), n), n);
        }
      });
    }
    done += " (" + names_[folded] + " of its source folded in)";
  }
  replacement_[n] = {std::move(view), std::move(copy)};
  rename_[out] = a;
  commit(n, a, out, copy_back, done);
  if (region_copy >= 0) {
    remove_copy(region_copy);
    decisions_[n].rule += "; the epilogue's copy_ of the region removed";
  }
  if (folded >= 0) {
    removed_[folded] = 1;
    decisions_[folded] = {folded, names_[folded], true,
                          "folded: it writes the view of node " + std::to_string(n) + " directly"};
  }
  return std::nullopt;
}

// Note [Reinplace: a region assignment writes its value directly]
// `x[i] = y` records `s = copy(x[i], y)` (y broadcast to x[i]'s shape and dtype) and then a
// scatter of s into x; `x[i].mul_(2)` records `s = mul(x[i], 2)` and the same scatter. ATen's
// functional copy clones the whole storage of a view that is not dense (to keep its strides): a
// column assignment into a 128 MiB tensor copied 128 MiB. Once the scatter writes through its
// view, the node that made s can write the view itself instead: copy's y goes through the view
// (copy_ broadcasts and casts as copy does), another op computes into it with its out= form
// (mul.out(x[i], 2, out=x[i]): an in-place mul). That op then runs at the scatter, so this holds
// when s has the view's sizes and dtype, s is read by nothing but the scatter (and the region's
// epilogue copy_, removed with it), the op is deterministic and not recorded by autograd, its
// operands do not overlap the view (a pointwise op may read exactly the view; copy's y lies
// outside the written storage), and nothing writes their storages between the op and the
// scatter. Rejected: rewriting copy itself (into an expand and a clone: still a temporary of the
// region's size).
bool Reinplacer::is_functional_copy(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.name == "aten::copy" && name.overload_name.empty();
}

int64_t Reinplacer::source_to_fold(int64_t n, int64_t src, int64_t region_copy,
                                   const at::Tensor& w) const {
  const ValueSource& source = g_.values[src];
  if (source.kind != ValueSource::Kind::kNode || source.index < 0 || source.index >= n) return -1;
  const int64_t k = source.index;
  const GraphNode& c = g_.nodes[k];
  if (removed_[k] != 0 || done_[k] != 0 || !replacement_[k].empty() || c.returns.size() != 1 ||
      c.returns[0].kind != GraphArg::Kind::kValue || !env_[src].defined() ||
      env_[src].sizes() != w.sizes() || env_[src].dtype() != w.dtype() ||
      members_.at(storage_of(src)).size() != 1) {
    return -1;
  }
  for (int64_t r : readers_[src]) {
    if (r != n && r != region_copy && (r == num_nodes_ || removed_[r] == 0)) return -1;
  }
  const Storage s = storage_of(g_.nodes[n].args[0].values[0]);
  std::vector<Storage> read;  // the storages of the operands the write will read
  if (is_functional_copy(c.op)) {
    if (c.args.size() < 2 || c.args[1].kind != GraphArg::Kind::kValue || c.args[1].values[0] < 0 ||
        (c.args.size() > 2 && c.args[2].kind != GraphArg::Kind::kConstant)) {
      return -1;
    }
    const Storage ys = storage_of(c.args[1].values[0]);
    if (ys == nullptr || ys == s) return -1;
    read.push_back(ys);
  } else {
    if (!out_variant(c.op) || deterministic_and_not_recorded(c)) return -1;
    const bool pointwise = c.op.hasTag(at::Tag::pointwise);
    bool overlaps = false;
    for (const auto& arg : c.args) {
      for_each_value(arg, [&](int64_t id) {
        const Storage t = storage_of(id);
        if (t == nullptr) return;
        read.push_back(t);
        overlaps |= t == s && spans_and_elements_overlap(env_[id], w) &&
                    !(pointwise && env_[id].dtype() == w.dtype() && same_geometry(env_[id], w));
      });
    }
    if (overlaps) return -1;
  }
  for (int64_t r = k + 1; r < n; ++r) {
    if (removed_[r] != 0) continue;
    for (Storage t : read) {
      if (writes_storage(r, t)) return -1;
    }
  }
  return k;
}

}  // namespace tfz::detail
