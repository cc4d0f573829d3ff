// Schema analysis: op classification and the mutable -> functional pairing.
// See Note [Schema: functional variants].
#include "core/OpSchemaInfo.h"

#include <algorithm>

#include "core/ViewInverses.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>
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

namespace {

bool is_write(const c10::Argument& a) {
  return a.alias_info() != nullptr && a.alias_info()->isWrite();
}

std::string full_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

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

bool is_out_arg(const c10::Argument& a) {
  return a.kwarg_only() && is_write(a);
}

// Written arguments not already returned, in torchgen's order (self, out=, other positional).
std::vector<int> appended_mutated_args_impl(const c10::FunctionSchema& s) {
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
    if (is_out_arg(args[i])) order.push_back(static_cast<int>(i));
  }
  for (size_t i = self_ix + 1; i < args.size(); ++i) {
    if (!args[i].kwarg_only()) order.push_back(static_cast<int>(i));
  }
  std::vector<int> result;
  for (int i : order) {
    if (is_write(args[i]) && !returned(args[i])) result.push_back(i);
  }
  return result;
}

struct CandidateTable {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<c10::OperatorHandle>> by_signature;
};

CandidateTable& candidates() {
  static auto* table = new CandidateTable();  // leaked: outlives static destruction order
  return *table;
}

bool is_cia(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

std::optional<c10::OperatorHandle> find_functional(const std::string& signature) {
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.by_signature.find(signature);
  if (it == table.by_signature.end() || it->second.empty()) return std::nullopt;
  for (const auto& op : it->second) {
    if (!is_cia(op)) return op;
  }
  return it->second.front();
}

void plan_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional,
                       OpInfo& info);

void plan_mutable(const c10::OperatorHandle& op, OpInfo& info) {
  auto functional = find_functional(normalized_signature(op.schema()));
  if (!functional) {
    info.kind = OpKind::Unsupported;
    info.unsupported_reason =
        "this op mutates its inputs and torch registers no functional variant for it (no "
        "operator has its normalized signature). Rewrite the code to use an out-of-place op";
    return;
  }
  plan_mutable_with(op, *functional, info);
}

void plan_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional,
                       OpInfo& info) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  info.kind = OpKind::Mutable;
  info.functional_op = functional;
  for (const auto& a : args) info.is_out |= is_out_arg(a);
  info.mutated_args = appended_mutated_args_impl(schema);
  for (const auto& r : schema.returns()) {
    int alias = -1;
    for (size_t j = 0; r.alias_info() && j < args.size(); ++j) {
      if (is_write(args[j]) && *args[j].alias_info() == *r.alias_info()) {
        alias = static_cast<int>(j);
        break;
      }
    }
    info.return_aliases.push_back(alias);
  }
  for (const auto& fa : functional.schema().arguments()) {
    ArgSource src{ArgSource::Default, -1};
    for (size_t j = 0; j < args.size(); ++j) {
      if (!is_out_arg(args[j]) && args[j].name() == fa.name()) {
        src = {ArgSource::FromMutableArg, static_cast<int>(j)};
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

void plan_view(const c10::OperatorHandle& view_op, OpInfo& info) {
  const auto& n = view_op.operator_name();
  info.view_op = view_op;
  info.copy_op = c10::Dispatcher::singleton().findOp({n.name + "_copy", n.overload_name});
  info.inverse = find_inverse(n);
}

}  // namespace

std::vector<int> appended_mutated_args(const c10::FunctionSchema& schema) {
  return appended_mutated_args_impl(schema);
}

// Note [Kernel: composites intercepted whole]
// CompositeImplicitAutograd (CIA) ops normally decompose above our key, so we only see the ops
// they are made of. A few CIA kernels take a fast path that bypasses the dispatcher when their
// tensors are not "subclass-like" (ATen's isTensorSubclassLike: Functionalize, Python, Batched,
// Sparse, Meta keys... or an active TorchDispatchMode), and our wrappers are not:
//  - out= ops resize `out` through at::native::resize_ on the TensorImpl (resize_output), which
//    fails on a wrapper ("storage that is not resizable") or silently leaves its shape stale
//    (matmul, linalg.matrix_power, linalg.multi_dot, quantile, linalg.norm, tensordot, ...);
//  - max_pool1d and ctc_loss(Tensor lengths) read the input's data pointer directly.
// We register our kernel for these ops (all CIA out= ops, plus the named ones) so that they are
// handled whole: out= ops as Mutable (their functional variant, itself usually CIA, runs on the
// inner tensors, where the fast path is legal) and the named ones as Functional. Autograd is
// unaffected: it runs on the inner tensors during that call, as for every other op.
// Under a TorchDispatchMode (make_fx), the inner call would hand the tracer the op's whole
// decomposition, views included, which breaks remove="mutations_and_views". There the work is
// done on the wrappers instead, with Python un-hidden so that ATen sees the active mode and takes
// its dispatcher-only paths, and we see every op as usual: a functional op runs its CIA
// decomposition (composite_kernel); an out= op calls its functional variant on the wrappers and
// writes the result into out like any out= op (mutable_kernel). Not the out= op's own
// decomposition: on subclass-like tensors some rebind their `out` reference to a new tensor
// instead of writing it (linalg_matrix_rank.out), and the caller's out would keep its old value.
// Rejected: marking wrappers subclass-like by adding one of those keys to their key set. Each has
// a process-wide fallback that casts the TensorImpl to its own type (FunctionalTensorWrapper,
// TensorWrapper, BatchedTensorImpl) or calls into Python, so a wrapper that escaped its call
// would be undefined behaviour instead of our "escaped" error. Also rejected: intercepting every
// CIA op whole (tried): dropout's RNG stream, batch_norm's hidden running-stat writes and
// views in views-removed graphs all changed.
bool intercepts_composite_whole(const c10::OperatorHandle& op) {
  if (!is_cia(op)) return false;
  const auto& schema = op.schema();
  if (schema.name() == "aten::max_pool1d" && schema.overload_name().empty()) return true;
  if (schema.name() == "aten::ctc_loss" && schema.overload_name() == "Tensor") return true;
  if (schema.name().rfind("aten::", 0) != 0) return false;
  // Their decomposition never resizes out natively, so it already works on wrappers; and it
  // never writes out at all for some dims (eager leaves `out` untouched: torch 2.13's
  // fft_ihfftn_symint_out passes (tmp, out) to conj_physical_out, which takes (out, self)). Only
  // the decomposition reproduces that, and matching eager is the contract.
  if (schema.name() == "aten::fft_ihfftn" || schema.name() == "aten::fft_ihfft2") return false;
  bool has_out = false;
  for (const auto& a : schema.arguments()) {
    if (is_write(a) && !is_out_arg(a)) return false;
    has_out |= is_out_arg(a);
  }
  return has_out;
}

bool has_tensor_arguments(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments()) {
    if (a.type()->str().find("Tensor") != std::string::npos) return true;
  }
  return false;
}

OpInfo classify_mutable_with(const c10::OperatorHandle& op, const c10::OperatorHandle& functional) {
  OpInfo info = classify(op);
  plan_mutable_with(op, functional, info);
  return info;
}

std::string normalized_signature(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  std::ostringstream out;
  out << base_name(schema.name()) << "(";
  const int opts = tensor_options_start(args);
  const bool is_bernoulli_p = schema.name() == "aten::bernoulli" && schema.overload_name() == "p";
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (is_out_arg(a)) continue;
    if (opts >= 0 && static_cast<int>(i) >= opts && static_cast<int>(i) < opts + 4) continue;
    out << (a.kwarg_only() ? "*" : "") << a.type()->str() << " " << a.name();
    if (a.default_value()) {
      out << "=" << *a.default_value();
    } else if (is_bernoulli_p && a.name() == "p") {
      out << "=" << c10::IValue(0.5);  // see the Note: bernoulli_.float has p=0.5
    }
    out << ",";
  }
  out << ")->(";
  for (const auto& r : schema.returns()) out << r.type()->str() << ",";
  for (int i : appended_mutated_args_impl(schema)) out << args[i].type()->str() << ",";
  out << ")";
  return out.str();
}

void index_functional_candidate(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  for (const auto& a : schema.arguments()) {
    if (is_write(a)) return;
  }
  auto sig = normalized_signature(schema);
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.by_signature[sig].push_back(op);
}

void forget_functional_candidate(const c10::OperatorName& name) {
  auto& table = candidates();
  std::lock_guard<std::mutex> lock(table.mutex);
  for (auto& [sig, ops] : table.by_signature) {
    ops.erase(std::remove_if(ops.begin(), ops.end(),
                             [&](const c10::OperatorHandle& op) {
                               return op.operator_name() == name;
                             }),
              ops.end());
  }
}

OpInfo classify(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  OpInfo info;
  info.name = full_name(op.operator_name());
  info.has_tensor_args = has_tensor_arguments(schema);
  const std::string& name = schema.name();
  info.wraps_plain_input =
      name == "aten::lift" || name == "aten::lift_fresh" || name == "aten::lift_fresh_copy";
  info.composite_whole = intercepts_composite_whole(op);

  bool writes = false;
  for (const auto& a : args) writes |= is_write(a);
  bool returns_alias = false;
  for (const auto& r : schema.returns()) returns_alias |= r.alias_info() != nullptr;

  if (name == "aten::set_") {
    info.kind = OpKind::Unsupported;
    info.unsupported_reason =
        "set_ swaps the storage of a tensor, which functionalize does not support yet. Use "
        "the source tensor directly, or copy_ into the destination";
    return info;
  }
  if (name == "aten::native_batch_norm" && schema.overload_name().empty()) {
    // See Note [Kernel: native_batch_norm].
    info.kind = OpKind::BatchNorm;
    info.functional_op =
        c10::Dispatcher::singleton().findOp({"aten::_native_batch_norm_legit_functional", ""});
    TORCH_INTERNAL_ASSERT(info.functional_op.has_value(),
                          "aten::_native_batch_norm_legit_functional is not registered");
    return info;
  }
  const bool resize_like = name == "aten::resize_" || name == "aten::resize_as_";
  if (writes && op.hasTag(at::Tag::inplace_view) && !resize_like) {
    auto view = find_functional(normalized_signature(schema));
    if (!view) {
      info.kind = OpKind::Unsupported;
      info.unsupported_reason = "in-place view op with no out-of-place view op to replay";
      return info;
    }
    info.kind = OpKind::InplaceView;
    plan_view(*view, info);
    return info;
  }
  if (writes) {
    info.foreach_inplace = name.rfind("aten::_foreach_", 0) == 0 && schema.returns().empty();
    plan_mutable(op, info);
    if (resize_like && info.kind == OpKind::Mutable) info.kind = OpKind::Resize;
    return info;
  }
  if (returns_alias) {
    if (schema.name().rfind("aten::", 0) != 0) {
      info.kind = OpKind::Unsupported;
      info.unsupported_reason =
          "the op returns an alias of an input, and functionalize only knows how to replay "
          "and invert ATen's own view ops. Make the custom op return a new tensor (clone)";
      return info;
    }
    info.kind = OpKind::View;
    if (name == "aten::_reshape_alias") {
      // reshape emits _reshape_alias(size, stride) only where view(size) is legal; its stride
      // argument is eager's, which a *_copy value does not have. Replay it as view(size).
      auto view = c10::Dispatcher::singleton().findOp({"aten::view", ""});
      TORCH_INTERNAL_ASSERT(view.has_value(), "aten::view is not registered");
      plan_view(*view, info);
      info.replay_arg_count = 1;
      return info;
    }
    plan_view(op, info);
    return info;
  }
  if (name == "aten::_unsafe_view") {
    // Its schema says "fresh tensor", but composite out= kernels (kron, matmul, ...) write into
    // out through _unsafe_view(out, shape): it must stay an alias or those writes are lost.
    // Replayed as itself in both modes (no alias annotation, so not a view op to tracers) and
    // inverted like view. torch's own functionalization treats it the same way.
    info.kind = OpKind::View;
    info.view_op = op;
    info.copy_op = op;
    info.inverse = find_inverse({"aten::view", ""});
    return info;
  }
  info.kind = OpKind::Functional;
  return info;
}

}  // namespace tfz::detail
