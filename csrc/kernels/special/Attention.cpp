// The memory-efficient attention row: without views, an attention bias whose rows a view of a
// padded buffer kept aligned reaches the CUDA kernel as a compact copy; keys, values and bias are
// padded to aligned rows instead. See Note [Kernel: efficient attention's bias without views].
#include "kernels/special/Rows.h"

#include "core/Conversions.h"
#include "kernels/Handlers.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <array>
#include <limits>
#include <string>

namespace tfz::detail {

// Note [Kernel: efficient attention's bias without views]
// scaled_dot_product_attention (a composite) hands the memory-efficient CUDA kernel its mask as a
// view: a mask whose row stride is not a multiple of 8 elements is padded to one and sliced back
// (torch's pad_bias), so the kernel reads aligned rows. Without views the slice is a slice_copy,
// a compact tensor whose rows are again unaligned, which the kernel refuses ("attn_bias is not
// correctly aligned") for any mask over a number of keys that is not a multiple of 8 (padding
// and causal masks of Hugging Face models). So the keys, the values and the bias get 8-aligned
// rows of their own: the sequence of keys is padded
// with zero keys whose bias is -inf, so each query's softmax gives them weight exactly 0 and the
// output and log-sum-exp are eager's; the backward pads the same way and slices the key, value and
// bias gradients back (slice_copy). With dropout the kernel draws its mask over the padded keys,
// which is another mask than eager's, so dropout_p > 0 is refused by name. With views kept, eager's
// aligned view is the value and nothing changes.
// Rejected: routing such calls to the math backend (another algorithm: rounding differs from
// eager's kernel, and the graphs would hold softmax and matmuls instead of the kernel eager runs),
// and taking scaled_dot_product_attention whole (under make_fx its decomposition is traced on the
// wrappers anyway, which gives the compact copy again).
bool is_efficient_attention(const c10::OperatorHandle& op) {
  return named(op, "aten::_scaled_dot_product_efficient_attention", "") ||
         named(op, "aten::_scaled_dot_product_efficient_attention_backward", "");
}

namespace {

constexpr int64_t kRowAlignment = 8;  // elements, as torch's pad_bias

bool rows_unaligned(const c10::IValue& bias) {
  if (!bias.isTensor()) return false;
  const at::Tensor& t = bias.toTensor();
  if (!t.defined() || maybe_get_impl(t) == nullptr || t.dim() < 2) return false;
  const at::Tensor value = sync_and_unwrap(t);
  for (int64_t d = 0; d + 1 < value.dim(); ++d) {
    if (value.stride(d) % kRowAlignment != 0) return true;
  }
  return false;
}

at::Tensor padded_keys(const at::Tensor& t, int64_t pad) {  // (B, H, S, E): S grows by pad
  return at::constant_pad_nd(t, {0, 0, 0, pad}, 0);
}

}  // namespace

void efficient_attention_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                                const Layer& layer) {
  const bool backward = named(op, "aten::_scaled_dot_product_efficient_attention_backward", "");
  const size_t num_args = op.schema().arguments().size();
  const auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  // Forward: (query, key, value, attn_bias, compute_log_sumexp, dropout_p, ...); backward:
  // (grad_out, query, key, value, attn_bias, out, logsumexp, seed, offset, dropout_p, ...).
  const int64_t key_index = backward ? 2 : 1;
  const int64_t dropout_index = backward ? 9 : 5;
  if (layer.reapply_views || !rows_unaligned(*(first + key_index + 2))) {
    return generic_kernel(info, op, stack, layer);
  }
  const at::Tensor bias = (first + key_index + 2)->toTensor();
  const int64_t keys = bias.size(-1);
  const int64_t pad = (kRowAlignment - keys % kRowAlignment) % kRowAlignment;
  TORCH_CHECK_NOT_IMPLEMENTED(
      (first + dropout_index)->toDouble() == 0.0, "functionalize: ", op.operator_name(),
      ": without views an attention mask over ", keys,
      " keys (not a multiple of 8) reaches the memory-efficient CUDA kernel unaligned, and with "
      "dropout_p > 0 its padded form draws another dropout mask than eager. Use "
      "remove=\"mutations\", dropout_p=0, or a mask over a multiple of 8 keys "
      "(Note [Kernel: efficient attention's bias without views]).");
  *(first + key_index) = padded_keys((first + key_index)->toTensor(), pad);
  *(first + key_index + 1) = padded_keys((first + key_index + 1)->toTensor(), pad);
  *(first + key_index + 2) =
      at::constant_pad_nd(bias, {0, pad}, -std::numeric_limits<double>::infinity());
  generic_kernel(info, op, stack, layer);
  if (!backward) return;  // output (B, H, L, E) and log-sum-exp do not depend on the keys' count
  // (grad_query, grad_key, grad_value, grad_bias): the keys' rows and the bias' columns back.
  auto results = stack->end() - 4;
  const std::array<int64_t, 3> dims{2, 2, -1};
  for (size_t i = 0; i < dims.size(); ++i) {
    c10::IValue& grad = *(results + 1 + static_cast<std::ptrdiff_t>(i));
    if (grad.isTensor() && grad.toTensor().defined()) {
      grad = at::slice_copy(grad.toTensor(), dims[i], 0, keys);
    }
  }
}

}  // namespace tfz::detail
