// The seeded op's generator shown to the Python module's observer while a graph records the
// program. See Note [Graphs: generator state set outside the dispatcher] (generator_watch.py).
#include "kernels/WatchedDraws.h"

#include "core/Recording.h"
#include "kernels/RandomFills.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <optional>

namespace tfz::detail {

namespace {

std::atomic<DrawObserver> draw_observer{nullptr};

// The generator the op draws from: the one it names, else the default generator of the device of
// its first tensor argument or of its `device` argument (a factory), else the CPU's. Undefined
// for a device without default generators here (meta): nothing is drawn there.
at::Generator generator_of_call(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const size_t num_args = arguments.size();
  // A `device` argument names the generator's device before any tensor does: rand_like(x,
  // device="cuda") draws on CUDA, and tfz::_set_generator_state's state tensor is on the CPU.
  std::optional<c10::Device> device, tensor_device;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& value = stack[stack.size() - num_args + i];
    if (is_generator_arg(arguments[i]) && value.isGenerator()) return value.toGenerator();
    if (value.isDevice() && arguments[i].name() == "device") {
      device = value.toDevice();
    } else if (!tensor_device && value.isTensor() && value.toTensor().defined()) {
      tensor_device = value.toTensor().device();
    } else if (!tensor_device && value.isTensorList() && !value.toTensorList().empty()) {
      tensor_device = value.toTensorList().get(0).device();
    }
  }
  const c10::Device on = device.value_or(tensor_device.value_or(c10::Device(c10::kCPU)));
  if (!on.is_cpu() && !on.is_cuda()) return {};
  return at::globalContext().defaultGenerator(on);
}

std::string observe(const at::Generator& generator, bool before) {
  const DrawObserver observer = draw_observer.load();
  return observer == nullptr ? std::string() : observer(generator, before);
}

}  // namespace

void set_draw_observer(DrawObserver observer) {
  draw_observer.store(observer);
}

WatchedDraw::WatchedDraw(const OpInfo& info, const c10::OperatorHandle& op,
                         const torch::jit::Stack& stack) {
  if (C10_LIKELY(!info.seeded) || draw_observer.load() == nullptr || !ops_are_recorded()) return;
  generator_ = generator_of_call(op, stack);
  if (!generator_.defined()) return;
  uncaught_on_entry_ = std::uncaught_exceptions();
  const std::string refusal = observe(generator_, /*before=*/true);
  TORCH_CHECK_NOT_IMPLEMENTED(refusal.empty(), refusal);
}

WatchedDraw::~WatchedDraw() {
  if (C10_LIKELY(!generator_.defined()) || std::uncaught_exceptions() > uncaught_on_entry_) return;
  observe(generator_, /*before=*/false);  // refuses nothing: the op has run
}

}  // namespace tfz::detail
