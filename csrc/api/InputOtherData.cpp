// An input given other data inside f: the plan and the hand-over. See api/InputOtherData.h.
#include "api/InputOtherData.h"

#include "api/InputWrite.h"

#include "core/AutogradHistory.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/Recording.h"

#include <ATen/Functions.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <string>

namespace tfz::detail {

// Note [Inputs: an input given other data]
// `x.data = y` or x.set_(y) inside f on an input x (torch.nn.utils.vector_to_parameters, weight
// averaging, parametrize) moves x's wrapper into y's alias storage
// (Note [Wrapper: x.data = y keeps x's autograd identity]). Eager's caller then holds x with y's
// memory, geometry and dtype, and x's old memory, which a buffer x views still shows, keeps the
// values it had, writes made before the move included. So the wrapper leaves a copy of itself
// behind in its old storage (left_behind), which the epilogue writes back as any input; then,
// untraced, the caller's x is given the final value's memory as eager's `x.data =` gives it
// (set_data): x keeps its autograd identity and version counter, and shares memory with what f
// returns of y (without views, where the value holds x's elements only, the memory of y's
// storage base, which holds the rest of eager's storage). Where y lies in another input's memory, x
// is given a tensor on that memory at its geometry, which is in the caller's coordinates while the
// storage's base holds them (a flat base of y's dtype, an unwritten base, or a written one laid out
// as an input that is its whole storage); otherwise refused by name. A graph cannot hand its
// internal buffer to the caller, nor change its input's dtype or device, so under a tracer or
// capture the caller's x is resized to the wrapper's sizes (its strides where they are dense, no
// version bump) and written in its own memory, a storage of x's size: eager's values only where
// nothing else views that memory, so the traced input must own its whole storage alone and keep its
// dtype and device (else refused by name), and make_fx's graph checks that layout before it writes
// (capture's guards check every input's storage). Every refusal is decided before any input is
// written. Rejected: writing x's own memory untraced too (what was done first: a buffer x views,
// such as a flat parameter buffer whose slices are the parameters, silently took y's values, a
// float64 y was written into a float32 x, and writes made before the move were lost), and set_ in a
// graph (every replay would hand the caller memory the graph's next replay overwrites).

bool moved_to_other_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  // Only after x.data = y, and not where y lives in x's own memory. (An input that is itself a
  // wrapper, of an enclosing functionalize, marks no caller storage.)
  const AliasStorage& storage = impl.alias_storage();
  return impl.data_replaced() && original.unsafeGetTensorImpl()->has_storage() &&
         maybe_get_impl(original) == nullptr && !storage.in_caller_storage(original);
}

OtherData plan_other_data(const std::vector<at::Tensor>& originals,
                          const std::vector<at::Tensor>& wrappers, size_t i) {
  const at::Tensor& original = originals[i];
  const at::Tensor& wrapper = wrappers[i];
  const auto& impl = *unsafe_get_impl(wrapper);
  const AliasStorage& storage = impl.alias_storage();
  const std::string what = "input given other data (x.data = y or x.set_(y) inside the function)";
  OtherData plan{i, at::Tensor(), false};
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return plan;  // written as any input; nothing specialized on a concrete layout
  }
  // Another input's storage that a resize grew is the caller's too, reallocated (it no longer
  // names the caller's): eager's x shares it. A flat storage grows as a whole, from its first
  // element, without a grown start: its base then outgrows the input's storage.
  const auto base_bytes = [&] {
    const at::Tensor& base = storage.base();
    return base.unsafeGetTensorImpl()->has_symbolic_sizes_strides()
               ? 0
               : (base.storage_offset() + base.numel()) * static_cast<int64_t>(base.itemsize());
  };
  bool grown_input_storage = false;
  for (size_t j = 0; j < wrappers.size() && !grown_input_storage; ++j) {
    const at::Tensor& w = wrappers[j];
    if (j == i || !w.defined() || maybe_get_impl(w) == nullptr ||
        &unsafe_get_impl(w)->alias_storage() != &storage) {
      continue;
    }
    grown_input_storage = storage.grown_start().has_value() ||
                          (storage.flat() && originals[j].defined() && originals[j].has_storage() &&
                           base_bytes() > static_cast<int64_t>(originals[j].storage().nbytes()));
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      !grown_input_storage, "functionalize: an ", what,
      " onto the memory of another input whose storage grew inside the function is not "
      "supported: eager's x then shares that reallocated storage. Assign a copy (y.clone()) "
      "instead.");
  if (storage.has_caller_storage()) {
    // y lies in another input's memory: eager's x shares it. Untraced, x is given a tensor on
    // that memory at the wrapper's geometry, which is in the caller's coordinates where the
    // storage's base is (a flat base of y's dtype, y's own unwritten base, or a written one laid
    // out as an input that is its whole storage).
    TORCH_CHECK_NOT_IMPLEMENTED(
        !calls_may_be_traced(), "functionalize: an ", what,
        " onto another input's memory is not supported under a tracer or capture: eager's x "
        "then shares that input's memory, which no graph gives its input. Assign a copy "
        "(y.clone()), or call the function without tracing.");
    const at::Tensor* holder = nullptr;
    for (size_t j = 0; j < originals.size() && holder == nullptr; ++j) {
      if (j != i && originals[j].defined() && maybe_get_impl(originals[j]) == nullptr &&
          storage.in_caller_storage(originals[j])) {
        holder = &originals[j];
      }
    }
    // A written own base of an input that is its whole storage is laid out as that input (its
    // strides, from offset 0): its coordinates are still the caller's.
    const at::Tensor& base = storage.base();
    const bool caller_coordinates =
        storage.flat()
            ? !storage.bytes() && base.scalar_type() == wrapper.scalar_type()
            : storage.in_caller_coordinates(base) ||
                  (holder != nullptr && plain_strided(*holder) && is_whole_storage(*holder) &&
                   plain_strided(base) && base.storage_offset() == 0 &&
                   base.sizes() == holder->sizes() && base.strides() == holder->strides() &&
                   base.scalar_type() == holder->scalar_type());
    TORCH_CHECK_NOT_IMPLEMENTED(
        caller_coordinates && holder != nullptr && wrapper.layout() == c10::kStrided &&
            has_data_of_its_own(original),
        "functionalize: an ", what,
        " onto another input's memory, after the function wrote that memory, is not supported "
        "there (its values are no longer held in the caller's coordinates). Assign a copy "
        "(y.clone()) instead.");
    plan.in_caller =
        at::empty({0}, holder->options().dtype(wrapper.scalar_type()))
            .set_(holder->storage(), wrapper.storage_offset(), wrapper.sizes(), wrapper.strides());
    plan.eager_data = true;
    return plan;
  }
  const at::Tensor& value = impl.value();
  if (has_data_of_its_own(original) && value.layout() == original.layout() &&
      original.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(value.key_set())) {
    plan.eager_data = true;
    return plan;
  }
  if (calls_may_be_traced()) {
    const bool owns_its_memory =
        original.layout() == c10::kStrided && original.has_storage() &&
        (original.numel() == 0 ? original.storage().nbytes() == 0 : is_whole_storage(original));
    const bool shared = std::any_of(originals.begin(), originals.end(), [&](const at::Tensor& o) {
      return o.defined() && !o.is_same(original) && o.has_storage() &&
             o.storage().is_alias_of(original.storage());
    });
    TORCH_CHECK_NOT_IMPLEMENTED(
        owns_its_memory && !shared, "functionalize: an ", what,
        " is not supported under a tracer or capture when the input does not span its whole "
        "storage (a view of a larger buffer) or shares it with another input: eager's x leaves "
        "that memory as it was and takes other memory, which a graph cannot hand to the caller. "
        "Pass a tensor that owns its memory (x.clone()), or call the function without tracing.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        original.dtype() == wrapper.dtype() && original.device() == wrapper.device(),
        "functionalize: an ", what, " of another dtype or device (", original.dtype(), " on ",
        original.device(), " given ", wrapper.dtype(), " on ", wrapper.device(),
        ") is not supported under a tracer or capture: eager's x changes dtype or device, which "
        "no op of a graph does to its input. Return the converted tensor instead, or call the "
        "function without tracing.");
    // The graph writes x's own memory: it checks the layout that makes that eager's first.
    if (traced_without_guards()) record_layout_guard(original, what);
  }
  return plan;
}

namespace {
// Untraced without views, x.set_(y) of a y the function made leaves x's wrapper a value of its own
// elements only (a later resize_ of x, such as an out= that shrinks it, keeps just those), while
// eager's x holds y's whole storage, whose other elements the storage's base holds: x is given
// that base's storage, in eager's strides, where the base lays it out (offset 0, dense, x's dtype,
// x's elements inside it). nullopt where views are kept (the value is on that storage already)
// or the base is anything else.
std::optional<at::Tensor> on_storage_of_its_base(const FunctionalTensorImpl& impl,
                                                 const at::Tensor& wrapper) {
  const AliasStorage& storage = impl.alias_storage();
  const at::Tensor& base = storage.base();
  const at::Tensor& value = impl.value();
  if (wrapper.layout() != c10::kStrided || !base.defined() || base.layout() != c10::kStrided ||
      storage.flat() || storage.bytes() || storage.has_caller_storage() ||
      storage.grown_start().has_value() || !value.has_storage() || !base.has_storage() ||
      value.storage().is_alias_of(base.storage()) ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      base.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      base.scalar_type() != wrapper.scalar_type() || base.storage_offset() != 0 ||
      !base.is_non_overlapping_and_dense() ||
      base.storage().nbytes() != static_cast<size_t>(base.numel()) * base.itemsize()) {
    return std::nullopt;
  }
  int64_t last = wrapper.storage_offset();
  for (int64_t d = 0; d < wrapper.dim(); ++d) {
    if (wrapper.size(d) == 0) return std::nullopt;
    last += (wrapper.size(d) - 1) * wrapper.stride(d);
  }
  if (last >= base.numel()) return std::nullopt;
  at::Tensor laid_out = base;
  const auto eager = storage.eager_strides();
  if (eager && base.strides() != *eager) {
    laid_out = restrided_copy(at::empty_strided(base.sizes(), *eager, base.options()), base);
  } else {
    laid_out = base.detach();
  }
  return at::empty({0}, laid_out.options())
      .set_(laid_out.storage(), wrapper.storage_offset(), wrapper.sizes(), wrapper.strides());
}
}  // namespace

void give_other_data(const at::Tensor& original, const at::Tensor& wrapper, const OtherData& plan) {
  const auto& impl = *unsafe_get_impl(wrapper);
  if (plan.in_caller.defined()) {
    original.set_data(plan.in_caller);  // eager's own `x.data =`: autograd and version stay
    return;
  }
  if (original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return write_data(original, impl);
  }
  // Eager's geometry is the wrapper's: without views its value may be laid out otherwise.
  const bool dense = wrapper.layout() == c10::kStrided && wrapper.is_non_overlapping_and_dense();
  const at::Tensor& value = impl.value();
  if (plan.eager_data) {
    at::Tensor data;
    {
      c10::AutoGradMode no_grad(false);
      std::optional<at::Tensor> on_base = on_storage_of_its_base(impl, wrapper);
      data =
          on_base ? *on_base
          : dense && same_sizes_other_strides(wrapper, value)
              ? restrided_copy(
                    at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options()), value)
              : value.detach();
    }
    original.set_data(data);  // eager's own `x.data =`: autograd and version stay
    return;
  }
  const bool resized = original.sizes() != wrapper.sizes();
  // (A torch.func wrapper of the input has no storage to restride: written as it is.)
  const bool restrided = dense && original.has_storage() && original.strides() != wrapper.strides();
  if (resized || restrided) {
    // Eager's `x.data =` bumps no version; set_ bumped the wrapper's (brought over below).
    at::AutoDispatchBelowADInplaceOrView uncounted;
    if (resized) original.resize_(wrapper.sizes());
    if (dense && original.has_storage() && original.strides() != wrapper.strides()) {
      original.as_strided_(wrapper.sizes(), wrapper.strides(), original.storage_offset());
    }
  }
  write_data(original, impl);
}

}  // namespace tfz::detail
