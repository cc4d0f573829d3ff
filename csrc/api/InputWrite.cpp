// Writing one input's final value into the caller's tensor. See api/InputWrite.h.
#include "api/InputWrite.h"

#include "core/AutogradHistory.h"
#include "core/Recording.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

namespace tfz::detail {

// `t`'s .data, through which a write bumps no version, where the write records no history and
// .data exists: the wrapper counted eager's writes already (Note [Inputs: version counters]). A
// sparse tensor's shallow copy holds its own indices and values, an inference tensor keeps eager's
// error, a torch.func or subclass wrapper has no .data to give, and a recorded epilogue speaks of
// the placeholder itself: those are written as they are.
bool has_data_of_its_own(const at::Tensor& t) {
  static const auto wrapped_keys =
      c10::python_ks | c10::DispatchKeySet({c10::DispatchKey::FuncTorchBatched,
                                            c10::DispatchKey::FuncTorchGradWrapper});
  return !calls_may_be_traced() && t.layout() == c10::kStrided && !t.is_inference() &&
         !t.key_set().has_any(wrapped_keys);
}
at::Tensor unversioned(const at::Tensor& t) {
  return has_data_of_its_own(t) ? t.variable_data() : t;
}

// A write of `value` into input `original` records no history: neither requires grad.
bool records_no_history(const at::Tensor& original, const at::Tensor& value) {
  return !original.requires_grad() && !value.requires_grad();
}

// Whether `value`, the final value of input `original`, was written only where autograd does not
// see: it kept the input's own gradient edge, or it is a leaf's value with no history (in grad
// mode eager raises on writing such a leaf, so it was written under no_grad, through .data, or
// while f had turned its requires_grad off). Its write-back then records no history either, so
// the input keeps its grad_fn or stays a leaf (Note [Autograd: writes autograd does not see]).
bool written_unseen(const at::Tensor& original, const at::Tensor& value) {
  return has_history_of(value, original) ||
         (original.requires_grad() && original.is_leaf() && value.grad_fn() == nullptr);
}

// The tensor through which the epilogue writes `base`'s elements into `original`'s storage: its
// .data where the write records no history, a detached alias where autograd must not see it.
at::Tensor storage_writer(const at::Tensor& original, const at::Tensor& base) {
  if (records_no_history(original, base)) return unversioned(original);
  return written_unseen(original, base) ? original.detach() : original;
}

void write_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const at::Tensor& value = impl.value();
  // An input whose elements share memory (x.expand(3, 3)) is written through its whole storage
  // (write_whole_storage); where that cannot be done, copy_ into it would raise torch's
  // internal-overlap error, so the reason is named instead.
  TORCH_CHECK_NOT_IMPLEMENTED(
      original.layout() != c10::kStrided ||
          original.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
          at::has_internal_overlap(original) != at::MemOverlap::Yes,
      "functionalize: writing back an input of sizes ", original.sizes(), " and strides ",
      original.strides(),
      ", whose elements share memory (expand, as_strided with a zero stride), is not supported "
      "in a graph without views (remove=\"mutations_and_views\" under a tracer) or after its "
      "metadata changed. Use remove=\"mutations\", or pass the tensor before it is expanded.");
  if (!impl.has_metadata_mutation() && original.sym_sizes() != value.sym_sizes()) {
    original.resize__symint(value.sym_sizes());
  }
  // See written_unseen. Every other write-back records the copy, so gradients flow through
  // written inputs as through eager's in-place op.
  const bool unseen = written_unseen(original, value);
  // A leaf value over an input that does not require grad: a write with no history (below).
  if (unseen ||
      (!original.requires_grad() && (!value.requires_grad() || value.grad_fn() == nullptr))) {
    // No history to record. Eagerly through x.data, which bumps no version: the wrapper counted
    // eager's writes, and a write through x.data counts none (Note [Inputs: version counters]).
    // Grad mode changes only where it matters, so a graph switches it only for such inputs.
    at::AutoGradMode no_grad(!unseen && c10::GradMode::is_enabled());
    unversioned(original).copy_(value);
    // A leaf value that requires grad over an input that does not: f wrote the input, then
    // called requires_grad_() on it, and eager's input ends a leaf that requires grad (a graph's
    // caller sets that flag itself: no op records it).
    if (!original.requires_grad() && value.requires_grad() && !calls_may_be_traced()) {
      original.requires_grad_(true);
    }
    return;
  }
  original.copy_(value);
}

}  // namespace tfz::detail
