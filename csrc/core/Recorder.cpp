// Recorder: call arguments and results to graph values; the thread's recording state.
// See core/Recorder.h.
#include "core/Recorder.h"

#include "core/DispatchKey.h"

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
  node.args.reserve(n);
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n); it != stack.end(); ++it) {
    node.args.push_back(arg_of(*it));
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
