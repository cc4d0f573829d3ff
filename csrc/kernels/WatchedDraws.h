// Draws from random generators while a graph records the program: the kernel shows each seeded
// op's generator to an observer (the Python module's) before and after the op runs, so that a
// change of its state made outside the dispatcher is seen where it matters.
// See Note [Graphs: generator state set outside the dispatcher] (generator_watch.py).
#pragma once

#include "core/OpSchemaInfo.h"

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace tfz::detail {

/// Shown the generator a seeded op draws from, `before` it runs and after it returned. Returns a
/// message to refuse the op with (raised as NotImplementedError), or an empty string. Set by the
/// Python module at import; unset (C++ API only), nothing watches.
using DrawObserver = std::string (*)(const at::Generator& generator, bool before);
void set_draw_observer(DrawObserver observer);

/// Around one call of a seeded op while ops are recorded: shows its generator to the observer on
/// construction (which raises its refusal) and, when the call returns without an exception, on
/// destruction. Inactive (one
/// flag test) for every other call.
class WatchedDraw {
 public:
  WatchedDraw(const OpInfo& info, const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  ~WatchedDraw();
  WatchedDraw(const WatchedDraw&) = delete;
  WatchedDraw& operator=(const WatchedDraw&) = delete;

 private:
  at::Generator generator_;  // undefined: not watched
  int uncaught_on_entry_ = 0;
};

}  // namespace tfz::detail
