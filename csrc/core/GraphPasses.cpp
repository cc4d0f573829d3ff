// The passes over a recorded graph: dead-node elimination and the region-precise input epilogue.
// See core/GraphPasses.h.
#include "core/GraphPasses.h"

#include "core/GraphEdit.h"
#include "core/GraphRun.h"

#include "core/OpSchemaInfo.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace tfz::detail {

// Note [Capture: dead nodes]
// The recorder sees every op the functionalized program runs on inner values, including views
// nobody reads (the select behind a `y = x[0]` whose y is then only written through, replayed
// views the write-back no longer needs) and the functional results of writes that were later
// overwritten. A node stays if one of its results reaches an output or a kept node, or if it has
// an effect of its own: it writes an argument (the input epilogue's copy_, as_strided_, resize_)
// or draws from a random generator (removing a dead `rand` would hand its numbers to the next
// random op, and the graph would no longer replay eager's stream), or is a guard
// (Note [Capture: guards on values read]), or returns nothing: such an op exists for its effect,
// mostly raising (torch._assert_async, linalg's _linalg_check_errors behind inv and cholesky of a
// singular input: dropping them made the graph return inf or garbage where eager raises). The
// profiler's record_function markers (an optimizer step's) record nothing the program computes,
// and go with the dead. Rejected: FX's eliminate_dead_code, which only knows the first rule; and
// doing it in Python, which would leave C++ users with the fat graph.
bool is_guard(const c10::OperatorHandle& op) {
  return op.operator_name().name.rfind("tfz::_guard_", 0) == 0;
}

namespace {
bool has_effect_only(const c10::OperatorHandle& op) {
  return op.schema().returns().empty() && op.operator_name().name.rfind("profiler::", 0) != 0;
}
}  // namespace

void eliminate_dead_nodes(Graph& graph) {
  remove_unread_nodes(graph, [](const GraphNode& node) {
    return writes_an_argument(node.op) || node.op.hasTag(at::Tag::nondeterministic_seeded) ||
           is_guard(node.op) || has_effect_only(node.op);
  });
}

// Note [Capture: region-precise epilogue]
// x[0].add_(1) on an input records select(x, 0, 0) -> add -> select_scatter(x, add, 0, 0) and the
// epilogue copy_(x, select_scatter): the whole input is rebuilt and written back for one row (the
// KV-cache step of benchmarks/ wrote its whole 1.0 MiB cache back where eager writes a 4 KiB
// slot). When the epilogue's new value is a chain of scatters whose innermost base is
// the input itself, unchanged, the copy_ is replaced by one copy_ per scatter, innermost first,
// into the matching view of the input: copy_(select(x, 0, 0), add). A scatter whose source is
// itself a scatter over the region it writes (nested views: cache[:, :, pos] through three
// slices) is followed down to the innermost written region. The scatters are then dead unless the
// program read the updated value, and eliminate_dead_nodes drops them. Copies in the scatters'
// order reproduce overlapping writes exactly (later ones land last). Anything else (a base
// that is not the input, a view argument that is a tensor, an input whose metadata changed first,
// a copy_ whose result a later epilogue op reads) keeps the whole-input copy_. Views-removed graphs
// keep it too: their promise is a graph without view ops, and the region of a write can only be
// named with one. Rejected: region tracking in the alias storage at write time (the eager path
// would pay for it on every write, and a graph rewrite sees exactly what the graph does).

namespace {

// Each scatter's arguments after (self, src) are its view's arguments after self.
constexpr ScatterView kScatterViews[] = {
    {"aten::select_scatter", "aten::select", "int"},
    {"aten::slice_scatter", "aten::slice", "Tensor"},
    {"aten::diagonal_scatter", "aten::diagonal", ""},
    {"aten::as_strided_scatter", "aten::as_strided", ""},
};

}  // namespace

const ScatterView* scatter_view_of(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  if (!name.overload_name.empty()) return nullptr;
  for (const auto& sv : kScatterViews) {
    if (name.name == sv.scatter) return &sv;
  }
  return nullptr;
}

namespace {

// A region of an input: views applied in order to the input's value.
struct Region {
  int64_t input;
  std::vector<std::pair<const ScatterView*, std::vector<GraphArg>>> views;
};

bool same_constants(const std::vector<GraphArg>& a, const GraphArg* b, size_t n) {
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    if (a[i].kind != GraphArg::Kind::kConstant || b[i].kind != GraphArg::Kind::kConstant ||
        !(a[i].constant == b[i].constant)) {
      return false;
    }
  }
  return true;
}

class EpilogueNarrower {
 public:
  explicit EpilogueNarrower(Graph& graph) : g_(graph) {}

  // Copies writing `value` into `dst`, appended to `out`; false (and `out` as it was) if `value`
  // is not a chain of scatters over `dst`.
  bool peel(const Region& dst, int64_t value, std::vector<GraphNode>& out) {
    const size_t mark = out.size();
    const ValueSource& source = g_.values[value];
    if (source.kind != ValueSource::Kind::kNode || source.index < 0) return false;
    const GraphNode& scatter = g_.nodes[source.index];
    const ScatterView* sv = scatter_view_of(scatter.op);
    if (sv == nullptr) return false;
    for (size_t i = 2; i < scatter.args.size(); ++i) {
      if (scatter.args[i].kind != GraphArg::Kind::kConstant) return false;
    }
    const int64_t base = scatter.args[0].values[0];
    const int64_t src = scatter.args[1].values[0];
    if (!denotes(base, dst, dst.views.size()) && !peel(dst, base, out)) {
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(mark), out.end());
      return false;
    }
    Region inner = dst;
    inner.views.emplace_back(sv,
                             std::vector<GraphArg>(scatter.args.begin() + 2, scatter.args.end()));
    if (!peel(inner, src, out)) emit_copy(inner, src, out);
    return true;
  }

 private:
  // Whether graph value `value` is the first `depth` views of `region` applied to its input.
  bool denotes(int64_t value, const Region& region, size_t depth) const {
    if (depth == 0) return value == region.input;
    const ValueSource& source = g_.values[value];
    if (source.kind != ValueSource::Kind::kNode || source.index < 0) return false;
    const GraphNode& node = g_.nodes[source.index];
    const auto& [sv, args] = region.views[depth - 1];
    const auto& name = node.op.operator_name();
    if (name.name != sv->view || name.overload_name != sv->view_overload) return false;
    if (!same_constants(args, node.args.data() + 1, node.args.size() - 1)) return false;
    return node.args[0].kind == GraphArg::Kind::kValue &&
           denotes(node.args[0].values[0], region, depth - 1);
  }

  void emit_copy(const Region& dst, int64_t src, std::vector<GraphNode>& out) {
    auto& d = c10::Dispatcher::singleton();
    int64_t current = dst.input;
    for (const auto& [sv, args] : dst.views) {
      GraphNode view{d.findSchemaOrThrow(sv->view, sv->view_overload), {value_arg(current)}, {}};
      view.args.insert(view.args.end(), args.begin(), args.end());
      current = new_node_value(g_);
      view.returns.push_back(value_arg(current));
      out.push_back(std::move(view));
    }
    GraphArg non_blocking;
    non_blocking.constant = false;
    GraphNode copy{d.findSchemaOrThrow("aten::copy_", ""),
                   {value_arg(current), value_arg(src), non_blocking},
                   {value_arg(new_node_value(g_))}};
    out.push_back(std::move(copy));
  }

  Graph& g_;
};

}  // namespace

void narrow_epilogue_copies(Graph& graph) {
  // A copy_ whose result a later op reads (an as_strided_ of the metadata epilogue applied to
  // the written input) must stay whole: that op acts on the whole input the copy_ returns.
  std::vector<char> read(graph.values.size(), 0);
  for (const auto& node : graph.nodes) {
    for (const auto& a : node.args) for_each_value(a, [&](int64_t id) { read[id] = 1; });
  }
  for (const auto& out : graph.outputs) for_each_value(out, [&](int64_t id) { read[id] = 1; });
  EpilogueNarrower narrower(graph);
  std::vector<GraphNode> rebuilt;
  rebuilt.reserve(graph.nodes.size());
  bool changed = false;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const GraphNode& node = graph.nodes[n];
    const auto& name = node.op.operator_name();
    std::vector<GraphNode> copies;
    if (name.name == "aten::copy_" && name.overload_name.empty() &&
        node.args[0].kind == GraphArg::Kind::kValue &&
        node.args[1].kind == GraphArg::Kind::kValue &&
        graph.values[node.args[0].values[0]].kind == ValueSource::Kind::kInput &&
        !node.returns.empty() && read[node.returns[0].values[0]] == 0 &&
        narrower.peel(Region{node.args[0].values[0], {}}, node.args[1].values[0], copies)) {
      for (auto& c : copies) {
        c.grad_enabled = node.grad_enabled;  // the region copies replace this copy_
        rebuilt.push_back(std::move(c));
      }
      changed = true;
      continue;
    }
    rebuilt.push_back(node);
  }
  if (!changed) return;
  graph.nodes = std::move(rebuilt);
  renumber_node_values(graph);
}

// A tfz::_with_gradient_of node (Note [Graphs: writes autograd does not see]) gives a hidden
// write's new value its tensor's old gradient edge. When the only reader of that value is an
// epilogue copy_ into an input that runs without grad (the input keeps its own autograd
// identity, as eager's hidden write leaves it), the edge is never read: the copy_ takes the
// write's value directly and the node (a copy of the value) dies. An optimizer's step recorded
// with parameters that require grad is the common case.
void drop_unread_gradient_edges(Graph& graph) {
  static const c10::OperatorName gradient_of{"tfz::_with_gradient_of", ""};
  static const c10::OperatorName copy{"aten::copy_", ""};
  std::vector<bool> is_input(graph.values.size(), false);
  for (int64_t id : graph.inputs) is_input[id] = true;
  std::vector<int64_t> other_reads(graph.values.size(), 0);
  for (const auto& node : graph.nodes) {
    const bool epilogue = node.op.operator_name() == copy && !node.grad_enabled &&
                          node.args.size() >= 2 && node.args[0].kind == GraphArg::Kind::kValue &&
                          is_input[node.args[0].values[0]];
    for (size_t i = 0; i < node.args.size(); ++i) {
      if (epilogue && i == 1) continue;
      for (int64_t id : node.args[i].values) {
        if (id >= 0) ++other_reads[id];
      }
    }
  }
  for (const auto& out : graph.outputs) {
    for (int64_t id : out.values) {
      if (id >= 0) ++other_reads[id];
    }
  }
  std::unordered_map<int64_t, int64_t> to;
  for (const auto& node : graph.nodes) {
    if (node.op.operator_name() != gradient_of || node.returns.size() != 1 ||
        node.returns[0].kind != GraphArg::Kind::kValue ||
        node.args[0].kind != GraphArg::Kind::kValue) {
      continue;
    }
    const int64_t result = node.returns[0].values[0];
    if (other_reads[result] == 0) to.emplace(result, node.args[0].values[0]);
  }
  if (!to.empty()) rename_values(graph, to);
}

}  // namespace tfz::detail
