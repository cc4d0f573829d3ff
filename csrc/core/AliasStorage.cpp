// Update queue and commit of mutations made through views.
// See Note [Alias: storage and generations].
#include "core/AliasStorage.h"

#include "core/Layer.h"

namespace tfz::detail {

// Note [Alias: storage and generations]
// Program:                       Functionalized:
//   a = x.clone()                  a0 = clone(x)
//   b = a[0]                       b0 = select(a0, 0, 0)
//   b.mul_(2)                      b1 = mul(b0, 2); a1 = select_scatter(a0, b1, 0, 0)
//                                  b2 = select(a1, 0, 0)   (b regenerated, as torch.func does)
//   return a + 1                   return add(a1, 1)
// Every wrapper aliasing one base shares one AliasStorage. A mutation through any wrapper
// replaces that wrapper's value and queues (new value, view chain) here, bumping the
// generation. apply_updates() folds the queue into the base by walking the chain backwards
// through the view inverses (select_scatter above). Other wrappers notice they are stale by
// comparing their generation with ours and regenerate lazily, on their next use, by replaying
// their chain forward from the new base.
// Why lazy: a base with N live views that is mutated M times would otherwise regenerate N views
// M times, most never read again; lazily each view costs one replay per read after a change.
// The cost is that queued updates keep their values alive until someone syncs; in practice the
// mutating wrapper syncs right away, so the queue holds at most one entry between ops.

namespace {
c10::SymInt storage_nbytes(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  return impl->has_storage() ? t.storage().sym_nbytes() : c10::SymInt(0);
}
}  // namespace

AliasStorage::AliasStorage(const at::Tensor& base)
    : c10::StorageImpl(c10::StorageImpl::use_byte_size_t(), storage_nbytes(base),
                       c10::DataPtr(nullptr, base.device()), /*allocator=*/nullptr,
                       /*resizable=*/false),
      base_(base) {}

void AliasStorage::add_update(const at::Tensor& value, const ViewChain& chain) {
  updates_.push_back(Update{value, chain});
  ++generation_;
}

void AliasStorage::set_base_(const at::Tensor& value) {
  TORCH_INTERNAL_ASSERT(updates_.empty(), "set_base_ with queued updates");
  base_ = value;
  ++generation_;
}

bool AliasStorage::apply_updates() {
  if (updates_.empty()) return false;
  InnerCallGuard guard;
  for (auto& update : updates_) {
    if (update.chain.empty()) {
      base_ = update.value;
      continue;
    }
    const auto chain = update.chain.steps();
    // bases[i] is what chain[i] is applied to; the last step needs no forward replay.
    std::vector<at::Tensor> bases{base_};
    for (size_t i = 0; i + 1 < chain.size(); ++i) bases.push_back(chain[i]->forward(bases.back()));
    at::Tensor value = update.value;
    for (size_t i = chain.size(); i-- > 0;) value = chain[i]->inverse(bases[i], value);
    base_ = std::move(value);
  }
  updates_.clear();
  return true;
}

}  // namespace tfz::detail
