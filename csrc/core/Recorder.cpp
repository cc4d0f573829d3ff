// Recorder: call arguments and results to graph values; the thread's recording state.
// See core/Recorder.h.
#include "core/Recorder.h"

#include "core/DispatchKey.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

// Note [Capture: how ops are recorded]
// capture(f) functionalizes f exactly as functionalize does and records, as it goes, each op the
// engine runs on inner (plain) tensors: the ops a tracer's dispatch mode below our key would see,
// which is what make_fx(functionalize(f)) turns into a graph through Python proxies at ~500 us a
// node. Recording happens at a dispatch key of its own (kRecordKey), in C++:
//  - the capture includes kRecordKey in the thread's TLS; a layer hides it while user code runs
//    on wrappers and an inner call unhides it, exactly like the Python key
//    (Note [Layer: TLS scheme]), so only inner ops are seen, and bookkeeping on meta tensors
//    (MetaComputeGuard) never is; the input epilogue runs in the caller's TLS after the layer, so
//    it is recorded last, as under make_fx;
//  - the record kernel lets CompositeImplicitAutograd ops decompose (their parts are recorded,
//    as make_fx sees them) and records every other op whole: it names its tensor arguments,
//    runs it with kRecordKey excluded (the kernels it calls are its implementation, not the
//    program) and names its results;
//  - a tensor is named by its TensorImpl: inputs first, then each op result; a tensor no op made
//    and no input is (a closure constant, a torch.tensor literal) becomes a graph constant;
//  - fast paths that would mutate an inner value in place are off (ops_are_recorded()).
// Rejected: recording at each place our kernels call an op (some 40 call sites and every at::
// call they make, easy to miss one), and a Python TorchDispatchMode (the cost we are removing).

namespace {
thread_local Recorder* tls_recorder = nullptr;
}  // namespace

Recorder* active_recorder() {
  return tls_recorder;
}

void set_active_recorder(Recorder* recorder) {
  tls_recorder = recorder;
}

bool ops_are_recorded() {
  return tls_recorder != nullptr || c10::impl::TorchDispatchModeTLS::stack_len() > 0;
}

bool traced_without_guards() {
  return c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
         c10::impl::TorchDispatchModeTLS::any_modes_set() ||
         c10::impl::tls_local_dispatch_key_set().included_.has_any(c10::python_ks);
}

bool calls_may_be_traced() {
  return tls_recorder != nullptr || traced_without_guards();
}

RecordingGuard::RecordingGuard(Recorder& recorder)
    : saved_tls_(c10::impl::tls_local_dispatch_key_set()) {
  TORCH_CHECK(tls_recorder == nullptr,
              "capture: a capture is already recording on this thread; nested capture calls are "
              "not supported. Capture the outer function only.");
  auto tls = saved_tls_;
  tls.included_ = tls.included_.add(kRecordKey);
  tls.excluded_ = tls.excluded_.remove(kRecordKey);
  c10::impl::_force_tls_local_dispatch_key_set(tls);
  tls_recorder = &recorder;
}

RecordingGuard::~RecordingGuard() {
  c10::impl::_force_tls_local_dispatch_key_set(saved_tls_);
  tls_recorder = nullptr;
}

Recorder::Recorder(const std::vector<at::Tensor>& inputs) {
  graph_.grad_enabled = c10::GradMode::is_enabled();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto source = ValueSource{ValueSource::Kind::kInput, static_cast<int64_t>(i)};
    if (inputs[i].defined()) {
      graph_.inputs.push_back(define(inputs[i], source));
    } else {
      graph_.inputs.push_back(static_cast<int64_t>(graph_.values.size()));
      graph_.values.push_back(source);
    }
  }
}

int64_t Recorder::define(const at::Tensor& t, ValueSource source) {
  const auto id = static_cast<int64_t>(graph_.values.size());
  graph_.values.push_back(source);
  auto [it, fresh] = ids_.try_emplace(t.unsafeGetTensorImpl(), id);
  if (fresh) {
    pinned_.emplace_back(t.getIntrusivePtr());
  } else {
    it->second = id;  // an in-place op's result: later reads see the node that wrote it
  }
  return id;
}

int64_t Recorder::value_of(const at::Tensor& t) {
  auto it = ids_.find(t.unsafeGetTensorImpl());
  if (it != ids_.end()) return it->second;
  const auto index = static_cast<int64_t>(graph_.constants.size());
  graph_.constants.push_back(t);
  return define(t, ValueSource{ValueSource::Kind::kConstant, index});
}

namespace {

bool is_optional_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  for (const auto& e : v.toListRef()) {
    if (e.isTensor()) return true;
  }
  auto element = v.toList().elementType();
  const auto* opt = element->castRaw<c10::OptionalType>();
  return opt != nullptr && opt->getElementType()->kind() == c10::TypeKind::TensorType;
}

void check_concrete(const c10::IValue& v) {
  const auto symbolic = [](const c10::IValue& e) {
    return (e.isSymInt() && e.toSymInt().is_symbolic()) ||
           (e.isSymFloat() && e.toSymFloat().is_symbolic());
  };
  bool any = symbolic(v);
  if (!any && v.isList()) {
    for (const auto& e : v.toListRef()) any = any || symbolic(e);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(!any,
                              "capture: symbolic sizes reached the recorder; capture records "
                              "concrete shapes only. Use make_fx(functionalize(f), "
                              "tracing_mode='symbolic') for symbolic shapes.");
}

}  // namespace

GraphArg Recorder::arg_of(const c10::IValue& v) {
  GraphArg arg;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) return arg;  // constant None
    arg.kind = GraphArg::Kind::kValue;
    arg.values.push_back(value_of(t));
    return arg;
  }
  if (v.isTensorList() || is_optional_tensor_list(v)) {
    arg.kind = GraphArg::Kind::kValueList;
    arg.optional_elements = !v.isTensorList();
    for (const auto& e : v.toListRef()) {
      arg.values.push_back(e.isTensor() && e.toTensor().defined() ? value_of(e.toTensor()) : -1);
    }
    return arg;
  }
  check_concrete(v);
  arg.constant = v;
  return arg;
}

GraphNode Recorder::begin(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  GraphNode node{op, {}, {}};
  node.grad_enabled = c10::GradMode::is_enabled();
  node.args.reserve(n);
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n); it != stack.end(); ++it) {
    node.args.push_back(arg_of(*it));
  }
  static const c10::OperatorName pack_padded{"aten::_pack_padded_sequence", ""};
  if (C10_UNLIKELY(op.operator_name() == pack_padded) && n == 3 && stack.end()[-2].isTensor()) {
    packed_lengths_ = stack.end()[-2].toTensor();  // guarded once the node is appended
  }
  if (C10_UNLIKELY(op.hasTag(at::Tag::dynamic_output_shape))) {
    // See Note [Capture: guards on values read]: index.Tensor with a mask.
    index_had_mask_ = false;
    const c10::IValue& indices = stack.back();
    if (n == 2 && indices.isList()) {
      for (const c10::IValue& i : indices.toListRef()) {
        index_had_mask_ |= i.isTensor() && (i.toTensor().scalar_type() == c10::kBool ||
                                            i.toTensor().scalar_type() == c10::kByte);
      }
    }
  }
  return node;
}

void Recorder::finish(GraphNode node, const torch::jit::Stack& stack) {
  const size_t n = node.op.schema().returns().size();
  const auto index = static_cast<int64_t>(graph_.nodes.size());
  node.returns.reserve(n);
  for (size_t r = 0; r < n; ++r) {
    const c10::IValue& v = stack[stack.size() - n + r];
    GraphArg ret;
    if (v.isTensor() && v.toTensor().defined()) {
      ret.kind = GraphArg::Kind::kValue;
      ret.values.push_back(define(
          v.toTensor(), ValueSource{ValueSource::Kind::kNode, index, static_cast<int64_t>(r)}));
    } else if (v.isTensorList()) {
      ret.kind = GraphArg::Kind::kValueList;
      int64_t k = 0;
      for (const auto& e : v.toTensorVector()) {
        ret.values.push_back(
            define(e, ValueSource{ValueSource::Kind::kNode, index, static_cast<int64_t>(r), k++}));
      }
    } else {
      ret.constant = v;
    }
    node.returns.push_back(std::move(ret));
  }
  graph_.nodes.push_back(std::move(node));
  static const c10::OperatorName allclose{"aten::allclose", ""};
  const auto& op = graph_.nodes.back().op;
  if (C10_UNLIKELY(op.hasTag(at::Tag::data_dependent_output) ||
                   op.hasTag(at::Tag::dynamic_output_shape) || op.operator_name() == allclose)) {
    guard_(graph_.nodes.size() - 1, stack);
  } else if (C10_UNLIKELY(n == 1 && (stack.back().isDouble() || stack.back().isInt() ||
                                     stack.back().isBool()))) {
    guard_scalar_op_(graph_.nodes.size() - 1, stack);
  }
  if (C10_UNLIKELY(packed_lengths_.defined())) {
    const at::Tensor lengths = std::move(packed_lengths_);
    packed_lengths_ = at::Tensor();
    guard_values(lengths, "aten::_pack_padded_sequence's lengths");
  }
}

void Recorder::guard_values(const at::Tensor& t, const std::string& what) {
  at::Tensor captured;
  {
    c10::impl::ExcludeDispatchKeyGuard not_recorded(kRecordKey);
    captured = t.detach().clone();
  }
  auto& d = c10::Dispatcher::singleton();
  static const auto op = d.findSchemaOrThrow("tfz::_guard_equal", "");
  GraphNode guard{op, {}, {}};
  guard.grad_enabled = c10::GradMode::is_enabled();
  GraphArg value, constant, expected, name;
  value.kind = constant.kind = GraphArg::Kind::kValue;
  value.values.push_back(value_of(t));
  constant.values.push_back(value_of(captured));
  expected.constant = c10::IValue(true);
  name.constant = c10::IValue(what + " (the values an op read on the host)");
  guard.args = {value, constant, expected, name};
  graph_.nodes.push_back(std::move(guard));
}

// An op whose arguments are all tensors that returns a Python number (q_scale, q_zero_point,
// _nnz, the bool of _nested_tensor_from_mask_left_aligned): the program goes on with the number
// as a constant, so the graph calls the op again on replay and compares.
void Recorder::guard_scalar_op_(size_t index, const torch::jit::Stack& stack) {
  const GraphNode& read = graph_.nodes[index];
  GraphArg tensors;
  tensors.kind = GraphArg::Kind::kValueList;
  for (const GraphArg& a : read.args) {
    if (a.kind != GraphArg::Kind::kValue || a.values.size() != 1) return;
    tensors.values.push_back(a.values[0]);
  }
  if (tensors.values.empty()) return;
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("tfz::_guard_scalar_op", "");
  const auto& name = read.op.operator_name();
  GraphNode guard{op, {}, {}};
  guard.grad_enabled = read.grad_enabled;
  GraphArg op_name, overload, expected, what;
  op_name.constant = c10::IValue(name.name);
  overload.constant = c10::IValue(name.overload_name);
  expected.constant = c10::IValue(stack.back().toScalar());
  what.constant = c10::IValue(c10::toString(name));
  guard.args = {tensors, op_name, overload, expected, what};
  graph_.nodes.push_back(std::move(guard));
}

// Note [Capture: guards on values read]
// A program that reads a value out of a tensor (x.item(), bool(x) behind `if x.sum() > 0:`,
// int(x), float(x), torch.equal) continues in Python with that value, so the ops it records
// afterwards hold it as a constant: replayed on an input that gives another value, the graph
// computed the captured branch, step count or shift, silently wrong (make_fx raises at the read
// instead). Likewise a result whose sizes depend on values (nonzero, masked_select, boolean
// indexing) fixes the sizes of every op after it. So the recorder follows each such read with a
// guard node: tfz::_guard_value(x, value, what) after _local_scalar_dense,
// tfz::_guard_equal(a, b, result, what) after equal, tfz::_guard_allclose after allclose (the
// one other ATen op that returns a Python value computed from tensor values; its kernel is not a
// decomposition we see), and tfz::_guard_sizes(result, sizes, what)
// after an op tagged dynamic_output_shape (index.Tensor only with a boolean index). On replay a
// guard recomputes what was read and raises, naming the read and both values, when it differs:
// the graph is right on every input it accepts. Guards have an effect of their own, so dead-node
// elimination keeps them (Note [Capture: dead nodes]), and they replay on meta as size checks
// only. Rejected: symbolic values (capture records concrete programs; a program that branches
// on a value needs both branches, which only torch.cond gives), and refusing reads (optimizers
// that are not capturable read their step count with .item(), and their graphs are right
// whenever the count is the one captured). Reads no tag announces get guards too: an op with one
// tensor argument that returns a number (q_scale, _nnz) is called again and compared
// (tfz::_guard_scalar_op), and the ops that read an integer tensor on the host to choose their
// results' sizes (tensor_split's tensor of indices, _pack_padded_sequence's lengths) guard its
// values (tfz::_guard_equal with a constant copy).
void Recorder::guard_(size_t index, const torch::jit::Stack& stack) {
  auto& d = c10::Dispatcher::singleton();
  static const c10::OperatorName local_scalar{"aten::_local_scalar_dense", ""},
      equal{"aten::equal", ""}, allclose{"aten::allclose", ""},
      index_tensor{"aten::index", "Tensor"};
  const GraphNode& read = graph_.nodes[index];
  const auto& name = read.op.operator_name();
  const std::string what = c10::toString(name);
  auto constant = [](c10::IValue v) {
    GraphArg a;
    a.constant = std::move(v);
    return a;
  };
  GraphNode guard{read.op, {}, {}};
  guard.grad_enabled = read.grad_enabled;
  if (name == local_scalar) {
    static const auto op = d.findSchemaOrThrow("tfz::_guard_value", "");
    guard.op = op;
    guard.args = {read.args[0], constant(stack.back()),
                  constant(what + ": x.item(), bool(x), int(x), float(x) or tolist()")};
  } else if (name == equal) {
    static const auto op = d.findSchemaOrThrow("tfz::_guard_equal", "");
    guard.op = op;
    guard.args = {read.args[0], read.args[1], constant(stack.back()), constant(what)};
  } else if (name == allclose) {
    static const auto op = d.findSchemaOrThrow("tfz::_guard_allclose", "");
    guard.op = op;
    guard.args = {read.args[0], read.args[1],           read.args[2],  read.args[3],
                  read.args[4], constant(stack.back()), constant(what)};
  } else {
    // index.Tensor's sizes depend on values only through a boolean (or uint8) mask.
    if (name == index_tensor && !index_had_mask_) return;
    const auto& returns = read.returns;
    if (returns.empty() || returns[0].kind != GraphArg::Kind::kValue) return;
    static const auto op = d.findSchemaOrThrow("tfz::_guard_sizes", "");
    guard.op = op;
    const at::Tensor result = stack[stack.size() - returns.size()].toTensor();
    GraphArg value;
    value.kind = GraphArg::Kind::kValue;
    value.values = returns[0].values;
    guard.args = {value, constant(c10::IValue(result.sym_sizes())), constant(what)};
  }
  graph_.nodes.push_back(std::move(guard));
}

Graph Recorder::take(const std::vector<at::Tensor>& outputs) {
  for (const auto& t : outputs) {
    GraphArg out;
    if (t.defined()) {
      out.kind = GraphArg::Kind::kValue;
      out.values.push_back(value_of(t));
    }
    graph_.outputs.push_back(std::move(out));
  }
  ids_.clear();
  pinned_.clear();
  return std::move(graph_);
}

}  // namespace tfz::detail
