// Rows for tensors that enter the program from outside the dispatcher's view: lift_fresh
// (torch.tensor(data) inside f) and cuDNN's cached dropout state.
// See Note [Kernel: lift_fresh].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/Recorder.h"
#include "core/ViewInverses.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tfz::detail {

// Note [Kernel: lift_fresh]
// torch.tensor(data) inside the function builds a plain tensor from Python data, then calls
// lift_fresh (or lift_fresh_copy) on it: the constant enters the program there. Its argument is
// plain, so the generic rule would pass it through and later mutations of the constant would stay
// in the program as in-place ops. The row marks its outputs for wrapping, as for factories
// (Note [Kernel: factories]); torch's own functionalization lifts them the same way.
// Rejected: planning lift_fresh by its schema, as a view of its plain argument (Tensor(a) ->
// Tensor(a)): with views kept it passes through as above, and without them it would be lifted
// like a captured tensor (Note [Kernel: views of captured tensors]), refusing writes to the
// function's own constant that eager allows.
bool is_lift(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name().name;
  return name == "aten::lift" || name == "aten::lift_fresh" || name == "aten::lift_fresh_copy";
}

void wrap_lifted(const c10::OperatorHandle& /*op*/, OpInfo& info) {
  info.wraps_plain_outputs = true;
}

// Note [Kernel: cuDNN's dropout state]
// cuDNN's RNN dropout keeps its RNG state in a buffer that ATen creates once per device with the
// factory _cudnn_init_dropout_state and caches for the process (get_dropout_state in cuDNN's
// RNN.cpp). When the first RNN call of the process runs inside f, that factory call comes to us;
// wrapped like any factory result, the cache would keep a wrapper past the call, and every later
// RNN call, inside functionalize or not, would meet an escaped tensor. Its result is ATen's RNG
// state, not a value of the program (cuDNN advances it as eager's generator advances), so the row
// leaves it plain. Rejected: wrapping it and unwrapping at the end of the call (the cache is
// ATen's, out of our reach; and it must outlive the call).
bool is_cudnn_dropout_state(const c10::OperatorHandle& op) {
  return op.operator_name().name == "aten::_cudnn_init_dropout_state";
}

void leave_plain(const c10::OperatorHandle& /*op*/, OpInfo& info) {
  info.wraps_plain_outputs = false;
}

}  // namespace tfz::detail
