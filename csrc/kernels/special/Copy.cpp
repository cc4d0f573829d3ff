// The copy_ row: eager's copy_ returns at once when it would copy a tensor's elements onto
// themselves; every other copy_ is the ordinary mutation whose functional variant is `copy`.
// See Note [Kernel: copy_ onto itself].
#include "kernels/special/Rows.h"

#include "core/FunctionalTensorImpl.h"

namespace tfz::detail {

// Note [Kernel: copy_ onto itself]
// x.copy_(x), or a copy_ between two views of the same elements with the same dtype and bits,
// returns at once in eager: nothing is read or written, but the version counts a write (eager's
// ADInplaceOrView kernel bumps it before the device kernel returns; `acc[i] += v` ends in such a
// copy_, so it counts two writes). The functional `copy` would still convert the values on the
// way: x.view(torch.bool).copy_ of itself, or v.transpose(0, 0).copy_(v) of a bool view of int64
// bytes, would turn the bytes into 0 or 1 (Note [Kernel: bool views of other bytes]). So the row
// bumps self's version and returns self unchanged when self and src are one tensor, or wrappers
// of one alias storage with the same offset, sizes, strides, dtype, conjugate and negative bits;
// both modes report eager's geometry, so the test reads the wrappers.
// Without views a wrapper's bits are those of its *_copy value, so eager's are the parity of the
// bit-flipping steps in its view chain (x.conj().copy_(x) writes). Both wrappers are synced
// first, so that both geometries are read against the same base. Any other copy_ goes the
// mutation path (kernels/MutationKernels.cpp), and copy_'s other details live where their rules
// are: the functional copy's clone of a storage of partial elements (kernels/WriteChecks.cpp) and
// copy_ as an op that overwrites every element of a bool view (kernels/BoolViewWrites.cpp).
// Rejected: the check inside the mutation path, where it ran a name comparison on every write.
bool is_copy_(const c10::OperatorHandle& op) {
  return named(op, "aten::copy_", "");
}

namespace {

bool copies_onto_itself(const at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return true;
  auto* a = maybe_get_impl(self);
  auto* b = maybe_get_impl(src);
  if (a == nullptr || b == nullptr || &a->alias_storage() != &b->alias_storage() ||
      self.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      src.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  // A wrapper not synced since its base was rewritten reports its geometry over the old base: a
  // chunk v0 of an input that keeps its own base still at the caller's offset 1 while its written
  // sibling v1 reports offset 1 over the new base (which counts from the input's first element),
  // so v1.copy_(v0) looked like a copy onto itself.
  a->sync_();
  b->sync_();
  return self.storage_offset() == src.storage_offset() && self.sizes() == src.sizes() &&
         self.strides() == src.strides() && self.scalar_type() == src.scalar_type() &&
         self.is_conj() == src.is_conj() && self.is_neg() == src.is_neg() &&
         a->chain().bit_flips() == b->chain().bit_flips();
}

}  // namespace

void copy_kernel(const OpInfo& info, const c10::OperatorHandle& op, Stack* stack,
                 const Layer& layer) {
  const size_t num_args = op.schema().arguments().size();
  const c10::IValue& self = *(stack->end() - static_cast<std::ptrdiff_t>(num_args));
  const c10::IValue& src = *(stack->end() - static_cast<std::ptrdiff_t>(num_args) + 1);
  if (self.isTensor() && src.isTensor() && copies_onto_itself(self.toTensor(), src.toTensor())) {
    const c10::IValue result = self;
    auto* impl = self.toTensor().unsafeGetTensorImpl();
    if (impl->version_counter().enabled()) impl->bump_version();
    torch::jit::drop(*stack, num_args);
    torch::jit::push(*stack, result);
    return;
  }
  mutable_kernel(info, op, stack, layer);
}

}  // namespace tfz::detail
