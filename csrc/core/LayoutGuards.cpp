// Layout guards of make_fx graphs. See core/LayoutGuards.h.
#include "core/LayoutGuards.h"

#include "core/Layer.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace tfz::detail {

void record_layout_guard(const at::Tensor& t, const std::string& what,
                         const std::optional<at::Tensor>& shares_with) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tfz::_guard_layout", "")
                             .typed<void(const at::Tensor&, at::IntArrayRef, int64_t, int64_t,
                                         const std::optional<at::Tensor>&, c10::string_view)>();
  // Symbolic sizes (tracing_mode="symbolic"): the epilogue's metadata ops take the input's own
  // symbolic offset, and nothing was specialized on a concrete layout.
  if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      t.storage().sym_nbytes().is_heap_allocated()) {
    return;
  }
  InnerCallGuard guard;
  op.call(t, t.strides(), t.storage_offset(), static_cast<int64_t>(t.storage().nbytes()),
          shares_with, what);
}

void record_layout_guard(const at::Tensor& input, size_t index,
                         const std::optional<at::Tensor>& shares_with) {
  record_layout_guard(input, "input " + std::to_string(index), shares_with);
}

void guard_traced_input(const AliasStorage& storage) {
  if (auto traced = storage.take_traced_input()) record_layout_guard(traced->first, traced->second);
}

}  // namespace tfz::detail
