// Functional companions for custom ops that mutate their arguments: registers, on first use, an
// op tfz_functional::<ns>__<name> that clones the written arguments, runs the original op on the
// clones and returns them. The row that uses it is in SpecialOps.cpp; see
// Note [Kernel: custom mutable ops].
#include "kernels/SpecialOps.h"

#include "core/Conversions.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

namespace tfz::detail {

namespace {

class CompanionKernel final : public c10::OperatorKernel {
 public:
  explicit CompanionKernel(c10::OperatorHandle original) : original_(std::move(original)) {
    const auto& args = original_.schema().arguments();
    for (size_t j = 0; j < args.size(); ++j) {
      if (is_written(args[j])) written_.push_back(j);
    }
    appended_ = appended_written_args(original_.schema());
  }

  void operator()(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet /*ks*/,
                  torch::jit::Stack* stack) {
    const size_t num_args = original_.schema().arguments().size();
    auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
    std::unordered_map<const c10::TensorImpl*, at::Tensor> clones;
    for (size_t j : written_) {
      transform_tensors(*(first + j), [&](const at::Tensor& t) {
        auto [it, fresh] = clones.try_emplace(t.unsafeGetTensorImpl());
        if (fresh) it->second = t.clone();
        return it->second;
      });
    }
    std::vector<c10::IValue> written_values(first, stack->end());
    original_.callBoxed(stack);
    for (int j : appended_) torch::jit::push(*stack, written_values[j]);
  }

 private:
  c10::OperatorHandle original_;
  std::vector<size_t> written_;
  std::vector<int> appended_;
};

c10::Argument without_alias(const c10::Argument& a) {
  return c10::Argument(a.name(), a.type(), a.real_type(), a.N(), a.default_value(), a.kwarg_only(),
                       std::nullopt);
}

// version > 1: the op was redefined with another schema; the companion gets a new name.
c10::FunctionSchema companion_schema(const c10::FunctionSchema& s, int version) {
  std::string name = s.name();
  const auto sep = name.find("::");
  name = "tfz_functional::" + name.substr(0, sep) + "__" + name.substr(sep + 2);
  if (version > 1) name += "__v" + std::to_string(version);
  std::vector<c10::Argument> args, returns;
  for (const auto& a : s.arguments()) args.push_back(without_alias(a));
  for (const auto& r : s.returns()) {
    returns.emplace_back("", r.type(), r.real_type(), std::nullopt, std::nullopt, false);
  }
  for (int j : appended_written_args(s)) {
    const auto& a = s.arguments()[j];
    returns.emplace_back("", a.type(), a.real_type(), std::nullopt, std::nullopt, false);
  }
  return c10::FunctionSchema(name, s.overload_name(), std::move(args), std::move(returns));
}

struct Companion {
  std::string original_schema;  // toString of the schema it was made for
  c10::OperatorHandle op;
  int version;
};

struct Companions {
  std::mutex mutex;
  std::unordered_map<c10::OperatorName, Companion> by_original;
  std::vector<c10::RegistrationHandleRAII> handles;
};

Companions& companions() {
  static auto* c = new Companions();  // leaked like every registration, see Registration.cpp
  return *c;
}

}  // namespace

c10::OperatorHandle functional_companion(const c10::OperatorHandle& op) {
  auto& c = companions();
  const std::string original_schema = c10::toString(op.schema());
  int version = 1;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_original.find(op.operator_name());
    if (it != c.by_original.end()) {
      if (it->second.original_schema == original_schema) return it->second.op;
      version = it->second.version + 1;  // redefined with another schema (see Registration.cpp)
    }
  }
  auto& d = c10::Dispatcher::singleton();
  auto schema = companion_schema(op.schema(), version);
  const c10::OperatorName name = schema.operator_name();
  std::vector<c10::RegistrationHandleRAII> handles;
  if (!d.findOp(name)) {
    handles.push_back(d.registerDef(std::move(schema), "torch_functionalize functional companion"));
    handles.push_back(d.registerImpl(
        name, c10::DispatchKey::CompositeExplicitAutograd,
        c10::KernelFunction::makeFromBoxedFunctor(std::make_unique<CompanionKernel>(op)),
        std::nullopt, nullptr, "torch_functionalize functional companion"));
  }
  auto handle = d.findOp(name);
  TORCH_INTERNAL_ASSERT(handle.has_value(), "companion ", name, " was not registered");
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& h : handles) c.handles.push_back(std::move(h));
  c.by_original.insert_or_assign(op.operator_name(), Companion{original_schema, *handle, version});
  return *handle;
}

}  // namespace tfz::detail
