// Registers the boxed kernel at our keys: per operator (so it beats Autograd and
// CompositeExplicitAutograd kernels) and as the fallback of every PrivateUse3 runtime key.
// Operators registered later (torch.library custom ops) are queued by a listener and registered
// on the next layer entry. See Note [Kernel: registration].
#include "kernels/Registration.h"

#include "core/DispatchKey.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace tfz::detail {

// Note [Kernel: registration]
// A backend fallback at AutogradPrivateUse3 would only see ops that have no Autograd kernel, and
// one at PrivateUse3 would lose to every CompositeExplicitAutograd kernel (transpose.int, t,
// alias, ...). So the kernel is registered directly for every operator, at every PrivateUse3
// runtime key (Sparse/Quantized/... too: while a layer includes the PrivateUse3 backend bit, a
// plain sparse tensor inside the function dispatches there, and a CompositeExplicitAutograd
// kernel must not run in place of its sparse kernel), which always wins
// (OperatorEntry::computeDispatchTableEntry, step 1), except CompositeImplicitAutograd ops: we
// leave those alone so they decompose into ops we do see (the few taken whole are rows of the
// special-op table, Note [Kernel: composites intercepted whole]).
// Tensor-free operators (factories) are also registered at the factory key, which every other op
// falls through (Note [Which dispatch key]).
// Operators registered after us arrive through an OpRegistrationListener. The dispatcher calls
// listeners with its mutex held, so registering from the callback would deadlock; the listener
// only queues names, and ensure_registered() (run on every layer entry) drains the queue.
// Each registration is kept for the life of the process (handles deliberately leaked: releasing
// them during static destruction would race with the dispatcher's own teardown).
// A custom op's schema can go away (its torch.library Library is destroyed) while our kernel stays
// registered, and its name can be defined again with another schema. Every classification is
// therefore tagged with schema_epoch(), which the listener bumps on each deregistration: a kernel
// whose tag is old classifies again on its next call (a process that never deregisters pays one
// relaxed atomic load per op), and drain() drops the old op from the candidate table. Redefining
// an op while another thread is calling it is not supported (as in torch itself). Without the
// tag, a redefined op would run with the old schema's plan (argument indices) and crash.
// Rejected: one boxed fallback, the shape of torch's own Functionalize key (a functionality key
// of its own, which no Autograd or CompositeExplicitAutograd kernel fills; borrowed keys are
// filled, as above), and a fixed list of ops, which would miss every operator not on it, custom
// ops included.

namespace {

class OpKernel final : public c10::OperatorKernel {
 public:
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    // Double-checked rather than std::call_once: libstdc++'s call_once writes two thread_locals
    // and calls pthread_once on every call, which showed up per op under callgrind.
    if (classified_at_.load(std::memory_order_acquire) != schema_epoch() + 1) classify(op);
    run_boxed_kernel(plan_, op, ks, stack);
  }

 private:
  void classify(const c10::OperatorHandle& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t epoch = schema_epoch();
    if (classified_at_.load(std::memory_order_relaxed) == epoch + 1) return;
    plan_ = plan_for_kernel(op);
    classified_at_.store(epoch + 1, std::memory_order_release);
  }

  std::atomic<uint64_t> classified_at_{0};  // schema_epoch() + 1 when plan_ was computed; 0: never
  std::mutex mutex_;
  KernelPlan plan_;
};

std::atomic<uint64_t> g_schema_epoch{0};

struct Registry {
  std::mutex mutex;
  std::vector<c10::OperatorName> pending;  // filled by the listener, drained by drain()
  std::unordered_set<c10::OperatorName> registered;
  std::vector<c10::RegistrationHandleRAII> handles;
  std::vector<c10::OperatorName> deregistered;  // filled by the listener, drained by drain()
  std::unordered_map<c10::OperatorName, std::pair<uint64_t, KernelPlan>>
      fallback_plans;                // epoch, plan
  std::vector<std::string> unboxed;  // ops registered with an unboxed kernel, "name.overload"
};

Registry& registry() {
  static auto* r = new Registry();  // leaked on purpose, see the Note
  return *r;
}

class Listener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.pending.push_back(op.operator_name());
  }
  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.deregistered.push_back(op.operator_name());
    g_schema_epoch.fetch_add(1, std::memory_order_acq_rel);
  }
};

// The fallback serves operators not (yet) registered per op, e.g. a custom op called before the
// next layer entry drained it.
void fallback_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                     torch::jit::Stack* stack) {
  auto& r = registry();
  const uint64_t epoch = schema_epoch();
  const KernelPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.fallback_plans.find(op.operator_name());
    if (it != r.fallback_plans.end() && it->second.first == epoch) {
      plan = &it->second.second;  // map nodes are stable
    }
  }
  if (plan == nullptr) {
    KernelPlan computed = plan_for_kernel(op);  // outside our lock, like every dispatcher call
    std::lock_guard<std::mutex> lock(r.mutex);
    auto& slot = r.fallback_plans[op.operator_name()];
    slot = {epoch, std::move(computed)};
    plan = &slot.second;
  }
  run_boxed_kernel(*plan, op, ks, stack);
}

void check_keys_are_free() {
  auto& d = c10::Dispatcher::singleton();
  for (auto key : {kAutogradKey, kBackendKey, kFactoryKey}) {
    auto taken = d.getRegistrationsForDispatchKey(key);
    TORCH_CHECK(taken.empty(), "functionalize: dispatch key ", key,
                " is already used by another library (e.g. kernel for ", taken.front(),
                "). torch-functionalize borrows AutogradPrivateUse3, PrivateUse3 and DeferredInit "
                "(see Note [Which dispatch key] in csrc/core/DispatchKey.h); load only one "
                "library that uses them.");
  }
}

void register_fallbacks_and_listener() {
  check_keys_are_free();
  auto& d = c10::Dispatcher::singleton();
  auto& r = registry();
  for (auto key : kFallbackKeys) {
    r.handles.push_back(
        d.registerFallback(key, c10::KernelFunction::makeFromBoxedFunction<&fallback_kernel>(),
                           "torch_functionalize fallback"));
  }
  // Every op skips the factory key unless registered there (see Note [Which dispatch key]).
  r.handles.push_back(d.registerFallback(kFactoryKey, c10::KernelFunction::makeFallthrough(),
                                         "torch_functionalize factory-key fallthrough"));
  // Immediately reports every operator registered so far, then each new one.
  r.handles.push_back(d.addRegistrationListener(std::make_unique<Listener>()));
}

void drain() {
  auto& r = registry();
  std::vector<c10::OperatorName> names, gone;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.pending.empty() && r.deregistered.empty()) return;
    names.swap(r.pending);
    gone.swap(r.deregistered);
  }
  for (const auto& name : gone) forget_functional_candidate(name);
  auto& d = c10::Dispatcher::singleton();
  std::vector<c10::OperatorHandle> ops;
  for (const auto& name : names) {
    auto op = d.findOp(name);
    if (op && op->hasSchema()) ops.push_back(*op);
  }
  // All candidates first, so classification (lazy, on first call) sees the full table.
  for (const auto& op : ops) index_functional_candidate(op);
  // Our mutex is never held while calling into the dispatcher: the listener takes the two locks
  // in the other order (dispatcher first).
  std::vector<c10::OperatorHandle> fresh;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& op : ops) {
      if (!is_intercepted(op)) continue;
      if (r.registered.insert(op.operator_name()).second) fresh.push_back(op);
    }
  }
  std::vector<c10::RegistrationHandleRAII> handles;
  auto register_at = [&](const c10::OperatorHandle& op, c10::DispatchKey key,
                         const std::optional<c10::KernelFunction>& unboxed) {
    handles.push_back(d.registerImpl(
        op.operator_name(), key,
        unboxed ? *unboxed
                : c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<OpKernel>()),
        std::nullopt, nullptr, "torch_functionalize per-op kernel"));
  };
  std::vector<std::string> unboxed_names;
  for (const auto& op : fresh) {
    // Frequent ops get an unboxed kernel (Note [Kernel: unboxed fast path]).
    const auto unboxed = unboxed_kernel(op);
    if (unboxed) unboxed_names.push_back(toString(op.operator_name()));
    for (auto key : kFallbackKeys) register_at(op, key, unboxed);
    if (!has_tensor_arguments(op.schema())) register_at(op, kFactoryKey, std::nullopt);
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& h : handles) r.handles.push_back(std::move(h));
  for (auto& n : unboxed_names) r.unboxed.push_back(std::move(n));
}

}  // namespace

uint64_t schema_epoch() {
  return g_schema_epoch.load(std::memory_order_acquire);
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, register_fallbacks_and_listener);
  drain();
}

KernelPlan plan_by_name(const std::string& name, const std::string& overload) {
  ensure_registered();
  auto op = c10::Dispatcher::singleton().findOp({name, overload});
  TORCH_CHECK(op.has_value(), "functionalize: no operator ",
              c10::toString(c10::OperatorName(name, overload)), " is registered.");
  return plan_for_kernel(*op);
}

std::vector<std::string> unboxed_registered_ops() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.unboxed;
}

size_t registered_op_count() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.registered.size();
}

}  // namespace tfz::detail
