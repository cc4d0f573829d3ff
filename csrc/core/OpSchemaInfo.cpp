// Schema analysis: op classification and the mutable -> functional pairing.
// See Note [Schema: functional variants] and Note [Schema: argument plan].
#include "core/OpSchemaInfo.h"

#include "core/ViewInverses.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>

namespace tfz::detail {

// Note [Schema: functional variants]
// Which functional op replaces a mutable one is derived, at run time, from the schemas the
// installed torch registers, with torchgen's grouping rule (FunctionSchema.signature() in
// torchgen/model.py), re-stated over c10::FunctionSchema:
//   - the name loses its overload, a trailing "_" (in-place) and a trailing "_functional"
//     (the generated variants of ops that mutate non-self arguments);
//   - out= arguments (written kwarg-only arguments) are dropped, and so are the four
//     TensorOptions kwargs (dtype, layout, device, pin_memory), so factory out= ops pair up;
//   - alias annotations are dropped; names, types, defaults and kwarg-only-ness are kept;
//   - every written argument that the op does not already return is appended to the returns,
//     in the order self, out arguments, other positional arguments.
// Two ops with equal normalized signatures, one mutable and one not, form a pair: add_.Tensor,
// add.out -> add.Tensor; _native_batch_norm_legit -> _native_batch_norm_legit_functional;
// transpose_ -> transpose.int (an inplace-view op pairs with its view op). The one exception
// torchgen also makes is kept: bernoulli.p's `p` is compared as if it had bernoulli_'s default.
// Because the table is built from the dispatcher, custom ops registered later join it too.
// Rejected: a hand-written or codegen'd table. It goes stale with every torch release and
// cannot know custom ops; a test (test_schema_pairs.py) compares our pairs with torchgen's.

// Note [Schema: argument plan]
// A mutable op runs as its functional variant; OpInfo says how, once per operator, for every
// kernel that runs mutable ops (the boxed mutable_kernel and the unboxed in-place/out= kernels,
// which only install themselves where this plan is the one they implement):
//   functional_args  per functional-variant argument, where its value comes from: the mutable
//                    argument of the same name (never an out= argument, except for the functional
//                    companions of custom ops, which keep them), the schema default, or, for the
//                    TensorOptions of factory out= ops, the first out= tensor's
//                    dtype/layout/device;
//   written          per written argument, the functional return holding its new value: the
//                    returns the mutable op itself has come first, in order, then the appended
//                    ones (appended_written_args); out= arguments may change shape (resized, as in
//                    eager), others must keep it;
//   return_aliases   per mutable-op return, the written argument it is (returned as the caller's
//                    wrapper), or -1 for a fresh value.
// Rejected: each kernel reading the schema itself: two readings of one rule drift apart, and the
// unboxed kernels could not prove they match.

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::Functional:
      return "functional";
    case OpKind::View:
      return "view";
    case OpKind::InplaceView:
      return "inplace_view";
    case OpKind::Mutable:
      return "mutable";
    case OpKind::Unsupported:
      return "unsupported";
  }
  return "?";
}

bool is_written(const c10::Argument& a) {
  return a.alias_info() != nullptr && a.alias_info()->isWrite();
}

bool writes_an_argument(const c10::OperatorHandle& op) {
  const auto& args = op.schema().arguments();
  return std::any_of(args.begin(), args.end(),
                     [](const c10::Argument& a) { return is_written(a); });
}

bool is_out_argument(const c10::Argument& a) {
  return a.kwarg_only() && is_written(a);
}

bool has_tensor_arguments(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments()) {
    if (a.type()->str().find("Tensor") != std::string::npos) return true;
  }
  return false;
}

namespace {

// "aten::add_" -> "aten::add"; "aten::__iand__" -> "aten::__and__";
// "aten::normal_functional" -> "aten::normal".
std::string base_name(const std::string& name) {
  std::string base = name;
  const auto ns_end = base.find("::");
  const size_t start = ns_end == std::string::npos ? 0 : ns_end + 2;
  const std::string local = base.substr(start);
  if (local.size() > 5 && local.rfind("__i", 0) == 0 && local.substr(local.size() - 2) == "__") {
    return base.substr(0, start) + "__" + local.substr(3);
  }
  if (!local.empty() && local.back() == '_' && local.substr(local.size() - 2) != "__") {
    base.pop_back();
  }
  const std::string suffix = "_functional";
  if (base.size() > suffix.size() + start &&
      base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0) {
    base.resize(base.size() - suffix.size());
  }
  return base;
}

// Index of the first of four consecutive kwarg-only TensorOptions arguments, or -1.
int tensor_options_start(const std::vector<c10::Argument>& args) {
  static const char* names[] = {"dtype", "layout", "device", "pin_memory"};
  for (size_t i = 0; i + 4 <= args.size(); ++i) {
    bool match = true;
    for (size_t k = 0; k < 4 && match; ++k) {
      match = args[i + k].kwarg_only() && args[i + k].name() == names[k];
    }
    if (match) return static_cast<int>(i);
  }
  return -1;
}

// Written arguments not already returned, in torchgen's order (self, out=, other positional).
std::vector<int> appended_written_args_impl(const c10::FunctionSchema& s) {
  const auto& args = s.arguments();
  const auto& rets = s.returns();
  auto returned = [&](const c10::Argument& a) {
    for (const auto& r : rets) {
      if (r.alias_info() && *r.alias_info() == *a.alias_info()) return true;
    }
    return false;
  };
  int self_ix = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].kwarg_only() && args[i].name() == "self") {
      self_ix = static_cast<int>(i);
      break;
    }
  }
  std::vector<int> order;
  if (self_ix >= 0) order.push_back(self_ix);
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out_argument(args[i])) order.push_back(static_cast<int>(i));
  }
  for (size_t i = self_ix + 1; i < args.size(); ++i) {
    if (!args[i].kwarg_only()) order.push_back(static_cast<int>(i));
  }
  std::vector<int> result;
  for (int i : order) {
    if (is_written(args[i]) && !returned(args[i])) result.push_back(i);
  }
  return result;
}

// The signature, with its arguments in schema order or sorted by name.
// See Note [Schema: functional variants matched by argument names].
std::string signature_of(const c10::FunctionSchema& schema, bool ordered) {
  const auto& args = schema.arguments();
  const int opts = tensor_options_start(args);
  const bool is_bernoulli_p = schema.name() == "aten::bernoulli" && schema.overload_name() == "p";
  std::vector<std::string> parts;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (is_out_argument(a)) continue;
    if (opts >= 0 && static_cast<int>(i) >= opts && static_cast<int>(i) < opts + 4) continue;
    std::ostringstream part;
    part << (a.kwarg_only() && ordered ? "*" : "") << a.type()->str() << " " << a.name();
    if (a.default_value()) {
      part << "=" << *a.default_value();
    } else if (is_bernoulli_p && a.name() == "p") {
      part << "=" << c10::IValue(0.5);  // see the Note: bernoulli_.float has p=0.5
    }
    parts.push_back(part.str());
  }
  if (!ordered) std::sort(parts.begin(), parts.end());
  std::ostringstream out;
  out << base_name(schema.name()) << "(";
  for (const auto& part : parts) out << part << ",";
  out << ")->(";
  for (const auto& r : schema.returns()) out << r.type()->str() << ",";
  for (int i : appended_written_args_impl(schema)) out << args[i].type()->str() << ",";
  out << ")";
  return out.str();
}

struct CandidateTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<c10::OperatorHandle>> by_signature;
  // The same candidates keyed by their signature with arguments sorted by name.
  std::unordered_map<std::string, std::vector<c10::OperatorHandle>> by_argument_names;
};

CandidateTable& candidates() {
  static auto* table = new CandidateTable();  // leaked: outlives static destruction order
  return *table;
}

bool is_cia(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

std::optional<c10::OperatorHandle> find_in(
    const std::unordered_map<std::string, std::vector<c10::OperatorHandle>>& index,
    const std::string& signature) {
  auto it = index.find(signature);
  if (it == index.end() || it->second.empty()) return std::nullopt;
  for (const auto& op : it->second) {
    if (!is_cia(op)) return op;
  }
  return it->second.front();
}

std::optional<c10::OperatorHandle> find_functional(const std::string& signature) {
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  return find_in(table.by_signature, signature);
}

// Note [Schema: functional variants matched by argument names]
// torchgen pairs an in-place op with its functional variant only when their signatures agree
// argument by argument, in order. A few ops spell the same arguments in another order
// (polygamma_(Tensor(a!) self, int n) against polygamma(int n, Tensor self)), so torchgen leaves
// them unpaired and torch's functionalization refuses them. Their arguments are matched by name
// anyway (plan_mutable_with), so when the ordered signature finds nothing we look the op up by
// its signature with arguments sorted by name: same base name, same argument names, types and
// defaults, same returns. Rejected: a hand-written list of such pairs, which would go stale as
// torch adds ops.
std::optional<c10::OperatorHandle> find_functional_by_argument_names(
    const c10::FunctionSchema& schema) {
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  return find_in(table.by_argument_names, signature_of(schema, /*ordered=*/false));
}

// See Note [Kernel: out= of another dtype], case "reductions".
bool reduces_in_out_dtype(const std::string& name) {
  return name == "aten::sum" || name == "aten::nansum" || name == "aten::mean" ||
         name == "aten::prod" || name == "aten::cumsum" || name == "aten::cumprod";
}

// Note [Schema: out= of the same number of elements]
// arange, range, linspace and logspace resize `out` only when its number of elements differs:
// torch.arange(12, out=x) with x of shape (2, 6, 1) keeps that shape and fills it in order,
// where every other out= op resizes x to (12,). Their plan says so
// (OpInfo::out_keeps_shape_of_same_numel), and the mutable kernel reshapes a result with out's
// number of elements to out's shape before writing it.
// Rejected: keeping out's shape for every out= op of out's number of elements (torch.neg(y,
// out=x) with x of shape (2, 6) and y of (12,) leaves x of shape (12,): resize_output), and
// learning out's final shape per call by running the out= op on meta tensors (a second dispatch
// on every out= call, for four ops).
bool keeps_shape_of_same_numel(const std::string& name) {
  return name == "aten::arange" || name == "aten::range" || name == "aten::linspace" ||
         name == "aten::logspace";
}

// Note [Schema: in-place arguments an op resizes]
// A per-channel observer's state starts empty: FusedMovingAvgObsFakeQuantize's running_min and
// running_max are tensor([]), its scale and zero_point have one element, and
// _fused_moving_avg_obs_fq_helper resizes all four to the number of channels on its first call
// (QAT's default qconfig for weights). Written arguments that are not out= normally keep their
// shape, and a write of another shape is refused with eager's message for in-place ops; for this
// op the plan says its written arguments are resized as an out= op's out is
// (OpInfo::resizes_written), which the mutation kernel then does.
// The same op bumps none of their versions in eager, although it has an ADInplaceOrView kernel
// (measured on torch 2.13: running_min, running_max, scale and zero_point stay at version 0,
// resized or not), so its plan says that too (OpInfo::bumps_versions).
// Rejected: letting any written argument with no element be resized (x = torch.empty(0);
// x.add_(torch.ones(3)) raises in eager, and would not here).
bool resizes_written_arguments(const std::string& name) {
  return name == "aten::_fused_moving_avg_obs_fq_helper";
}

void plan_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional,
                       OpInfo& info) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  info.kind = OpKind::Mutable;
  info.unsupported_reason.clear();
  info.functional_op = functional;
  info.functional_args.clear();
  info.written.clear();
  info.return_aliases.clear();
  const auto& returns = schema.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    int alias = -1;
    for (size_t j = 0; returns[i].alias_info() && j < args.size(); ++j) {
      if (is_written(args[j]) && *args[j].alias_info() == *returns[i].alias_info()) {
        alias = static_cast<int>(j);
        break;
      }
    }
    info.return_aliases.push_back(alias);
    if (alias >= 0) {
      info.written.push_back(
          {alias, static_cast<int>(i), is_out_argument(args[alias]), /*is_returned=*/true});
    }
  }
  const auto appended = appended_written_args_impl(schema);
  for (size_t k = 0; k < appended.size(); ++k) {
    const int j = appended[k];
    info.written.push_back({j, static_cast<int>(returns.size() + k), is_out_argument(args[j]),
                            /*is_returned=*/false});
  }
  const bool dtype_from_out = reduces_in_out_dtype(schema.name());
  info.out_keeps_shape_of_same_numel = keeps_shape_of_same_numel(schema.name());
  info.resizes_written = resizes_written_arguments(schema.name());
  for (const auto& fa : functional.schema().arguments()) {
    ArgSource src{ArgSource::Default, -1};
    for (size_t j = 0; j < args.size(); ++j) {
      if (!is_out_argument(args[j]) && args[j].name() == fa.name()) {
        const bool or_out = dtype_from_out && fa.name() == "dtype";
        src = {or_out ? ArgSource::FromMutableArgOrOutDtype : ArgSource::FromMutableArg,
               static_cast<int>(j)};
        break;
      }
    }
    for (size_t j = 0; src.kind == ArgSource::Default && j < args.size(); ++j) {
      // Only functional companions (AutoFunctional.cpp) keep out= arguments as inputs.
      if (args[j].name() == fa.name()) src = {ArgSource::FromMutableArg, static_cast<int>(j)};
    }
    if (src.kind == ArgSource::Default && fa.kwarg_only()) {
      if (fa.name() == "dtype") src.kind = ArgSource::OutDtype;
      if (fa.name() == "layout") src.kind = ArgSource::OutLayout;
      if (fa.name() == "device") src.kind = ArgSource::OutDevice;
      if (fa.name() == "pin_memory") src.kind = ArgSource::None;
    }
    info.functional_args.push_back(src);
  }
}

}  // namespace

void set_view_plan(const c10::OperatorHandle& view_op, OpInfo& info) {
  const auto& n = view_op.operator_name();
  info.view_op = view_op;
  info.copy_op = c10::Dispatcher::singleton().findOp({n.name + "_copy", n.overload_name});
  info.inverse = find_inverse(n);
}

std::vector<int> appended_written_args(const c10::FunctionSchema& schema) {
  return appended_written_args_impl(schema);
}

OpInfo classify_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional) {
  OpInfo info = classify(op);
  plan_mutable_with(op, functional, info);
  return info;
}

std::string normalized_signature(const c10::FunctionSchema& schema) {
  return signature_of(schema, /*ordered=*/true);
}

void index_functional_candidate(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  for (const auto& a : schema.arguments()) {
    if (is_written(a)) return;
  }
  auto sig = normalized_signature(schema);
  auto by_names = signature_of(schema, /*ordered=*/false);
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.by_signature[sig].push_back(op);
  table.by_argument_names[by_names].push_back(op);
}

void forget_functional_candidate(const c10::OperatorName& name) {
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  for (auto* index : {&table.by_signature, &table.by_argument_names}) {
    for (auto& [sig, ops] : *index) {
      ops.erase(
          std::remove_if(ops.begin(), ops.end(),
                         [&](const c10::OperatorHandle& op) { return op.operator_name() == name; }),
          ops.end());
    }
  }
}

static bool is_elementwise(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::pointwise)) return true;
  // Elementwise ops torch does not tag pointwise (their out= and in-place forms alike).
  static const std::array<std::string_view, 10> untagged = {
      "aten::copy_",       "aten::copy",  "aten::fill_", "aten::fill", "aten::masked_fill_",
      "aten::masked_fill", "aten::where", "aten::zero_", "aten::zero", "aten::_to_copy"};
  const std::string& name = op.operator_name().name;
  return std::find(untagged.begin(), untagged.end(), name) != untagged.end() ||
         name.rfind("aten::_foreach_", 0) == 0;
}

OpInfo classify(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  OpInfo info;
  info.name = c10::toString(op.operator_name());
  info.wraps_plain_outputs = !has_tensor_arguments(schema);  // a factory (Note [Kernel: factories])
  info.seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  info.bumps_versions = (op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView) ||
                         info.name.rfind("aten::_foreach_", 0) == 0) &&
                        !resizes_written_arguments(schema.name());

  bool writes = false;
  for (const auto& a : schema.arguments()) writes |= is_written(a);
  bool returns_alias = false;
  for (const auto& r : schema.returns()) returns_alias |= r.alias_info() != nullptr;

  if (writes && op.hasTag(at::Tag::inplace_view)) {
    auto view = find_functional(normalized_signature(schema));
    if (!view) {
      info.kind = OpKind::Unsupported;
      info.unsupported_reason = "in-place view op with no out-of-place view op to replay";
      return info;
    }
    info.kind = OpKind::InplaceView;
    set_view_plan(*view, info);
    return info;
  }
  if (writes) {
    auto functional = find_functional(normalized_signature(schema));
    if (!functional) functional = find_functional_by_argument_names(schema);
    if (!functional) {
      info.kind = OpKind::Unsupported;
      info.unsupported_reason =
          "this op mutates its inputs and torch registers no functional variant for it (no "
          "operator has its normalized signature). Rewrite the code to use an out-of-place op";
      return info;
    }
    plan_mutable_with(op, *functional, info);
    info.elementwise = is_elementwise(op);
    return info;
  }
  if (returns_alias) {
    info.kind = OpKind::View;
    set_view_plan(op, info);
    return info;
  }
  info.kind = OpKind::Functional;
  const auto& args = schema.arguments();
  info.self_is_template = schema.name().size() > 5 &&
                          schema.name().compare(schema.name().size() - 5, 5, "_like") == 0 &&
                          !args.empty() && args[0].name() == "self" &&
                          args[0].type()->kind() == c10::TypeKind::TensorType;
  // A *_like op is a factory whose self only gives metadata: inside a layer its result is a
  // wrapper even for a plain self (a saved tensor autograd hands a backward formula: silu's
  // `1 - sigmoid` is empty_like(sigmoid).fill_(1).sub_(sigmoid), whose writes a tracer recorded
  // as mutations). See Note [Kernel: factories].
  info.wraps_plain_outputs = info.wraps_plain_outputs || info.self_is_template;
  static const std::array<std::string_view, 5> copies_storage{
      "aten::select_scatter", "aten::slice_scatter", "aten::diagonal_scatter",
      "aten::as_strided_scatter", "aten::copy"};
  info.copies_self_storage = std::find(copies_storage.begin(), copies_storage.end(),
                                       schema.name()) != copies_storage.end();
  return info;
}

}  // namespace tfz::detail
