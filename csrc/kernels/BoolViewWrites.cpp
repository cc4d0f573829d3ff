// In-place writes to a bool view of wider bytes (x.view(torch.bool) of a float x): the op runs on a
// byte-exact private copy where nothing records the program, and is refused by name in graphs
// where its functional form would turn unwritten bytes into 0 or 1.
// See Note [Kernel: bool views of other bytes].
#include "kernels/Handlers.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>

namespace tfz::detail {

// Note [Kernel: bool views of other bytes]
// Rule: v = x.view(torch.bool) of a wider x (float, complex, int32, int64) shows each byte of x as
// one bool whose byte may be neither 0 nor 1, and eager keeps those bytes: a write to some
// elements of v leaves the other bytes alone, and v.view(torch.uint8) reads them back as they
// are. So no byte a bool view shows may pass through a bool copy, which turns every byte it
// copies into 0 or 1 (x's other elements would come back as tiny floats, or all of x change).
// Cases:
//   "write to v" (this file): v[idx] = True (index_put_), masked_fill_ and the like write some
//     bytes only, and their functional variant starts from a copy of v. With views kept and
//     nothing recording the program (Note [Kernel: in-place on the inner value]), the in-place
//     op runs as called on a byte-exact private copy of v (cloned as uint8). A graph has no
//     functional op that keeps the bytes, and without views v's value is a copy, so there the
//     write is refused by name, unless the op overwrites every element with values of its own
//     (copy_, fill_, zero_: eager's bytes are then all 0 or 1 too; not pointwise ops in general,
//     some of which leave a bool unchanged).
//   "write through a view of v" (core/AliasStorage.cpp folded_, scatter_at): the scatter that
//     writes it back copies v first. With views kept, the inverses after the bool step scatter
//     the bytes as uint8 (a view of the same element size and geometry), which copies them as
//     they are. Without views the forward values are bool copies already: refused by name.
//   "v without views" (core/ViewMeta.cpp ViewMeta::bool_view_keeping_bytes): v's view_copy is a
//     bool clone. Untraced, v's value is the bytes' uint8 copy seen as bool (a view of that fresh
//     copy, which nothing else holds), so later reads see eager's bytes. A graph without views
//     has no op that reinterprets bytes as bool without a view, so traced values keep
//     view_copy's, and a view of such a value as another dtype, which would read them, is refused
//     by name (check_bool_bytes_read in kernels/ViewKernels.cpp).
//   copy_ of v onto itself returns at once, as in eager (Note [Kernel: copy_ onto itself]).
// A bool view of a 1-byte tensor (a uint8 mask seen as bool, a common idiom) is never refused:
// its bytes other than 0 and 1 (not valid bools for torch either) may become 1.
// Rejected: comparing a write's result bytes with the old ones afterwards (a write of True over a
// byte that was 0x3F and a byte left alone look the same); refusing writes through bool views in
// both modes (a view of the bytes costs nothing with views kept); refusing view(torch.bool) of
// other dtypes in graphs without views (a uint8 mask viewed as bool is common, its bytes 0 and 1).
bool is_bool_view_of_wider_bytes(const at::Tensor& wrapper) {
  if (C10_LIKELY(wrapper.scalar_type() != c10::kBool)) return false;
  auto* impl = maybe_get_impl(wrapper);
  return impl != nullptr && impl->alias_storage().base().itemsize() > 1;
}

std::optional<at::Tensor> write_bool_bytes_in_place(const OpInfo& info,
                                                    const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args,
                                                    const std::vector<c10::IValue>& inner,
                                                    const Layer& layer) {
  if (info.written.size() != 1 || info.written[0].is_out) return {};
  const auto& w = info.written[0];
  if (w.functional_return != 0 || !args[w.index].isTensor() || !inner[w.index].isTensor()) {
    return {};
  }
  const at::Tensor& value = inner[w.index].toTensor();
  if (!is_bool_view_of_wider_bytes(args[w.index].toTensor()) || value.layout() != c10::kStrided) {
    return {};
  }
  auto* impl = unsafe_get_impl(args[w.index].toTensor());
  if (!layer.reapply_views || !nothing_records(value)) {
    // Ops that overwrite every element of v with values of their own lose nothing: eager's
    // bytes are all 0 and 1 too. Not pointwise ops in general: some are no-ops on bool
    // (nan_to_num_ leaves eager's bytes alone).
    static const std::array<c10::OperatorName, 4> whole{
        c10::OperatorName{"aten::copy_", ""}, c10::OperatorName{"aten::fill_", "Scalar"},
        c10::OperatorName{"aten::fill_", "Tensor"}, c10::OperatorName{"aten::zero_", ""}};
    if (std::find(whole.begin(), whole.end(), op.operator_name()) != whole.end()) return {};
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      layer.reapply_views && nothing_records(value), "functionalize: ", info.name,
      " of a bool view of a ", impl->alias_storage().base().scalar_type(),
      " tensor (x.view(torch.bool)) is not supported ",
      layer.reapply_views ? "while the program is traced" : "with remove=\"mutations_and_views\"",
      ": the op may leave some of its bytes unwritten, and its functional form would turn those "
      "into 0 or 1. "
      "Write through x.view(torch.uint8) instead",
      layer.reapply_views ? "." : ", or use remove=\"mutations\".");
  at::Tensor bytes = value.view(c10::kByte).clone().view(c10::kBool);
  std::vector<c10::IValue> call = inner;
  call[w.index] = bytes;
  op.callBoxed(call);
  return bytes;
}

}  // namespace tfz::detail
