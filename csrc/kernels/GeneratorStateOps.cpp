// tfz::_generator_state and tfz::_set_generator_state: a random generator's state read and set as
// graph ops, where a traced or captured f seeded or set it outside the dispatcher.
// See Note [Graphs: generator state set outside the dispatcher] (generator_watch.py).
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <mutex>
#include <optional>

namespace {

// `generator`, or the default one of `device`.
at::Generator generator_named(const std::optional<at::Generator>& generator, c10::Device device) {
  return generator.has_value() ? *generator : at::globalContext().defaultGenerator(device);
}

at::Tensor generator_state(const std::optional<at::Generator>& generator, c10::Device device) {
  at::Generator gen = generator_named(generator, device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const at::Tensor& state, const std::optional<at::Generator>& generator,
                         c10::Device device) {
  at::Generator gen = generator_named(generator, device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// A fake or meta state (a subgraph run to find its schema, a replay on meta) sets nothing.
void set_no_state_on_meta(const at::Tensor&, const std::optional<at::Generator>&, c10::Device) {}

}  // namespace

// Tagged as draws: dead-node elimination keeps them and no pass moves a draw across them.
TORCH_LIBRARY_FRAGMENT(tfz, m) {
  m.def("_generator_state(Generator? generator, Device device) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  m.def("_set_generator_state(Tensor state, Generator? generator, Device device) -> ()",
        {at::Tag::nondeterministic_seeded});
}

TORCH_LIBRARY_IMPL(tfz, CompositeExplicitAutograd, m) {
  m.impl("_generator_state", &generator_state);
  m.impl("_set_generator_state", &set_generator_state);
}

TORCH_LIBRARY_IMPL(tfz, Meta, m) {
  m.impl("_set_generator_state", &set_no_state_on_meta);
}
