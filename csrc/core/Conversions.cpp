// Wrapper construction and the sync-and-unwrap conversion.
#include "core/Conversions.h"

#include "core/Layer.h"
#include "core/LayerAutograd.h"
#include "core/Recording.h"

namespace tfz::detail {

at::Tensor make_fresh_wrapper(const at::Tensor& value, int64_t layer_id) {
  // A nested tensor has no sizes a wrapper could report (torch's "Internal error:
  // NestedTensorImpl doesn't support sizes" before; torch.func fails the same way).
  TORCH_CHECK_NOT_IMPLEMENTED(
      !value.is_nested(),
      "functionalize: an op inside the function made a nested tensor (torch.nested, or "
      "nn.TransformerEncoder's fast path in eval mode with src_key_padding_mask), which "
      "functionalize does not support. Call that module outside the function or without the "
      "padding mask; torch.backends.mha.set_fastpath_enabled(False) avoids the nested path "
      "(padded positions then hold computed values where the fast path gives zeros).");
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
