// The resize_ row (resize_, resize_as_) and resize_functional, which out= writes share: a resize
// that fits the storage is a view step, one past its end grows the storage.
// See Note [Kernel: resize_].
#include "kernels/special/Rows.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/MemoryOverlap.h"
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

// Note [Kernel: resize_]
// Eager resize_ keeps the storage while the new size fits in it (shrinking, or growing back into
// elements the storage still holds) and only reallocates, copying the old storage, past its end.
// Program:                        Functionalized:
//   x = torch.arange(4.)            x0 = arange(4)
//   x.resize_(2)                    x1 = as_strided(x0, [2], [1], 0)
//   x.resize_(4)                    x2 = as_strided(x0, [4], [1], 0)
//   return x + 1                    add(x2, 1)   (eager: [1, 2, 3, 4], the old elements back)
// So a resize_ that fits is a view step: as_strided(size, strides, base offset) of the alias
// storage's base at the tensor's own offset, replacing the wrapper's chain (views included: the
// step restates the view over the storage). Past the end of the storage, a non-view wrapper (the
// storage's only user: other live aliases would diverge from eager, so they are refused) moves to a
// new storage whose base is aten::resize of the whole old storage. Either way the input epilogue
// replays the resize_ call on the caller's tensor. Rejected: the functional aten::resize of the
// current value alone: it drops the elements past the current size that eager keeps, so a shrink
// followed by a grow would give garbage.
namespace {

constexpr const char* kGrownFromInside =
    "the tensor's storage was grown by a resize (resize_, or an out= result larger than the out= "
    "tensor) of a tensor that starts inside it, and as_strided addresses the elements before its "
    "start, which the function does not hold. Resize a tensor that starts its storage";

// Whether the elements of a (size, strides, offset) tensor are among `input`'s, counted from its
// first element (a written own base's coordinates).
bool own_elements_hold(const at::Tensor& input, c10::IntArrayRef size, c10::IntArrayRef strides,
                       int64_t offset) {
  MetaComputeGuard guard;
  const auto meta = input.options().device(c10::kMeta);
  const auto room = std::max(at::detail::computeStorageNbytes(size, strides, 1, offset),
                             at::detail::computeStorageNbytes(input.sizes(), input.strides(), 1));
  const at::Tensor storage = at::empty({static_cast<int64_t>(room)}, meta);
  return elements_within(storage.as_strided(size, strides, offset),
                         storage.as_strided(input.sizes(), input.strides(), 0));
}

// The storage offset of the view `chain` makes of `base`, replayed on a meta tensor of the base's
// geometry (the chain's ops as views).
// See Note [Inputs: storage coordinates of a written own base].
int64_t offset_over(const at::Tensor& base, const ViewChain& chain) {
  MetaComputeGuard guard;
  at::Tensor view = meta_twin(base);
  for (const ViewMeta* step : chain.steps()) {
    for (const auto& a : step->args) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          !a.isTensor(), "functionalize: resize_: resizing a view (by ", step->name(),
          ") of an input that does not span its storage, after writing it, is not supported "
          "with remove=\"mutations_and_views\". Use remove=\"mutations\", or pass the whole "
          "buffer as the input.");
    }
    view = step->forward_as_view(view);
  }
  return view.storage_offset();
}

}  // namespace

bool is_resize(const c10::OperatorHandle& op) {
  return named(op, "aten::resize_", "") || named(op, "aten::resize_as_", "");
}

void resize_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  const at::Tensor self = args[0].toTensor();
  const bool is_resize_as = op.schema().name() == "aten::resize_as_";
  // Sizes traced as symbols (make_fx's symbolic mode, capture(dynamic=True)) arrive as SymInts.
  const std::vector<c10::SymInt> sym_size =
      is_resize_as ? args[1].toTensor().sym_sizes().vec() : args[1].toSymIntVector();
  const auto self_size = self.sym_sizes();
  if (args[2].isNone() && self_size.size() == sym_size.size() &&
      std::equal(sym_size.begin(), sym_size.end(), self_size.begin())) {
    // The same sizes (a guard between symbols, as eager's comparison): eager changes nothing.
    torch::jit::drop(*stack, num_args);
    torch::jit::push(*stack, self);
    return;
  }
  std::vector<int64_t> size;
  for (const auto& s : sym_size) {
    TORCH_CHECK_NOT_IMPLEMENTED(s.maybe_as_int().has_value(), "functionalize: ", info.name,
                                ": resizing to symbolic sizes is not supported. Trace with "
                                "static sizes, or make a new tensor of those sizes instead.");
    size.push_back(*s.maybe_as_int());
  }
  resize_functional(info.name, self, size, args[2], layer);
  torch::jit::drop(*stack, num_args);
  torch::jit::push(*stack, self);
}

void resize_functional(std::string_view op_name, const at::Tensor& self,
                       const std::vector<int64_t>& size, const c10::IValue& memory_format,
                       const Layer& layer, c10::IntArrayRef then_strides, bool overwritten,
                       bool counts_version) {
  auto* impl = maybe_get_impl(self);
  TORCH_CHECK(impl != nullptr, "functionalize: ", op_name,
              ": cannot resize a plain tensor (created outside the function) inside it. Pass it "
              "to the function as an input.");
  TORCH_CHECK_NOT_IMPLEMENTED(!self.unsafeGetTensorImpl()->has_symbolic_sizes_strides(),
                              "functionalize: ", op_name, ": symbolic sizes are not supported.");
  const auto format =
      memory_format.isNone() ? c10::MemoryFormat::Contiguous : memory_format.toMemoryFormat();
  if (self.sizes() == c10::IntArrayRef(size) && memory_format.isNone()) {
    return;  // same size: eager changes nothing, strides included
  }
  guard_traced_input(impl->alias_storage());  // Note [Inputs: storage coordinates under a tracer]
  std::vector<int64_t> strides;
  {
    MetaComputeGuard guard;  // eager's strides for this size and memory format
    strides =
        at::empty(size, self.options().device(c10::kMeta).memory_format(format)).strides().vec();
  }
  const auto needed = static_cast<int64_t>(at::detail::computeStorageNbytes(size, strides, 1));
  // Restriding keeps the storage resize_ made: only strides that fit in it are eager's.
  const bool restride =
      !then_strides.empty() && then_strides != c10::IntArrayRef(strides) &&
      static_cast<int64_t>(at::detail::computeStorageNbytes(size, then_strides, 1)) <= needed;

  // Storage coordinates below: without views the base may be laid out otherwise than eager's
  // storage (a resize through an out= of a strided fresh result).
  // See Note [Strides: what eager gives], case "storage coordinates".
  if (!layer.reapply_views) base_in_eager_strides(*impl);
  impl->sync_();
  // With views, or while the base is the caller's tensor: see
  // Note [Inputs: storage coordinates of a written own base].
  auto& alias = impl->alias_storage();
  if ((layer.reapply_views || alias.in_caller_storage(alias.base())) &&
      alias.restore_caller_coordinates(layer.reapply_views)) {
    impl->sync_();
  }
  // Without views a written own base counts from the input's first element, which a *_scatter's
  // result does not: torch copies the input's whole storage and keeps its offset (a write through
  // x1.select(0, 1) of x1 = b1[1:, ::2] leaves the base at offset 1). The as_strided step made
  // below addresses its base from element 0 on every later value, most of them compact: so the
  // base is made compact first (one copy, on such a resize only).
  if (!layer.reapply_views && alias.caller_input().defined() &&
      !alias.in_caller_coordinates(alias.base()) && plain_strided(alias.base()) &&
      alias.base().storage_offset() != 0) {
    at::Tensor compact;
    {
      InnerCallGuard guard;
      const at::Tensor& old = alias.base();
      compact = restrided_copy(at::empty_strided(old.sizes(), old.strides(), old.options()), old);
    }
    alias.set_base_(compact);
    impl->sync_();
  }
  const at::Tensor base = impl->alias_storage().base();
  // Inputs that reinterpret each other's dtype share a byte base (Note [Inputs: aliased inputs]);
  // the as_strided step below counts in the base's elements, so it would hand back bytes.
  TORCH_CHECK_NOT_IMPLEMENTED(
      base.scalar_type() == self.scalar_type(), "functionalize: ", op_name, ": resizing a ",
      self.scalar_type(), " tensor that shares memory with a tensor of another dtype (",
      base.scalar_type(), " storage) is not supported. Clone it before resizing.");
  // The wrapper's own offset is eager's (mirrored, or the reference metadata without views), and
  // the storage's base starts where eager's storage does, so it is an offset into the base.
  // Without views, a written own base counts from the input's first element, and a view taken
  // before the write still reports the caller's offset: its offset over the base is its chain's.
  const bool own_coordinates =
      !layer.reapply_views && alias.caller_input().defined() && !alias.in_caller_coordinates(base);
  const int64_t offset = own_coordinates ? offset_over(base, impl->chain()) : self.storage_offset();
  // An input with no element may start past its storage's end (b[:, 1:] of a (0, 4) b starts
  // at 1 of 0 elements): it then has no room, not a negative one.
  const int64_t capacity = std::max<int64_t>(
      0, static_cast<int64_t>(base.storage().nbytes() / base.itemsize()) - offset);
  int64_t view_offset = offset;
  if (!layer.reapply_views && needed <= capacity) {
    // Without views a *_scatter result (or a copy of a view) holds the view's elements alone:
    // taking eager's strides (above) puts them at eager's storage positions only for the result
    // itself at offset 0. A view of it, or a result at an offset, would have the as_strided step
    // below address other elements (out= into v0[:, 0] of v0 = x.diagonal_scatter(..), resized).
    TORCH_CHECK_NOT_IMPLEMENTED(impl->alias_storage().offset_base_reason() != kCopiedViewStorage ||
                                    (impl->chain().empty() && offset == 0),
                                "functionalize: ", op_name, ": ", kCopiedViewStorage, ".");
    // Without views a written own base keeps the input's elements alone, counted from its first
    // (Note [Inputs: storage coordinates of a written own base]).
    const at::Tensor& input = impl->alias_storage().caller_input();
    TORCH_CHECK_NOT_IMPLEMENTED(
        !input.defined() || impl->alias_storage().in_caller_storage(base) ||
            own_elements_hold(input, size, strides, offset),
        "functionalize: ", op_name,
        ": resizing (a view of) an input that does not span its "
        "storage, after writing it, to elements of that storage outside the input's (its gaps, "
        "or past its last element) is not supported with remove=\"mutations_and_views\", whose "
        "values hold the input's elements alone. Use remove=\"mutations\", or pass the whole "
        "buffer as the input.");
  }
  if (needed > 0 && needed > capacity) {  // nothing grows for no element (offset past the end)
    // Eager's copy holds the view's whole storage, whose other elements a grown tensor shows
    // (slice_scatter of an empty slice, then resize_); an out= result overwrites them all.
    TORCH_CHECK_NOT_IMPLEMENTED(
        overwritten || impl->alias_storage().offset_base_reason() != kCopiedViewStorage,
        "functionalize: ", op_name, ": ", kCopiedViewStorage, ".");
    // A lone input that does not start its storage is a view of the flat storage
    // (Note [Inputs: inputs that do not start their storage]): it grows the whole storage, as
    // eager reallocates it, and keeps its offset.
    const bool flat = impl->alias_storage().flat();
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->is_resizable_base() || impl->views_all_of_its_base() || flat,
        "functionalize: ", op_name,
        ": growing a view past the end of its storage is not supported (eager would reallocate "
        "the storage it shares). Resize the base tensor, or clone the view first.");
    // Without views an input with its own base, once written, holds only its elements: grown, the
    // caller's other elements between its first one and the old end would be written back with
    // what the new memory held (Note [Inputs: writes to a grown storage]). Unwritten, or with
    // views, the base is in the caller's coordinates, and the grown copy reads them from it.
    TORCH_CHECK_NOT_IMPLEMENTED(
        flat || impl->alias_storage().caller_tail_covered() ||
            impl->alias_storage().in_caller_coordinates(base),
        "functionalize: ", op_name,
        ": growing an input past its storage after writing it, when it does not cover the "
        "storage's elements from its first one to the end (a strided slice), is not supported "
        "with remove=\"mutations_and_views\": such an input keeps its own base (under make_fx, or "
        "a slice of a large buffer), whose values then hold its elements alone "
        "(Note [Inputs: storage coordinates of a written own base]). Use remove=\"mutations\", "
        "or pass the whole buffer as the input.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        impl->storage().use_count() == 1, "functionalize: ", op_name,
        ": growing a tensor past its storage while views of it are alive is not supported (the "
        "views would no longer match eager). Resize before taking views, or clone first.");
    const bool from_start = layer.reapply_views || impl->alias_storage().generation() != 0;
    at::Tensor grown;
    {
      InnerCallGuard guard;
      if (flat) {
        grown = at::resize(base, {offset + needed});
      } else {
        // Eager's reallocated storage keeps the elements before the tensor's offset, which the
        // function may have written (x.add_(1); x.as_strided_(.., 5); an out= into x that grows
        // it): a written base grows from its first element, and so does one with views kept
        // (as_strided may read those elements). Rejected: always from the first element: a graph
        // without views would then have to write an unwritten storage's first elements back, which
        // it cannot (write_grown_storage refuses).
        const int64_t from = from_start ? 0 : offset;
        const int64_t held = std::max<int64_t>(
            0, static_cast<int64_t>(base.storage().nbytes() / base.itemsize()) - from);
        const at::Tensor old = layer.reapply_views ? base.as_strided({held}, {1}, from)
                                                   : at::as_strided_copy(base, {held}, {1}, from);
        grown = at::resize(old, {offset - from + needed});
      }
    }
    // In the caller's storage elements. The input's own base, still the caller's tensor, takes
    // the caller's storage offsets; once written (a fresh value) it counts from its first
    // element, the caller's element at the input's offset.
    const bool caller_coordinates = impl->alias_storage().in_caller_coordinates(base);
    const int64_t grown_start =
        impl->alias_storage().grown_start().value_or(
            caller_coordinates ? 0 : impl->alias_storage().caller_origin()) +
        (from_start ? 0 : offset);
    const bool written_outside = impl->alias_storage().written_outside_members();
    impl->replace_storage_(grown);
    if (flat) {
      impl->alias_storage().mark_flat(layer.reapply_views);
      if (written_outside) impl->alias_storage().mark_written_outside_members();
    } else {
      if (!from_start) view_offset = 0;
      impl->alias_storage().mark_grown(grown_start);  // Note [Inputs: writes to a grown storage]
      // The base's element 0 is eager's element grown_start: as_strided's storage coordinates
      // would address the wrong elements.
      if (grown_start != 0) impl->alias_storage().mark_offset_base(kGrownFromInside);
    }
  }
  if (restride) strides = then_strides.vec();
  auto step =
      ViewMeta::as_strided(c10::fromIntArrayRefSlow(size), c10::fromIntArrayRefSlow(strides),
                           view_offset, layer.reapply_views);
  // Replayed on the caller's tensor as resize_(size, memory_format): resize_as_'s template may be
  // a wrapper, which must not reach the epilogue.
  static const auto resize = c10::Dispatcher::singleton().findSchemaOrThrow("aten::resize_", "");
  static const auto restride_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::as_strided_", "");
  std::vector<MetadataMutation> mutations{{resize, {c10::IValue(size), memory_format}}};
  if (restride) {
    // Eager's offset, read before the storage grew: the grown wrapper mirrors its new base, which
    // starts at that offset (a restrided out= into an empty input at offset 2 of its storage
    // would be replayed at offset 0).
    mutations.push_back(
        {restride_op, {c10::IValue(size), c10::IValue(strides), c10::IValue(offset)}});
  }
  impl->resize_chain_(std::move(step), std::move(mutations), {}, counts_version);
  if (!layer.reapply_views) {
    // The value is an as_strided_copy (offset 0); the wrapper reports eager's geometry, whose
    // offset the next resize_ or as_strided reads (Note [Strides: what eager gives], case
    // "view wrappers").
    MetaComputeGuard guard;
    const auto meta = self.options().device(c10::kMeta);
    const at::Tensor room = at::empty({view_offset + needed}, meta);
    impl->set_reference_metadata_(room.as_strided(size, strides, view_offset));
  }
}

}  // namespace tfz::detail
