// The C++ reinplacing pass over a recorded graph: a meta-tensor run gives each value its storage,
// then each functional op with an in-place twin, each scatter and each op whose result a copy_
// writes into an input is checked against the rules below and rewritten (scatters in
// core/GraphReinplaceScatter.cpp, regions of inputs in core/GraphReinplaceRegions.cpp). See
// core/GraphReinplace.h.
#include "core/GraphReinplace.h"

#include "core/GraphReinplacer.h"

#include "core/GraphEdit.h"
#include "core/GraphMetaRun.h"
#include "core/GraphPasses.h"
#include "core/GraphRun.h"
#include "core/MemoryOverlap.h"
#include "core/OpSchemaInfo.h"
#include "core/OpVariants.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace tfz::detail {

// Note [Reinplace: the C++ pass]
// tfz::reinplace(graph) gives C++ programs what reinplace(gm) gives Python ones, with three
// rewrites, tried on each node in graph order (and again until nothing changes: a rewrite can
// free the buffer an earlier candidate needed):
//   in place  `out = op(a, ...)` becomes `op_(a, ...)`, writing a's storage S; out is then a
//             (`outs = _foreach_op(as, ...)` becomes `_foreach_op_(as, ...)` when every element
//             passes the rules below, the elements' storages being distinct: all or none, as
//             the in-place list op writes all of them);
//   scatter   `out = X_scatter(a, src, args...)` (X: slice, select, diagonal) becomes
//             `copy_(X(a, args...), src)`, writing the view it names in S; out is then a;
//   out=      `v = op(...)` whose value a later `copy_(d, v)` writes into an input's region d
//             becomes `op.out(..., out=d)` (d made again before the op where the program makes
//             it later), and the copy_, now of d onto itself, goes.
// The in-place and scatter rewrites hold when
//   1. the op draws no random numbers (a random op's in-place form may draw differently), and
//      autograd records nothing (the node ran with grad mode off, or no input of the graph
//      requires grad: an in-place write could change a tensor saved for backward);
//   2. out has a's dtype, sizes, strides and device, a addresses each element once, and out is
//      a fresh allocation;
//   3. no other operand of the node lies in S (stricter than the Python pass, which lets a
//      pointwise op read exactly the region it writes; for a scatter: src);
//   4. no later node, and no output, reads a value of S defined before the node (S's old
//      bytes); reads of out and of views made from it later read the new bytes, as they would;
//   5. S is not a constant's storage, nor an input's unless the program wrote that input with
//      out: its epilogue holds `copy_(x, out)` for an input x that is a itself and shares memory
//      with no other input; then out is computed into x, nothing else reads x's old bytes after
//      the node, neither out nor a view of it is returned (the caller would see an output share
//      the input's memory where eager's may not), and the copy_, now of x onto itself, is
//      removed.
//      A scatter into an input x whose epilogue writes x region by region
//      (Note [Capture: region-precise epilogue]) needs instead a later copy_ of exactly its
//      region W (the program's own write of W: x ends the same), no read of W's old bytes
//      before that copy_, and no read of out (now x) once the program's writes into x begin;
//      that copy_, of src into W with nothing written between, is then redundant and removed.
// The out= rewrite holds under rule 1 and when
//   2'. v has d's dtype, sizes and device, and its strides, or no reader but the copy_ (which
//       reads values, not layouts); d addresses each element once; v is a fresh allocation;
//   3'. no operand of the op overlaps the bytes of d, except, for a pointwise op, an operand that
//       is exactly d (each element is read before it is written);
//   4'. between the op and the copy_, no node reads or writes those bytes (a view made there
//       reads none), and v is neither returned nor read after the copy_ (it would then share
//       the input's memory, or see the input's later writes);
//   5'. d is an input, or a chain of views of one with constant arguments, and that input shares
//       memory with no other input: the copy_ is the program's own write of that region, which
//       now happens at the op instead.
// Regions there are exact element sets (core/MemoryOverlap.h; conservative above 2^20 elements).
// Storages, geometry and devices come from one run of the graph on meta tensors
// (Note [Reinplace: storages from a meta run]). After a rewrite, out's storage is S for the
// decisions that follow. A graph the meta run cannot execute (an op without a meta kernel, a
// value read into a guard) is left as it is, and says why. A views-removed graph gains view
// ops where it is rewritten (the scatter's view, the out= target), as the Python pass's does:
// the rewritten graph is for running, not for a backend that takes no views. Rejected: calling
// the Python pass (a LibTorch program has no Python), and porting its exact-region analysis
// (the storage-level rules catch the KV-cache, slice-fill and whole-input updates C++ programs
// make): the rules here are a subset of its rules, which the tests check decision by decision
// (or, where the two passes take different paths to the same result, against eager alone).
std::vector<ReinplaceDecision> Reinplacer::run() {
  std::string why;
  if (!analyse(why)) return {{-1, failed_op_, false, why}};
  // A rewrite can free a buffer an earlier candidate needed (once `copy(x, v)` writes x in
  // place, `v = mm(...)` can compute into x): sweep until nothing changes.
  for (int sweep = 0; sweep < 8; ++sweep) {
    bool changed = false;
    for (int64_t n = 0; n < num_nodes_; ++n) {
      if (done_[n] == 0 && removed_[n] == 0) changed |= try_node(n);
    }
    if (!changed) break;
  }
  rebuild();
  std::vector<ReinplaceDecision> report;
  for (auto& [n, d] : decisions_) report.push_back(std::move(d));
  return report;
}

bool Reinplacer::analyse(std::string& why) {
  std::string failed;
  auto run = run_on_meta_tensors(g_, why, failed);
  if (!run) {
    failed_op_ = failed;
    return false;
  }
  env_ = std::move(run->values);
  devices_ = std::move(run->devices);
  const size_t num_values = g_.values.size();
  defined_at_.assign(num_values, -1);
  readers_.assign(num_values, {});
  identity_.resize(num_values);
  for (size_t id = 0; id < num_values; ++id) {
    identity_[id] = static_cast<int64_t>(id);
    const Storage s = storage_of(static_cast<int64_t>(id));
    if (s == nullptr) continue;
    members_[s].push_back(static_cast<int64_t>(id));
    if (g_.values[id].kind != ValueSource::Kind::kNode) outside_.insert(s);
  }
  for (int64_t n = 0; n < num_nodes_; ++n) {
    const GraphNode& node = g_.nodes[n];
    for (const auto& r : node.returns) for_each_value(r, [&](int64_t id) { defined_at_[id] = n; });
    for (const auto& arg : node.args) {
      for_each_value(arg, [&](int64_t id) { readers_[id].push_back(n); });
    }
  }
  for (const auto& o : g_.outputs) {
    for_each_value(o, [&](int64_t id) { readers_[id].push_back(num_nodes_); });
  }
  removed_.assign(num_nodes_, 0);
  done_.assign(num_nodes_, 0);
  for (const auto& node : g_.nodes) names_.push_back(op_name(node.op));
  replacement_.resize(num_nodes_);
  before_.resize(num_nodes_);
  for (const auto& guard : g_.input_guards) any_requires_grad_ |= guard.requires_grad;
  for (const auto& c : g_.constants) any_requires_grad_ |= c.defined() && c.requires_grad();
  return true;
}

Storage Reinplacer::storage_of(int64_t id) const {
  const at::Tensor& t = env_[id];
  if (!t.defined() || !t.unsafeGetTensorImpl()->has_storage()) return nullptr;
  Storage s = t.storage().unsafeGetStorageImpl();
  for (auto it = moved_.find(s); it != moved_.end(); it = moved_.find(s)) s = it->second;
  return s;
}

bool Reinplacer::read_by_a_kept_node(int64_t id, int64_t after, int64_t except) const {
  return std::any_of(readers_[id].begin(), readers_[id].end(), [&](int64_t r) {
    return r > after && r != except && (r == num_nodes_ || removed_[r] == 0);
  });
}

bool Reinplacer::old_bytes_read(Storage s, int64_t n, int64_t except) const {
  for (int64_t id : members_.at(s)) {
    if (defined_at_[id] < n && read_by_a_kept_node(id, n, except)) return true;
  }
  return false;
}

int64_t Reinplacer::later_copy(int64_t n, int64_t id, bool as_target) const {
  for (int64_t r : readers_[id]) {
    if (r <= n || r == num_nodes_ || removed_[r] != 0) continue;
    const GraphNode& c = g_.nodes[r];
    if (!is_aten_copy_(c.op) || c.args[0].kind != GraphArg::Kind::kValue ||
        c.args[1].kind != GraphArg::Kind::kValue) {
      continue;
    }
    const int64_t target = c.args[0].values[0], src = c.args[1].values[0];
    if (as_target ? target == id && src >= 0 : src == id && target != id) return r;
  }
  return -1;
}

bool Reinplacer::shares_memory_with_another_input(int64_t x) const {
  for (size_t i = 0; i < g_.inputs.size(); ++i) {
    if (g_.inputs[i] != x) continue;
    for (size_t j = 0; j < g_.inputs.size(); ++j) {
      if (j != i && g_.input_guards[j].defined &&
          g_.input_guards[j].alias_group == g_.input_guards[i].alias_group) {
        return true;
      }
    }
  }
  return false;
}

bool Reinplacer::try_node(int64_t n) {
  const GraphNode& node = g_.nodes[n];
  if (node.returns.size() == 1 && node.returns[0].kind == GraphArg::Kind::kValueList) {
    const auto twin = in_place_twin(node.op);
    if (!twin || node.args.empty() || node.args[0].kind != GraphArg::Kind::kValueList) return false;
    Verdict refused = in_place_each(n, *twin);
    if (refused) decisions_[n] = {n, names_[n], false, *refused};
    return !refused;
  }
  if (node.returns.size() != 1 || node.returns[0].kind != GraphArg::Kind::kValue) return false;
  Verdict refused;
  if (const ScatterView* sv = scatter_view_of(node.op);
      sv != nullptr && std::string(sv->scatter) != "aten::as_strided_scatter") {
    // as_strided_scatter is left functional: its geometry is relative to its fresh result.
    refused = scatter(n, *sv);
  } else {
    bool candidate = false;
    if (const auto twin = in_place_twin(node.op);
        twin && node.args[0].kind == GraphArg::Kind::kValue && node.args[0].values[0] >= 0) {
      candidate = true;
      refused = in_place(n, *twin);
      if (!refused) return true;
    }
    const int64_t v = node.returns[0].values[0];
    if (const auto out_op = out_variant(node.op)) {
      if (const int64_t c = later_copy(n, v, /*as_target=*/false); c >= 0) {
        candidate = true;
        refused = out_form(n, *out_op, c);  // the out= form's reason, as the Python pass's
      }
    }
    if (!candidate) return false;
  }
  if (!refused) return true;
  decisions_[n] = {n, names_[n], false, *refused};
  return false;
}

Verdict Reinplacer::deterministic_and_not_recorded(const GraphNode& node) const {
  if (node.op.hasTag(at::Tag::nondeterministic_seeded)) return "rule 1: a random op";
  // A node recorded in the graph's starting grad mode replays in the caller's, which may be on
  // (Note [Capture: grad mode]).
  if (any_requires_grad_ && (node.grad_enabled || node.grad_enabled == g_.grad_enabled)) {
    return "rule 1: autograd may record it (an input requires grad, and the node may run with "
           "grad mode on)";
  }
  return std::nullopt;
}

Verdict Reinplacer::laid_out_as(int64_t a, int64_t out) const {
  const at::Tensor &ta = env_[a], &tout = env_[out];
  const Storage s = storage_of(a);
  if (!ta.defined() || !tout.defined() || s == nullptr || ta.dtype() != tout.dtype() ||
      ta.sizes() != tout.sizes() || ta.strides() != tout.strides() || !devices_[a] ||
      devices_[a] != devices_[out] || !ta.is_non_overlapping_and_dense() || storage_of(out) == s) {
    return "rule 2: the result differs from its first argument in dtype, geometry or device, "
           "or that argument addresses an element twice";
  }
  return std::nullopt;
}

Verdict Reinplacer::dead_after(int64_t n, int64_t a, int64_t out, int64_t& copy_back) const {
  const Storage s = storage_of(a);
  copy_back = -1;
  if (outside_.count(s) != 0) {
    const int64_t x = identity_[a];
    if (g_.values[x].kind != ValueSource::Kind::kInput) {
      return "rule 5: the written storage is a constant's or a view of an input's";
    }
    copy_back = later_copy(n, x, /*as_target=*/true);
    if (copy_back < 0) return "rule 5: the program does not write this input";
    if (shares_memory_with_another_input(x)) {
      return "rule 5: the input shares memory with another input";
    }
    // The epilogue then copies v over x whole. Unless v is out itself, out's bytes are gone
    // after it: nothing may read them there (an output included), and v may not be one of them.
    const int64_t v = g_.nodes[copy_back].args[1].values[0];
    if (identity_[v] != out) {
      const auto& in_fresh = members_.at(storage_of(out));
      const bool read_after = std::any_of(in_fresh.begin(), in_fresh.end(), [&](int64_t id) {
        return id == v || std::any_of(readers_[id].begin(), readers_[id].end(),
                                      [&](int64_t r) { return r > copy_back; });
      });
      if (read_after || storage_of(v) == s) {
        return "rule 4: the result is read after the epilogue overwrites the input";
      }
    } else {
      // Neither out nor a view of it may be returned: the output would then share the input's
      // memory where eager's does not (x.copy_(v); return v.expand(...)).
      auto is_returned = [&](int64_t id) {
        return std::find(readers_[id].begin(), readers_[id].end(), num_nodes_) !=
               readers_[id].end();
      };
      const auto& in_fresh = members_.at(storage_of(out));
      const bool returned =
          is_returned(v) || std::any_of(in_fresh.begin(), in_fresh.end(), is_returned);
      if (returned) {
        return "rule 4: the result, or a view of it, is returned, and would share the input's "
               "memory";
      }
    }
  }
  if (old_bytes_read(s, n, copy_back)) {
    return "rule 4: the old value is read afterwards (a later op or an output)";
  }
  // The result's buffer becomes a's: a later write into it (an earlier rewrite made one, such as
  // a foreach written in place on the result) would change a's memory under readers that expect
  // a's value.
  const Storage fresh = storage_of(out);
  if (fresh != nullptr && fresh != s) {
    for (int64_t r = n + 1; r < num_nodes_; ++r) {
      if (removed_[r] == 0 && r != copy_back && writes_storage(r, fresh)) {
        return "rule 4: node " + std::to_string(r) + " writes the result's buffer later";
      }
    }
  }
  return std::nullopt;
}

void Reinplacer::commit(int64_t n, int64_t a, int64_t out, int64_t copy_back, std::string done) {
  const Storage s = storage_of(a), fresh = storage_of(out);
  identity_[out] = identity_[a];
  merge(fresh, s);
  if (copy_back >= 0) {
    // Where the epilogue copies out itself, it now copies the input onto itself: removed,
    // unless its result is read.
    const GraphNode& c = g_.nodes[copy_back];
    const bool copy_read = identity_[c.args[1].values[0]] != identity_[a] || result_read(copy_back);
    if (!copy_read) remove_copy(copy_back);
    done += std::string(" into the input the program writes") +
            (copy_read ? "" : "; its epilogue copy_ removed");
  }
  decisions_[n] = {n, names_[n], true, std::move(done)};
  done_[n] = 1;
}

void Reinplacer::merge(Storage fresh, Storage s) {
  if (fresh == s) return;
  auto& joined = members_[fresh];
  auto& into = members_[s];
  into.insert(into.end(), joined.begin(), joined.end());
  joined.clear();
  moved_[fresh] = s;
}

bool Reinplacer::result_read(int64_t n) const {
  bool read = false;
  for (const auto& r : g_.nodes[n].returns) {
    for_each_value(r, [&](int64_t id) { read |= read_by_a_kept_node(id, n); });
  }
  return read;
}

void Reinplacer::remove_copy(int64_t c) {
  removed_[c] = 1;
  decisions_[c] = {c, names_[c], true, "removed: it copies a value onto itself, already in place"};
}

Verdict Reinplacer::in_place(int64_t n, const c10::OperatorHandle& twin) {
  GraphNode& node = g_.nodes[n];
  const int64_t a = node.args[0].values[0], out = node.returns[0].values[0];
  if (auto why = deterministic_and_not_recorded(node)) return why;
  if (auto why = laid_out_as(a, out)) return why;
  const Storage s = storage_of(a);
  bool overlaps = false;
  for (size_t k = 1; k < node.args.size(); ++k) {
    for_each_value(node.args[k], [&](int64_t id) { overlaps |= storage_of(id) == s; });
  }
  if (overlaps) return "rule 3: another operand lies in the written storage";
  int64_t copy_back = -1;
  if (auto why = dead_after(n, a, out, copy_back)) return why;
  node.op = twin;
  commit(n, a, out, copy_back, "in place as " + op_name(twin));
  return std::nullopt;
}

Verdict Reinplacer::in_place_each(int64_t n, const c10::OperatorHandle& twin) {
  GraphNode& node = g_.nodes[n];
  const std::vector<int64_t> selves = node.args[0].values, outs = node.returns[0].values;
  if (selves.size() != outs.size() ||
      std::any_of(selves.begin(), selves.end(), [](int64_t id) { return id < 0; })) {
    return "rule 2: the result is not one tensor per written tensor";
  }
  if (auto why = deterministic_and_not_recorded(node)) return why;
  const auto element = [](size_t k, const std::string& why) {
    return why + " (element " + std::to_string(k) + ")";
  };
  std::unordered_set<Storage> written;
  for (size_t k = 0; k < selves.size(); ++k) {
    if (auto why = laid_out_as(selves[k], outs[k])) return element(k, *why);
    written.insert(storage_of(selves[k]));
  }
  if (written.size() != selves.size()) {
    return "rule 3: two written tensors share a storage";
  }
  bool overlaps = false;
  for (size_t k = 1; k < node.args.size(); ++k) {
    for_each_value(node.args[k],
                   [&](int64_t id) { overlaps |= written.count(storage_of(id)) != 0; });
  }
  if (overlaps) return "rule 3: another operand lies in a written storage";
  // Rules 4 and 5 per element, each on its own storage: the checks of one element do not read
  // what committing another changes, so all are checked before any is committed.
  std::vector<int64_t> copy_backs(selves.size(), -1);
  for (size_t k = 0; k < selves.size(); ++k) {
    if (auto why = dead_after(n, selves[k], outs[k], copy_backs[k])) return element(k, *why);
  }
  // The twin returns nothing: each result is its written tensor from here on.
  node.op = twin;
  node.returns.clear();
  int64_t into_inputs = 0;
  for (size_t k = 0; k < selves.size(); ++k) {
    rename_[outs[k]] = selves[k];
    commit(n, selves[k], outs[k], copy_backs[k], "");
    into_inputs += copy_backs[k] >= 0 ? 1 : 0;
  }
  std::string done = "in place as " + op_name(twin);
  if (into_inputs > 0) {
    done += ", " + std::to_string(into_inputs) + " of its " + std::to_string(selves.size()) +
            " tensors into inputs the program writes";
  }
  decisions_[n] = {n, names_[n], true, std::move(done)};
  return std::nullopt;
}

at::Tensor Reinplacer::meta_result(const GraphNode& node) const {
  torch::jit::Stack stack;
  push_node_args(node, env_, stack);
  node.op.callBoxed(stack);
  return stack[0].toTensor();
}

bool Reinplacer::writes_storage(int64_t r, Storage s) const {
  const GraphNode& node = g_.nodes[r];
  if (!replacement_[r].empty()) return storage_of(node.args[0].values[0]) == s;  // a scatter's
  const auto& schema_args = node.op.schema().arguments();
  bool writes = false;
  for (size_t k = 0; k < node.args.size() && k < schema_args.size(); ++k) {
    if (is_written(schema_args[k])) {
      for_each_value(node.args[k], [&](int64_t id) { writes |= storage_of(id) == s; });
    }
  }
  return writes;
}

void Reinplacer::rebuild() {
  std::vector<GraphNode> nodes;
  nodes.reserve(g_.nodes.size());
  for (int64_t n = 0; n < num_nodes_; ++n) {
    for (auto& b : before_[n]) nodes.push_back(std::move(b));
    if (removed_[n] != 0) continue;
    if (replacement_[n].empty()) {
      nodes.push_back(std::move(g_.nodes[n]));
    } else {
      for (auto& r : replacement_[n]) nodes.push_back(std::move(r));
    }
  }
  g_.nodes = std::move(nodes);
  rename_values(g_, rename_);
  // The epilogue's views of a target an out= op now writes are read by nothing.
  remove_unread_nodes(g_, [](const GraphNode& node) { return !is_view_op(node.op); });
}

std::vector<ReinplaceDecision> reinplace_graph(Graph& graph) {
  return Reinplacer(graph).run();
}

}  // namespace tfz::detail
