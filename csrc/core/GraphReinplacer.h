// The C++ reinplacing pass's state and steps (Note [Reinplace: the C++ pass]), private to its three
// sources: core/GraphReinplace.cpp (the analysis, the in-place rewrites, the rebuilt graph),
// core/GraphReinplaceScatter.cpp (scatters written through their views) and
// core/GraphReinplaceRegions.cpp (the rewrites that write regions of inputs: out=, and scatters
// into inputs written region by region).
#pragma once

#include "core/Graph.h"
#include "core/GraphPasses.h"
#include "core/GraphReinplace.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tfz::detail {

using Storage = const c10::StorageImpl*;

// A rejection naming its rule, or nothing: the rewrite is allowed.
using Verdict = std::optional<std::string>;

inline std::string op_name(const c10::OperatorHandle& op) {
  return c10::toString(op.operator_name());
}

inline bool is_aten_copy_(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.name == "aten::copy_" && name.overload_name.empty();
}

class Reinplacer {
 public:
  explicit Reinplacer(Graph& graph)
      : g_(graph), num_nodes_(static_cast<int64_t>(graph.nodes.size())) {}

  std::vector<ReinplaceDecision> run();

 private:
  // -- the meta run and the tables the rules read ----------------------------------------------
  bool analyse(std::string& why);

  // Each value's storage, redirected after rewrites (a rewritten result lives in the storage it
  // was written into).
  Storage storage_of(int64_t id) const;

  bool read_by_a_kept_node(int64_t id, int64_t after, int64_t except = -1) const;

  // Whether a value of S defined before node `n` is read after it, by a node other than `except`.
  bool old_bytes_read(Storage s, int64_t n, int64_t except) const;

  // The first copy_ after node `n` that writes value `id` (as_target; with x an input, the
  // program's write-back of x whole), or that copies `id` into another value.
  int64_t later_copy(int64_t n, int64_t id, bool as_target) const;

  bool shares_memory_with_another_input(int64_t x) const;

  // -- the candidates --------------------------------------------------------------------------
  bool try_node(int64_t n);

  // Rule 1 of all three rewrites.
  Verdict deterministic_and_not_recorded(const GraphNode& node) const;

  // Rule 2 of the in-place and scatter rewrites: `out` can be `a` itself.
  Verdict laid_out_as(int64_t a, int64_t out) const;

  // Rules 4 and 5 of the in-place and scatter rewrites: writing a's storage S at node n, whose
  // result `out` then is a. Sets `copy_back` to the epilogue copy_ the write replaces, if any.
  Verdict dead_after(int64_t n, int64_t a, int64_t out, int64_t& copy_back) const;

  // After a rewrite of node n: out is the tensor `a` is, and lives in a's storage.
  void commit(int64_t n, int64_t a, int64_t out, int64_t copy_back, std::string done);

  void merge(Storage fresh, Storage s);

  bool result_read(int64_t n) const;

  void remove_copy(int64_t c);

  // `out = op(a, ...)` -> `op_(a, ...)`.
  Verdict in_place(int64_t n, const c10::OperatorHandle& twin);

  // `outs = _foreach_op(as, ...)` -> `_foreach_op_(as, ...)`: the in-place rules per element.
  Verdict in_place_each(int64_t n, const c10::OperatorHandle& twin);

  // `out = X_scatter(a, src, args...)` -> `copy_(X(a, args...), src)`; out is then a.
  Verdict scatter(int64_t n, const ScatterView& sv);

  // Rules 4 and 5 for a scatter into an input x (a is x whole) that the program writes region by
  // region: a later copy_ writes exactly the scatter's region W of x (the program's own write of
  // it), nothing reads x's old bytes in W before that copy_, and nothing reads out (which becomes
  // x) once the program's writes into x begin. Sets `region_copy` to that copy_ where it copies
  // src itself with no write into x before it: it is then redundant.
  Verdict region_written_later(int64_t n, int64_t a, int64_t out, int64_t src, const at::Tensor& w,
                               int64_t& region_copy) const;

  // The node that made a scatter's source, when it can write the scatter's view (region W of
  // meta tensor `w`) at node n instead: a functional copy (its source then goes through the
  // view) or an op with an out= form; else -1.
  // See Note [Reinplace: a region assignment writes its value directly].
  int64_t source_to_fold(int64_t n, int64_t src, int64_t region_copy, const at::Tensor& w) const;

  static bool is_functional_copy(const c10::OperatorHandle& op);

  // The meta tensor a view node (of values in the meta run) returns.
  at::Tensor meta_result(const GraphNode& node) const;

  // Whether node r writes storage s (a scatter already rewritten writes its base's).
  bool writes_storage(int64_t r, Storage s) const;

  // `v = op(...)` whose value the copy_ at node c writes into an input's region d ->
  // `op.out(..., out=d)`, and the copy_ goes.
  Verdict out_form(int64_t n, const c10::OperatorHandle& out_op, int64_t c);

  // Whether `node` is a view op returning `x` from a value and constant arguments.
  static bool is_view_of_constants(const GraphNode& node, int64_t x);

  // A value added by a rewrite, with its meta tensor, defined just before node n.
  // `meta` by value: callers pass an entry of env_, which this call grows (a reference into it
  // would dangle once the table reallocates).
  int64_t add_value(at::Tensor meta, std::optional<at::Device> device, int64_t n);

  // -- the rewritten graph ---------------------------------------------------------------------
  void rebuild();

  Graph& g_;
  const int64_t num_nodes_;
  std::string failed_op_;
  std::vector<std::string> names_;  // each node's op as the graph had it, for the report
  // The meta run: each value's meta tensor and device.
  std::vector<at::Tensor> env_;
  std::vector<std::optional<at::Device>> devices_;
  // Where each value is defined and read (node indices; num_nodes_: an output), the values in
  // each storage, the storages of inputs and constants, and where rewritten storages went.
  std::vector<int64_t> defined_at_;
  std::vector<std::vector<int64_t>> readers_;
  std::unordered_map<Storage, std::vector<int64_t>> members_;
  std::unordered_set<Storage> outside_;
  std::unordered_map<Storage, Storage> moved_;
  // What each value is at run time: after a rewrite, out is the tensor its first argument is.
  std::vector<int64_t> identity_;
  bool any_requires_grad_ = false;
  // The rewrites: nodes removed, replaced by others, or preceded by new ones; values renamed.
  std::vector<char> removed_, done_;
  std::vector<std::vector<GraphNode>> replacement_, before_;
  std::unordered_map<int64_t, int64_t> rename_;
  std::map<int64_t, ReinplaceDecision> decisions_;
};

}  // namespace tfz::detail
