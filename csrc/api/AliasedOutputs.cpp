// Outputs as the caller receives them. See api/AliasedOutputs.h.
#include "api/AliasedOutputs.h"

#include "core/AutogradHistory.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Layer.h"
#include "core/Layout.h"
#include "core/Recorder.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace tfz::detail {

namespace {
// The caller's storage of a flat or byte base, seen as that base (1-D, the base's dtype or bytes,
// its number of elements), through a member input without conjugate or negative bits; undefined
// where no member can give it.
at::Tensor caller_storage_as_base(const std::vector<at::Tensor>& originals,
                                  const std::vector<at::Tensor>& wrappers,
                                  const AliasStorage& storage) {
  const at::Tensor& base = storage.base();
  if (base.is_conj() || base.is_neg()) return {};
  for (size_t i = 0; i < wrappers.size(); ++i) {
    auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
    const at::Tensor& t = originals[i];
    if (in == nullptr || &in->alias_storage() != &storage || t.layout() != c10::kStrided ||
        t.unsafeGetTensorImpl()->has_symbolic_sizes_strides() || t.is_conj() || t.is_neg() ||
        (!storage.bytes() && t.scalar_type() != base.scalar_type()) ||
        static_cast<int64_t>(t.storage().nbytes()) % static_cast<int64_t>(t.itemsize()) != 0 ||
        static_cast<int64_t>(t.storage().nbytes()) <
            base.numel() * static_cast<int64_t>(base.itemsize())) {
      continue;
    }
    at::Tensor whole = storage.bytes() ? storage_as_bytes(t) : t.as_strided({base.numel()}, {1}, 0);
    return whole.numel() == base.numel() ? whole : whole.as_strided({base.numel()}, {1}, 0);
  }
  return {};
}
}  // namespace

// Note [Inputs: outputs that alias inputs]
// In eager, `x.add_(1); return x.view(-1)` returns a view of the caller's x, so a later write
// through the output reaches x. With views kept (remove="mutations") we rebuild such outputs after
// the epilogue: if an input's view chain is a prefix of the output's (same shared steps, same alias
// storage), the remaining steps are replayed on the caller's tensor, so `return x` gives back x
// itself and `return x[0]` a real view of x. An input whose metadata f changed (x.t_(), an out=
// resize) is matched by its chain before the change, and the steps replay on x.as_strided at its
// geometry then: a view taken before x.t_() still views x's storage in eager.
// An as_strided of a view is a step from the storage's base
// (Note [Kernel: as_strided without views]), so its chain has no input's as prefix; where the
// base's element i is the storage's element i (a flat base, or an input that is the base), the
// caller's x.as_strided(...) is that step too, and the output is rebuilt from it. Where such a
// chain begins with the base's reinterpretation in the output's dtype (the byte base of inputs of
// two dtypes, or a flat base viewed in another dtype), it replays whole on the caller's storage
// seen as the base sees it (caller_storage_as_base).
// Under a tracer (make_fx) the Python API turns this off: a graph's outputs never alias its
// inputs, and the replayed views would read a placeholder after its write-back.
// Rejected: a view of the new inner value, as torch.func returns: equal numbers, but a later write
// through the output does not reach x.
namespace {
// Note [Outputs: leaves made inside the function]
// A leaf made inside f and returned is, in eager, a leaf that requires grad, with the .grad it
// was given. Its value here can read otherwise: after a write autograd did not see, the value
// stands for the leaf with the leaf's grad accumulator as grad_fn (a non-leaf whose backward
// accumulates into a tensor the caller never sees), and its .grad, made inside f, is a wrapper
// (which would escape). So the returned tensor is a leaf sharing the value's data, with the
// unwrapped .grad. Values a tracer tracks by identity are left alone: a graph's outputs carry no
// autograd state. Rejected: returning the leaf the value stands for (it holds the data before
// the write).
at::Tensor as_returned(at::Tensor value) {
  if (!value.requires_grad() || may_be_tracked(value)) return value;
  const at::Tensor leaf = leaf_standing_for(value);
  if (!leaf.defined() && value.grad_fn() != nullptr) return value;  // a non-leaf: as it is
  const at::Tensor& grad = leaf.defined() ? leaf.grad() : value.grad();
  if (!leaf.defined() && maybe_get_impl(grad) == nullptr) return value;
  at::Tensor out = value.variable_data();
  out.set_requires_grad(true);
  if (auto* g = maybe_get_impl(grad)) {
    g->sync_();
    out.mutable_grad() = g->value();
  } else if (grad.defined()) {
    out.mutable_grad() = grad;
  }
  return out;
}
}  // namespace

at::Tensor unwrap_output(const at::Tensor& out, const std::vector<at::Tensor>& originals,
                         const std::vector<at::Tensor>& wrappers, bool alias_inputs) {
  auto* impl = maybe_get_impl(out);
  if (impl == nullptr) return out;
  impl->sync_();
  if (!alias_inputs) return as_returned(impl->value());
  for (size_t i = 0; i < wrappers.size(); ++i) {  // `return x`: x itself, as in eager
    if (originals[i].defined() && wrappers[i].unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) {
      return originals[i];
    }
  }
  const auto& chain = impl->chain();
  // The input whose chain is the longest beginning of the output's: first its chain now (the
  // rest replays on the caller's tensor as the epilogue left it), then its chain before its
  // first metadata mutation (the rest replays on the caller's tensor at its geometry then).
  int best = -1;
  size_t best_len = 0;
  bool at_entry = false;
  for (bool entry : {false, true}) {
    for (size_t i = 0; i < wrappers.size(); ++i) {
      auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
      if (in == nullptr || &in->alias_storage() != &impl->alias_storage()) continue;
      if (entry && (!in->has_metadata_mutation() || !in->entry_state().geometry)) continue;
      const auto& prefix = entry ? in->entry_chain() : in->chain();
      if (prefix.size() <= chain.size() && chain.starts_with(prefix) &&
          (best < 0 || prefix.size() > best_len)) {
        best = static_cast<int>(i);
        best_len = prefix.size();
        at_entry = entry;
      }
    }
    if (best >= 0) break;
  }
  if (best < 0 && !chain.steps().empty() && chain.steps()[0]->name() == "aten::as_strided") {
    for (size_t i = 0; i < wrappers.size() && best < 0; ++i) {
      auto* in = originals[i].defined() ? maybe_get_impl(wrappers[i]) : nullptr;
      if (in != nullptr && &in->alias_storage() == &impl->alias_storage() &&
          (in->alias_storage().flat() || in->entry_chain().empty())) {
        best = static_cast<int>(i);  // best_len 0: every step replays on the caller's tensor
      }
    }
  }
  at::Tensor result;
  if (best >= 0) {
    result = originals[best];
    if (at_entry) {
      // The input's geometry when the output's view was taken: eager's view derives from it.
      const auto& [sizes, strides, offset] =
          *unsafe_get_impl(wrappers[best])->entry_state().geometry;
      result = result.as_strided(sizes, strides, offset);
    }
  } else if (!chain.steps().empty() &&
             (impl->alias_storage().bytes() ||
              (impl->alias_storage().flat() && chain.steps()[0]->name() != "aten::as_strided"))) {
    // A flat or byte base's chains that begin with its reinterpretation in another dtype
    // (as_strided from the base, see base_in_dtype_of in ViewKernels.cpp) replay whole on the
    // caller's storage seen as the base sees it: as bytes, or as elements of the base's dtype.
    result = caller_storage_as_base(originals, wrappers, impl->alias_storage());
  }
  if (!result.defined()) return as_returned(impl->value());
  const auto steps = chain.steps();
  for (size_t k = best_len; k < steps.size(); ++k) {
    if (!steps[k]->reapply) return as_returned(impl->value());  // a *_copy step: not a view
    result = steps[k]->forward(result);
  }
  return result;
}

// See Note [Strides: what eager gives], case "outputs".
at::Tensor output_in_eager_strides(const at::Tensor& wrapper, const at::Tensor& value) {
  if (wrapper.layout() != c10::kStrided || value.layout() != c10::kStrided ||
      wrapper.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      value.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      wrapper.sizes() != value.sizes() || value.numel() == 0 ||
      !strides_differ(value.sizes(), value.strides(), wrapper.strides()) || value.requires_grad() ||
      value.key_set().has_any(c10::python_ks)) {
    return value;  // requires_grad: the copy would cut the value's autograd history
  }
  InnerCallGuard guard;
  if (!may_self_overlap(wrapper.sizes(), wrapper.strides())) {
    return at::empty_strided(wrapper.sizes(), wrapper.strides(), value.options()).copy_(value);
  }
  // Elements share memory (expand, unfold): each storage element takes the value of the elements
  // that lie on it, which are equal (the value was read through such a view). copy_ refuses an
  // overlapping destination; index_put_ of the storage at each element's offset does not.
  const auto numel = static_cast<int64_t>(
      at::detail::computeStorageNbytes(wrapper.sizes(), wrapper.strides(), 1, 0));
  at::Tensor storage = at::empty({numel}, value.options());
  const at::Tensor offsets = at::arange(numel, value.options().dtype(c10::kLong))
                                 .as_strided(wrapper.sizes(), wrapper.strides())
                                 .reshape(-1);
  storage.index_put_({offsets}, value.reshape(-1));
  return storage.as_strided(wrapper.sizes(), wrapper.strides());
}

}  // namespace tfz::detail
