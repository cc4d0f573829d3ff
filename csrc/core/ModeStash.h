// The thread's dispatch modes (a tracer's) set aside while a wrapper subclass's __torch_dispatch__
// runs inside a layer, and put back by InnerCallGuard for inner calls. Defined in Layer.cpp.
// See Note [Kernel: wrapper subclasses].
#pragma once

#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <optional>

namespace tfz::detail {

/// This thread's stashed modes (empty: none stashed).
std::optional<c10::impl::TorchDispatchModeTLS>& stashed_dispatch_modes();

}  // namespace tfz::detail
