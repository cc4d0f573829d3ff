// The C++ reinplacing pass's rewrites into regions of inputs: an op computed into the region a
// later copy_ writes (out=), and a scatter into an input the program writes region by region.
// See Note [Reinplace: the C++ pass] (core/GraphReinplace.cpp).
#include "core/GraphReinplacer.h"

#include "core/GraphEdit.h"
#include "core/GraphRun.h"
#include "core/MemoryOverlap.h"
#include "core/OpVariants.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>

namespace tfz::detail {

Verdict Reinplacer::region_written_later(int64_t n, int64_t a, int64_t out, int64_t src,
                                         const at::Tensor& w, int64_t& region_copy) const {
  if (shares_memory_with_another_input(identity_[a])) {
    return "rule 5: the input shares memory with another input";
  }
  const Storage s = storage_of(a), fresh = storage_of(out);
  int64_t c = -1, first_write = -1;
  for (int64_t r = n + 1; r < num_nodes_ && c < 0; ++r) {
    if (removed_[r] != 0) continue;
    const GraphNode& node = g_.nodes[r];
    if (first_write < 0 && writes_storage(r, s)) first_write = r;
    if (is_aten_copy_(node.op) && node.args[0].kind == GraphArg::Kind::kValue) {
      const int64_t dest = node.args[0].values[0];
      if (storage_of(dest) == s && env_[dest].dtype() == w.dtype() &&
          same_geometry(env_[dest], w)) {
        c = r;
      }
    }
  }
  if (c < 0) return "rule 5: the program does not write this region of the input";
  for (int64_t r = n + 1; r < num_nodes_; ++r) {
    if (removed_[r] != 0 || is_view_op(g_.nodes[r].op)) continue;
    const GraphNode& node = g_.nodes[r];
    // A copy_'s destination, and a rewritten scatter's base, are written, not read.
    const bool first_is_written = is_aten_copy_(node.op) || !replacement_[r].empty();
    for (size_t k = first_is_written ? 1 : 0; k < node.args.size(); ++k) {
      Verdict why;
      for_each_value(node.args[k], [&](int64_t id) {
        const Storage t = storage_of(id);
        if (t == s && r <= c && spans_and_elements_overlap(env_[id], w)) {
          why = "rule 4: node " + std::to_string(r) + " reads the region's old value";
        } else if (t == fresh && first_write >= 0 && r >= first_write) {
          why = "rule 4: node " + std::to_string(r) +
                " reads the result after the program's writes into the input begin";
        }
      });
      if (why) return why;
    }
  }
  for (int64_t id : members_.at(fresh)) {
    if (read_by_a_kept_node(id, num_nodes_ - 1)) {
      return "rule 4: the result is returned, and would share the input's memory";
    }
  }
  const GraphNode& copy = g_.nodes[c];
  region_copy = copy.args[1].kind == GraphArg::Kind::kValue && copy.args[1].values[0] == src &&
                        first_write == c && !result_read(c)
                    ? c
                    : -1;
  return std::nullopt;
}

Verdict Reinplacer::out_form(int64_t n, const c10::OperatorHandle& out_op, int64_t c) {
  GraphNode& node = g_.nodes[n];
  const int64_t v = node.returns[0].values[0], d = g_.nodes[c].args[0].values[0];
  if (auto why = deterministic_and_not_recorded(node)) return why;
  // Rule 5: d is an input, or views of one with constant arguments.
  std::vector<int64_t> chain;  // d and the views below it, outermost first
  int64_t x = d;
  while (g_.values[x].kind == ValueSource::Kind::kNode) {
    const int64_t k = g_.values[x].index;
    if (k < 0 || k >= num_nodes_ || removed_[k] != 0 || !replacement_[k].empty() ||
        !is_view_of_constants(g_.nodes[k], x)) {
      return "rule 5: the copy_ target is not an input or a view of one";
    }
    const GraphNode& view = g_.nodes[k];
    chain.push_back(x);
    x = view.args[0].values[0];
  }
  if (g_.values[x].kind != ValueSource::Kind::kInput) {
    return "rule 5: the copy_ target is not an input or a view of one";
  }
  if (shares_memory_with_another_input(x)) {
    return "rule 5: the input shares memory with another input";
  }
  // Rule 2.
  const at::Tensor &td = env_[d], &tv = env_[v];
  const Storage s = storage_of(d), fresh = storage_of(v);
  if (!td.defined() || !tv.defined() || s == nullptr || fresh == nullptr || fresh == s ||
      tv.dtype() != td.dtype() || tv.sizes() != td.sizes() || !devices_[d] ||
      devices_[d] != devices_[v] || may_self_overlap(td.sizes(), td.strides())) {
    return "rule 2: the result differs from the copy_ target in dtype, sizes or device, or the "
           "target addresses an element twice";
  }
  if (tv.strides() != td.strides() && (members_.at(fresh).size() != 1 || readers_[v].size() != 1)) {
    return "rule 2: the result's strides differ from the copy_ target's, and a reader depends "
           "on them";
  }
  // Rule 3: a pointwise op may read exactly the region it writes, each element before writing
  // it; eager's out= kernels refuse any other overlap.
  const bool pointwise = node.op.hasTag(at::Tag::pointwise);
  auto touches_target = [&](int64_t id) {
    return storage_of(id) == s && spans_and_elements_overlap(env_[id], td);
  };
  bool overlaps = false;
  for (const auto& arg : node.args) {
    for_each_value(arg, [&](int64_t id) {
      overlaps |= touches_target(id) &&
                  !(pointwise && env_[id].dtype() == td.dtype() && same_geometry(env_[id], td));
    });
  }
  if (overlaps) return "rule 3: an operand overlaps the written region";
  // Rule 4: between the op and the copy_, nothing touches the region (a view made there reads
  // no bytes); the result is not returned (it would share the input's memory) nor read after
  // the copy_ (later writes of the input would change it).
  for (int64_t r = n + 1; r < c; ++r) {
    if (removed_[r] != 0 || is_view_op(g_.nodes[r].op)) continue;
    bool touches = false;
    for (const auto& arg : g_.nodes[r].args) {
      for_each_value(arg, [&](int64_t id) { touches |= touches_target(id); });
    }
    if (touches) {
      return "rule 4: node " + std::to_string(r) + " reads or writes the region before the copy_";
    }
  }
  for (int64_t id : members_.at(fresh)) {
    if (read_by_a_kept_node(id, c)) {
      return "rule 4: the result is read after the copy_, or returned";
    }
  }
  // The target, made again before the op where the program makes it later (the epilogue's
  // views of an input come after the ops whose values they take).
  int64_t target = x;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (defined_at_[*it] < n) {
      target = *it;
      continue;
    }
    GraphNode view = g_.nodes[g_.values[*it].index];
    view.args[0] = value_arg(target);
    target = add_value(env_[*it], devices_[*it], n);
    view.returns = {value_arg(target)};
    before_[n].push_back(std::move(view));
  }
  node.op = out_op;
  node.args.push_back(value_arg(target));
  readers_[x].push_back(n);
  merge(fresh, s);
  if (chain.empty()) identity_[v] = identity_[x];
  if (!result_read(c)) remove_copy(c);
  decisions_[n] = {n, names_[n], true,
                   "out= as " + op_name(out_op) + " into the copy_'s target" +
                       (removed_[c] != 0 ? "; the copy_ removed" : "")};
  done_[n] = 1;
  return std::nullopt;
}

bool Reinplacer::is_view_of_constants(const GraphNode& node, int64_t x) {
  if (!is_view_op(node.op) || node.args.empty() || node.args[0].kind != GraphArg::Kind::kValue ||
      node.args[0].values[0] < 0 || node.returns.size() != 1 ||
      node.returns[0].kind != GraphArg::Kind::kValue || node.returns[0].values[0] != x) {
    return false;
  }
  return std::all_of(node.args.begin() + 1, node.args.end(),
                     [](const GraphArg& a) { return a.kind == GraphArg::Kind::kConstant; });
}

int64_t Reinplacer::add_value(at::Tensor meta, std::optional<at::Device> device, int64_t n) {
  const int64_t id = new_node_value(g_);
  // The tables follow the graph's values, including those a scatter's rewrite added unrecorded.
  for (auto k = static_cast<int64_t>(identity_.size()); k <= id; ++k) identity_.push_back(k);
  env_.resize(id + 1);
  devices_.resize(id + 1);
  defined_at_.resize(id + 1, -1);
  readers_.resize(id + 1);
  env_[id] = std::move(meta);
  devices_[id] = device;
  defined_at_[id] = n;
  readers_[id] = {n};
  if (const Storage s = storage_of(id)) members_[s].push_back(id);
  return id;
}

}  // namespace tfz::detail
