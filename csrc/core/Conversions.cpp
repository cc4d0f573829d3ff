// Wrapper construction and the sync-and-unwrap conversion.
#include "core/Conversions.h"

#include "core/Layer.h"
#include "core/LayerAutograd.h"
#include "core/Recording.h"

namespace tfz::detail {

at::Tensor make_fresh_wrapper(const at::Tensor& value, int64_t layer_id) {
  return at::detail::make_tensor<FunctionalTensorImpl>(value, layer_id);
}

at::Tensor make_view_wrapper(const at::Tensor& view_value, const at::Tensor& base,
                             std::shared_ptr<const ViewMeta> step) {
  return at::detail::make_tensor<FunctionalTensorImpl>(view_value, *unsafe_get_impl(base),
                                                       std::move(step));
}

bool is_current_layer_wrapper(const at::Tensor& t) {
  const Layer* layer = current_layer();
  const auto* impl = maybe_get_impl(t);
  return layer != nullptr && impl != nullptr && impl->layer_id() == layer->id;
}

at::Tensor sync_and_unwrap(const at::Tensor& t) {
  auto* impl = maybe_get_impl(t);
  if (impl == nullptr) {
    // See Note [Autograd: saved outputs under a tracer] and
    // Note [Autograd: formula temporaries written in place].
    if (C10_UNLIKELY(t.unsafeGetTensorImpl()->autograd_meta() != nullptr || ops_are_recorded())) {
      if (auto traced = traced_saved_output(t)) return *std::move(traced);
    }
    return t;
  }
  impl->sync_();
  return impl->value();
}

}  // namespace tfz::detail
