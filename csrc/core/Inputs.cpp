// Input wrapping with alias groups, and the input-mutation epilogue.
#include "core/Inputs.h"

#include "core/Conversions.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <unordered_map>

namespace tfz::detail {

// Note [Inputs: aliased inputs]
// f(x, x.view(-1)), f(x, x[1:]), f(x, x.t()), f(x, x): in eager a write through one argument is
// visible through the other. torch.func.functionalize wraps each argument with its own storage,
// so inside f the other argument keeps its old value (wrong numbers). Here arguments that share a
// storage are grouped: the group gets one synthetic base, the whole storage seen as a flat 1-D
// tensor (as_strided(first, [numel], [1], 0), or its _copy when views are removed), and each
// member becomes a view of it through one as_strided(size, stride, offset) step. A write through
// any member is then committed to the shared base with as_strided_scatter and the other members
// regenerate from it, exactly like ordinary views. Members report their original metadata.
// The epilogue writes a group back once, through a member that covers all the others (dense, and
// its span contains theirs: typical for x with x.view(-1) / x[1:] / x.t()); when none does (two
// overlapping slices), each member is written, which writes shared elements with equal values.
// Groups with mixed dtypes (x with x.view(torch.int32)) are wrapped independently, as torch.func
// does, with a warning: their regions cannot share one typed base.
// Rejected: AOTAutograd's "synthetic base" as an extra graph input: a calling convention change
// that user code calling functionalize(f) directly could not follow.

namespace {

struct Span {
  int64_t begin, end;  // element offsets [begin, end) in the storage
};

Span span_of(const at::Tensor& t) {
  const auto extent = at::detail::computeStorageNbytes(t.sizes(), t.strides(), 1);
  return {t.storage_offset(), t.storage_offset() + static_cast<int64_t>(extent)};
}

bool can_group(const std::vector<at::Tensor>& members) {
  for (const auto& t : members) {
    if (t.layout() != c10::kStrided || t.scalar_type() != members[0].scalar_type() ||
        t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      return false;
    }
  }
  return true;
}

std::vector<at::Tensor> wrap_group(const std::vector<at::Tensor>& members, const Layer& layer) {
  const at::Tensor& first = members[0];
  const int64_t numel = static_cast<int64_t>(first.storage().nbytes() / first.itemsize());
  at::Tensor base_value;
  {
    InnerCallGuard guard;
    base_value = layer.reapply_views ? first.as_strided({numel}, {1}, 0)
                                     : at::as_strided_copy(first, {numel}, {1}, 0);
  }
  const at::Tensor base = make_fresh_wrapper(base_value, layer.id);
  std::vector<at::Tensor> wrapped;
  for (const auto& m : members) {
    auto step = ViewMeta::as_strided(m.sym_sizes(), m.sym_strides(), m.sym_storage_offset(),
                                     layer.reapply_views);
    at::Tensor value;
    {
      InnerCallGuard guard;
      value = step->forward(base_value);
    }
    at::Tensor w = make_view_wrapper(value, base, std::move(step));
    if (!layer.reapply_views) unsafe_get_impl(w)->set_reference_metadata_(m);
    wrapped.push_back(std::move(w));
  }
  return wrapped;
}

}  // namespace

std::vector<at::Tensor> wrap_inputs(const std::vector<at::Tensor>& inputs, const Layer& layer) {
  std::vector<at::Tensor> out(inputs.size());
  std::unordered_map<const c10::StorageImpl*, std::vector<size_t>> groups;
  std::vector<const c10::StorageImpl*> order;  // groups in first-appearance order
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (auto* impl = maybe_get_impl(t)) {
      TORCH_CHECK(impl->layer_id() == layer.id,
                  "functionalize: got a functional tensor that escaped the functionalize call "
                  "that made it as an input. Pass plain tensors.");
      out[i] = t;
      continue;
    }
    const auto* storage =
        t.unsafeGetTensorImpl()->has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    if (storage == nullptr) {
      out[i] = make_fresh_wrapper(t, layer.id);
      continue;
    }
    auto& group = groups[storage];
    if (group.empty()) order.push_back(storage);
    group.push_back(i);
  }
  for (const auto* storage : order) {
    const auto& indices = groups[storage];
    std::vector<at::Tensor> members;
    for (size_t i : indices) members.push_back(inputs[i]);
    if (members.size() > 1 && !can_group(members)) {
      TORCH_WARN("functionalize: ", members.size(),
                 " inputs share a storage but differ in dtype or layout; they are functionalized "
                 "independently, so a write through one is not seen through the others inside "
                 "the function.");
    }
    if (members.size() == 1 || !can_group(members)) {
      for (size_t i : indices) out[i] = make_fresh_wrapper(inputs[i], layer.id);
      continue;
    }
    auto wrapped = wrap_group(members, layer);
    for (size_t k = 0; k < indices.size(); ++k) out[indices[k]] = wrapped[k];
  }
  return out;
}

namespace {

void replay_metadata_mutations(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  for (const auto& m : impl.metadata_mutations()) {
    torch::jit::Stack stack;
    stack.emplace_back(original);
    stack.insert(stack.end(), m.args.begin(), m.args.end());
    m.op.callBoxed(stack);
  }
}

void write_data(const at::Tensor& original, const FunctionalTensorImpl& impl) {
  const at::Tensor& value = impl.value();
  if (!impl.has_metadata_mutation() && original.sym_sizes() != value.sym_sizes()) {
    original.resize__symint(value.sym_sizes());
  }
  // A leaf that requires grad written with a value that does not: eager could only have written
  // it under no_grad (in grad mode it raises), e.g. an SGD update of a parameter inside f, so
  // the write-back records no history either (and passes autograd's leaf check). Every other
  // write-back records the copy, so gradients flow through written inputs as through eager's
  // in-place op.
  if (original.requires_grad() && original.is_leaf() && !value.requires_grad()) {
    at::AutoGradMode no_grad(false);
    original.copy_(value);
    return;
  }
  original.copy_(value);
}

// Index (into `members`) of a member whose elements include every other member's, or -1.
int covering_member(const std::vector<at::Tensor>& originals, const std::vector<size_t>& members) {
  for (size_t k = 0; k < members.size(); ++k) {
    const auto& candidate = originals[members[k]];
    if (!candidate.is_non_overlapping_and_dense()) continue;
    const Span outer = span_of(candidate);
    bool covers = true;
    for (size_t i : members) {
      const Span s = span_of(originals[i]);
      covers &= s.begin >= outer.begin && s.end <= outer.end;
    }
    if (covers) return static_cast<int>(k);
  }
  return -1;
}

}  // namespace

void write_back_inputs(const std::vector<at::Tensor>& originals,
                       const std::vector<at::Tensor>& wrappers) {
  TORCH_CHECK(originals.size() == wrappers.size(), "functionalize: write-back got ",
              originals.size(), " inputs and ", wrappers.size(), " wrappers.");
  std::unordered_map<const AliasStorage*, std::vector<size_t>> groups;
  std::vector<const AliasStorage*> order;
  for (size_t i = 0; i < wrappers.size(); ++i) {
    if (!originals[i].defined()) continue;
    auto* impl = get_impl(wrappers[i]);
    TORCH_CHECK(impl->is_up_to_date(), "functionalize: write-back: sync the wrappers first.");
    replay_metadata_mutations(originals[i], *impl);
    auto& group = groups[&impl->alias_storage()];
    if (group.empty()) order.push_back(&impl->alias_storage());
    group.push_back(i);
  }
  for (const auto* storage : order) {
    if (storage->generation() == 0) continue;  // nothing was written to this storage
    const auto& members = groups[storage];
    bool any_metadata = false;
    for (size_t i : members) any_metadata |= unsafe_get_impl(wrappers[i])->has_metadata_mutation();
    const int cover = members.size() > 1 && !any_metadata ? covering_member(originals, members) : -1;
    if (cover >= 0) {
      write_data(originals[members[cover]], *unsafe_get_impl(wrappers[members[cover]]));
      continue;
    }
    for (size_t i : members) write_data(originals[i], *unsafe_get_impl(wrappers[i]));
  }
}

// Note [Inputs: outputs that alias inputs]
// In eager, `x.add_(1); return x.view(-1)` returns a view of the caller's x. torch.func returns a
// view of the new inner value instead: equal numbers, but a later write through the output does
// not reach x. With views kept (remove="mutations") we rebuild such outputs after the epilogue:
// if an input's view chain is a prefix of the output's (same shared steps, same alias storage),
// the remaining steps are replayed on the caller's tensor, so `return x` gives back x itself and
// `return x[0]` a real view of x. Under a tracer (make_fx) the Python API turns this off: a
// graph's outputs never alias its inputs, and the replayed views would read a placeholder after
// its write-back.
at::Tensor unwrap_output(const at::Tensor& out, const std::vector<at::Tensor>& originals,
                         const std::vector<at::Tensor>& wrappers, bool alias_inputs) {
  auto* impl = maybe_get_impl(out);
  if (impl == nullptr) return out;
  impl->sync_();
  if (!alias_inputs) return impl->value();
  const auto& chain = impl->chain();
  int best = -1;
  size_t best_len = 0;
  for (size_t i = 0; i < wrappers.size(); ++i) {
    if (!originals[i].defined()) continue;
    auto* in = maybe_get_impl(wrappers[i]);
    if (in == nullptr || &in->alias_storage() != &impl->alias_storage()) continue;
    const auto& prefix = in->chain();
    if (prefix.size() > chain.size() || (best >= 0 && prefix.size() < best_len)) continue;
    if (std::equal(prefix.begin(), prefix.end(), chain.begin())) {
      best = static_cast<int>(i);
      best_len = prefix.size();
    }
  }
  if (best < 0) return impl->value();
  at::Tensor result = originals[best];
  for (size_t k = best_len; k < chain.size(); ++k) {
    if (!chain[k]->reapply) return impl->value();  // a *_copy step: the output is not a view
    result = chain[k]->forward(result);
  }
  return result;
}

}  // namespace tfz::detail
