// Update queue and commit of mutations made through views.
// See Note [Alias: storage and generations].
#include "core/AliasStorage.h"

#include "core/AutogradHistory.h"
#include "core/DispatchKey.h"
#include "core/Layer.h"
#include "core/Layout.h"
#include "core/LayoutGuards.h"
#include "core/MemoryOverlap.h"
#include "core/ViewInverses.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Functions.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <optional>

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
// Rejected: regenerating every view at each write: a base with N live views that is mutated M
// times would regenerate N views M times, most never read again; lazily each view costs one
// replay per read after a change.
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

// Note [Alias: captured bases written in place]
// A storage lifted from a captured tensor (Note [Kernel: views of captured tensors]) has that
// plain tensor itself as its base, and its views are *_copy values taken from it. An op on plain
// tensors only (G.add_(1)), or a training-mode batch norm writing a captured module's running
// stats, writes that tensor in place, behind the storage's back: a view taken before the write
// would keep the old values, where eager's view sees the new ones. So the storage remembers the
// base's version when lifted, and a wrapper counts as stale when it moved (or when the batch-norm
// row, whose write bumps no version, says so): the next read regenerates the view from the base.
// Rejected: regenerating views of captured tensors on every read (a *_copy per read, also in
// every traced graph, for a write that almost never happens).
void AliasStorage::mark_captured() {
  captured_ = true;
  if (!base_.is_inference()) {
    captured_version_ = base_.unsafeGetTensorImpl()->version_counter().current_version();
  }
}

bool AliasStorage::captured_version_changed_() const {
  return captured_version_.has_value() &&
         base_.unsafeGetTensorImpl()->version_counter().current_version() != *captured_version_;
}

void AliasStorage::refresh_captured_base() {
  if (!captured_base_written()) return;
  captured_written_ = false;
  if (captured_version_.has_value()) {
    captured_version_ = base_.unsafeGetTensorImpl()->version_counter().current_version();
  }
  ++generation_;
}

void AliasStorage::add_update(const at::Tensor& value, const ViewChain& chain, bool visible) {
  if (flat_ && !written_outside_members_) {
    const auto steps = chain.steps();  // flat storages only: aliased inputs, O(chain) per write
    written_outside_members_ = steps.empty() || !is_member_step(steps.front());
  }
  updates_.push_back(Update{value, chain, visible});
  ++generation_;
}

// Note [Alias: writes to a value that is not its whole storage]
// In eager, x0.select_scatter(src, 1, 0) of a view x0 = b[1:, ::2] is a copy of b's whole storage
// seen at x0's geometry (torch's *_scatter ops and copy clone a view's storage: offset 4 in 16
// elements). An in-place write to it (normal_) writes its 6 elements and leaves the storage's other
// 10 as they were, and a later as_strided may read any of them. The write's functional op returns a
// fresh tensor of the 6 elements from offset 0; made the base, it would lose the offset and the
// other elements (v.normal_(); v.as_strided_((2,), (3,), 4) would read other elements than eager,
// or fail with a setStorage error). So a write that replaces a base lying inside a larger storage
// copies the new value into a copy of the old base's storage (aten.copy: that clone, then copy_)
// when the storage is small (storage_is_small); a larger one is marked offset_base instead, and
// as_strided on it is refused by name. Inputs never take this path: one that is not its whole
// storage has a flat base or is offset_base already
// (Note [Inputs: inputs that do not start their storage]).
// Without views x0's value is its 6 elements alone, so eager's 16-element result cannot be had;
// such a result's storage is marked offset_base where the op runs (kernels/BoxedKernel.cpp). And
// where x0's elements share memory (as_strided with overlapping strides), eager's result keeps
// that layout and the op's own writes land on each other: refused by name without views.
// Rejected: a flat base for every fresh value that is not its whole storage (what such inputs
// get): a step more on each of its views, for values that storage coordinates almost never read.
namespace {
constexpr const char* kWrittenInsideLargerStorage =
    "the tensor is (a view of) an op's result that lies inside a larger storage and was written "
    "in place; as_strided addresses that storage's other elements, which the write does not keep "
    "here. Clone the result before writing it";
}  // namespace

at::Tensor AliasStorage::in_own_storage_(const at::Tensor& value) {
  if (C10_UNLIKELY(caller_coordinates_) && !value.is_same(base_) && plain_strided(value) &&
      value.sizes() == base_.sizes() && value.scalar_type() == base_.scalar_type() &&
      !(value.strides() == base_.strides() && value.storage_offset() == base_.storage_offset() &&
        value.storage().nbytes() == base_.storage().nbytes())) {
    // See Note [Inputs: storage coordinates of a written own base].
    InnerCallGuard guard;
    return restrided_copy(base_, value);
  }
  if (flat_ || offset_base_ != nullptr || grown_start_ || value.is_same(base_) ||
      !plain_strided(base_) || is_whole_storage(base_) || !plain_strided(value) ||
      value.sizes() != base_.sizes() || value.scalar_type() != base_.scalar_type()) {
    return value;
  }
  // A view inverse's scatter copies the base's storage and writes into it: already in place, and
  // it may hold writes outside its own elements (an out= resize within the storage).
  if (value.strides() == base_.strides() && value.storage_offset() == base_.storage_offset() &&
      value.storage().nbytes() == base_.storage().nbytes()) {
    return value;
  }
  if (!storage_is_small(base_)) {
    offset_base_ = kWrittenInsideLargerStorage;
    return value;
  }
  InnerCallGuard guard;
  return restrided_copy(base_, value);
}

namespace {
// The storage elements [first, last] of an as_strided step, when they are all its own (dense) and
// its arguments are concrete; nullopt otherwise (another op: no range known).
std::optional<std::pair<int64_t, int64_t>> dense_range(const ViewMeta& step) {
  static const c10::OperatorName as_strided{"aten::as_strided", ""};
  if (step.op.operator_name() != as_strided || step.args.size() < 3 || step.args[2].isNone()) {
    return std::nullopt;
  }
  const std::vector<c10::SymInt> sizes = step.args[0].toSymIntVector();
  const std::vector<c10::SymInt> strides = step.args[1].toSymIntVector();
  const auto offset = step.args[2].toSymInt().maybe_as_int();
  if (!offset || sizes.size() != strides.size()) return std::nullopt;
  int64_t first = *offset, last = *offset, numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    const auto size = sizes[d].maybe_as_int(), stride = strides[d].maybe_as_int();
    if (!size || !stride) return std::nullopt;
    const int64_t reach = (*size - 1) * *stride;
    numel *= *size;
    first += std::min<int64_t>(0, reach);
    last += std::max<int64_t>(0, reach);
  }
  if (numel == 0) return std::make_pair(*offset, *offset - 1);
  if (last - first + 1 != numel) return std::nullopt;
  return std::make_pair(first, last);
}
}  // namespace

void AliasStorage::retire_member_step(const ViewMeta& old, const ViewMeta& replacement) {
  // Every replacement step still counted as a member's (`old`, and earlier ones `old` covered) must
  // lie inside `replacement`'s elements, or the writes made through it so far, and the writes
  // through views taken from it later, may reach elements the member no longer covers:
  // x0.resize_((4, 2)); v = x0[2:]; x0.as_strided_((2, 2), (2, 3), 2); v.geometric_(0.5) writes
  // element 6 of the storage, outside x0's final elements. Such a step stops counting as a
  // member's. A member's entry step (added without a generation) stays: its elements are written
  // back by the epilogue's entry write (Note [Inputs: writes before a metadata change]).
  const auto outer = dense_range(replacement);
  for (const auto& [kept, generation] : kept_member_steps_) {
    if (kept.get() == &replacement || !is_member_step(kept.get())) continue;
    if (kept.get() != &old &&
        std::find(retired_.begin(), retired_.end(), kept.get()) == retired_.end()) {
      continue;  // another member's current step
    }
    const auto inner = dense_range(*kept);
    const bool covered = inner && outer &&
                         (inner->second < inner->first ||
                          (inner->first >= outer->first && inner->second <= outer->second));
    if (covered) {
      if (kept.get() == &old) retired_.push_back(kept.get());
      continue;
    }
    if (generation != generation_) written_outside_members_ = true;
    member_steps_.erase(std::remove(member_steps_.begin(), member_steps_.end(), kept.get()),
                        member_steps_.end());
  }
}

// Note [Inputs: storage coordinates of a written own base]
// An input that does not span its storage and keeps its own base (a slice of a large buffer; any
// such input under make_fx, Note [Inputs: storage coordinates under a tracer]) is, until written,
// the caller's tensor: resize_ within the storage is an as_strided step of it at eager's offset and
// reads the storage's other elements (the slice's gaps) as eager does. A write gives the base a
// fresh value of the input's elements alone, from offset 0, where such a step, made before the
// write or after it, reads other elements or none: x = b[1:, ::2]; x.add_(1); x.resize_(6) must
// show b's elements between x's rows. So from the first resize_ of such a storage on, with views
// kept, the base stays in the caller's coordinates: a written base becomes the caller's tensor
// copied whole with the new value in it (aten.copy of the input and the value: torch clones the
// input's whole storage and writes the value at the input's geometry), and so does every later
// value of the base (a view inverse's scatter clones the storage whole already). Writes are noted
// with their geometry; one outside the input's entry and final elements (a view resized into its
// gaps) makes the epilogue copy the storage back whole (api/Epilogue.cpp). Under make_fx the graph
// reads the input's storage, whose layout is guarded. Without views the wrappers of a written own
// base report geometry counted from the input's first element, so the base keeps those
// coordinates (a view taken before the write, which still reports the caller's offset, is
// resized at the offset its chain gives over the base), and a resize to elements outside the
// input's is refused by name.
// Rejected: the flat base for such inputs from the start (a guard on every input of a graph traced
// on batch[0], Note [Inputs: storage coordinates under a tracer]); refusing resize_ within the
// storage after a write (programs that eager runs would fail by name).
bool AliasStorage::restore_caller_coordinates(bool views_kept) {
  if (!caller_input_.defined() || caller_coordinates_ || flat_ || bytes_ || grown_start_) {
    return false;
  }
  caller_views_kept_ = views_kept;
  if (in_caller_storage(base_)) {  // unwritten: the base is the caller's tensor, kept so
    caller_coordinates_ = true;
    return false;
  }
  TORCH_INTERNAL_ASSERT(updates_.empty(), "restore_caller_coordinates with queued updates");
  if (!plain_strided(base_) || !plain_strided(caller_input_) ||
      base_.sizes() != caller_input_.sizes() ||
      base_.scalar_type() != caller_input_.scalar_type()) {
    return false;  // the base is no longer the input's elements: storage coordinates stay refused
  }
  guard_traced_input(*this);
  InnerCallGuard guard;
  base_ = restrided_copy(caller_input_, base_);
  caller_coordinates_ = true;
  ++generation_;
  return true;
}

void AliasStorage::set_caller_input(const at::Tensor& input) {
  caller_input_ = input;
  if (plain_strided(input)) {
    MetaComputeGuard guard;
    c10::impl::ExcludeDispatchKeyGuard untraced(layer_hidden_keys());  // also outside a layer
    caller_entry_ = meta_twin(input);
  }
}

// The written geometry is the chain replayed on the base, not the wrapper's own: with views kept
// a written view mirrors its new value (a fresh tensor at offset 0) until its next sync.
void AliasStorage::note_written(const ViewChain& chain) {
  MetaComputeGuard guard;
  c10::impl::ExcludeDispatchKeyGuard untraced(layer_hidden_keys());
  const auto item = static_cast<int64_t>(base_.itemsize());
  const int64_t elements =
      std::max(static_cast<int64_t>(base_.storage().nbytes()) / item,
               static_cast<int64_t>(at::detail::computeStorageNbytes(base_.sizes(), base_.strides(),
                                                                     1, base_.storage_offset())));
  const at::Tensor room = at::empty({elements}, base_.options().device(c10::kMeta));
  at::Tensor view = room.as_strided(base_.sizes(), base_.strides(), base_.storage_offset());
  try {
    for (const ViewMeta* step : chain.steps()) view = step->forward_as_view(view);
  } catch (const c10::Error&) {
    view = room;  // a step not replayable on meta: the whole storage, written back whole
  }
  written_regions_.push_back(view);
}

void AliasStorage::set_base_(const at::Tensor& value) {
  TORCH_INTERNAL_ASSERT(updates_.empty(), "set_base_ with queued updates");
  base_ = in_own_storage_(value);
  if (!c10::GradMode::is_enabled() && !base_.is_same(value)) {
    // Copied into the old base's storage under no_grad: the copy keeps value's history.
    InnerCallGuard guard;
    base_ = with_history_of(base_, value, {}, /*views_kept=*/true);
  }
  ++generation_;
}

// Note [Alias: runs of regrouping views]
// A write through a chain of D views is inverted step by step: D-1 forward replays to rebuild
// each step's base, then D inverses. When the chain ends in a run of steps that only regroup
// elements in row-major order (view, _reshape_alias, squeeze: the inverse reads nothing of the
// base but its shape), the run is inverted at once: the mutated value regrouped into the shape
// the run started from. The steps inside the run need no forward replay either. A chain of
// reshapes (scale/depth) then costs O(1) per write instead of O(D). Composing the regroupings is
// exact: each is a row-major regrouping, and so is their composition (with views kept, a valid
// sequence of views composes to a valid view of the same elements). Rejected: collapsing runs in
// the middle of a chain too (the step after the run needs the run's forward result, which is a
// replay anyway) and collapsing any composable pair (transpose/permute; rarer in deep chains).
// Note [Alias: writes through an overlapping view]
// v = x.expand(3)[2] (or x.as_strided((2, 1), (0, 3), 4).unbind(0)[1]) is one element of x, but
// the step before it is a view in which several elements share memory. Inverting step by step
// scatters the written element into that view, whose own inverse must then fold its copies back
// into x: expand's sums them (v[2] = 3 would give x = 3 + 2 * x) and as_strided_scatter refuses
// overlapping geometry. In eager the write lands once, where v lies. So with views kept, when a
// step before the last produced memory that may overlap (torch cannot prove it disjoint) and the
// written view itself does not overlap, the write is one as_strided_scatter of the base at the
// written view's own sizes, strides and offset (its value is a real view of a base whose elements
// do not overlap: contiguous, in another dimension order, like a transposed input that is its own
// base written through as_strided(..).expand(..)[0], or with gaps and an offset, like an input
// b[1:] or b.real that keeps its own base under make_fx). The offset counts in the base's
// storage, as as_strided_scatter's does (it clones the base's whole storage).
// Without views the values are *_copy tensors with no geometry to read, so the chain's view ops
// are replayed on a meta tensor of the base's geometry for the same sizes, strides and offset
// (an expanded input written through its diagonal would otherwise meet torch's internal-overlap
// error in as_strided_scatter).
// Rejected: checking every chain for overlap (only chains longer than one step can have an
// intermediate, and only their forward replays are inspected, which are computed anyway).
namespace {
// Steps that can make elements share memory.
bool may_overlap(const ViewMeta& step) {
  static const c10::OperatorName expand{"aten::expand", ""}, as_strided{"aten::as_strided", ""},
      unfold{"aten::unfold", ""};
  const auto& name = step.op.operator_name();
  return name == expand || name == as_strided || name == unfold;
}

bool provably_disjoint(const at::Tensor& t) {
  if (t.layout() != c10::kStrided || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return true;
  }
  return at::has_internal_overlap(t) == at::MemOverlap::No;
}

bool overlaps(const at::Tensor& t) {
  if (t.layout() != c10::kStrided || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return false;
  }
  return at::has_internal_overlap(t) == at::MemOverlap::Yes;
}

// The written view of `chain` over `base` (its real view with views kept, a meta tensor of its
// geometry without) when a step before the last makes elements share memory and the view itself
// does not; nullopt otherwise. See Note [Alias: writes through an overlapping view].
std::optional<at::Tensor> written_geometry(const at::Tensor& base,
                                           const std::vector<const ViewMeta*>& chain) {
  const bool views_kept = chain.back()->reapply;
  std::optional<MetaComputeGuard> meta;
  at::Tensor view = base;
  if (!views_kept) {
    // Without views a bit step's value is resolved (_conj_copy), while its view on meta carries the
    // bit, on which the next step may not run (view_as_real of a conjugate view raises:
    // x1.conj().imag written, x1 beside x1.real); the scatter could not write such a view's values
    // as they are either, so the steps' own inverses do.
    static const c10::OperatorName conj{"aten::_conj", ""}, neg{"aten::_neg_view", ""};
    for (const auto* step : chain) {
      const auto& name = step->op.operator_name();
      if (name == conj || name == neg) return std::nullopt;
      for (const auto& a : step->args) {
        if (a.isTensor()) return std::nullopt;  // a meta replay needs every argument on meta
      }
    }
    meta.emplace();
    // The probe has the base's sizes, strides and offset (its elements do not overlap; gaps
    // between them, as an input b[:, ::2] keeps as its own base, are the probe's too).
    const auto nbytes =
        at::detail::computeStorageNbytes(base.sizes(), base.strides(), 1, base.storage_offset());
    view = at::empty({static_cast<int64_t>(nbytes)}, base.options().device(c10::kMeta))
               .as_strided(base.sizes(), base.strides(), base.storage_offset());
  }
  bool through_overlap = false;
  for (size_t i = 0; i < chain.size(); ++i) {
    view = views_kept ? chain[i]->forward(view) : chain[i]->forward_as_view(view);
    // An intermediate counts when it may share memory: torch's test answers "too hard" for
    // x.as_strided((7, 2), (1, 1)), whose step-by-step inverse would scatter one element twice
    // and keep the stale copy.
    through_overlap |= i + 1 < chain.size() && !provably_disjoint(view);
  }
  // The scatter writes values, not bits: the view must read the base's elements as they are.
  if (!through_overlap || overlaps(view) || (views_kept && !view.is_alias_of(base)) ||
      view.is_conj() != base.is_conj() || view.is_neg() != base.is_neg() ||
      view.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    return std::nullopt;
  }
  return view;
}

// See Note [Kernel: bool views of other bytes], case "write through a view of v".
namespace {
// expand's and unfold's inverses add up elements, which uint8 would not do as bool does.
bool sums_copies(const ViewMeta& step) {
  static const c10::OperatorName expand{"aten::expand", ""}, unfold{"aten::unfold", ""};
  return step.op.operator_name() == expand || step.op.operator_name() == unfold;
}

bool views_as_bool(const ViewMeta& step, const at::Tensor& base) {
  // The cheap tests first: this runs for each step of every chain written through.
  return base.scalar_type() != c10::kBool && step.views_as_bool();
}
}  // namespace

// `value` written into `base` (its elements do not overlap) at `view`'s sizes, strides and offset,
// which count in the base's storage, as as_strided_scatter's offset does. A view of another
// dtype (inputs x and x.view(torch.int32) share a byte base, Note [Inputs: aliased inputs]) is
// scattered into the base reinterpreted as its dtype and then reinterpreted back (expand's
// step-by-step inverse would sum the copies). nullopt where the base's bytes do not divide into the
// view's elements.
std::optional<at::Tensor> scatter_at(const at::Tensor& base, const at::Tensor& value,
                                     const at::Tensor& view, bool views_kept) {
  if (view.scalar_type() == base.scalar_type() && base.dim() > 0 &&
      !base.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      !base.is_non_overlapping_and_dense()) {
    // A base with gaps between its elements (an input b[1:, ::2] written, kept in its strides):
    // `view` counts in its storage, which eager's as_strided_scatter keeps (it copies the base
    // with its strides) and the fake kernel of torch < 2.15 does not (it copies the base densely,
    // and the view then reaches past its end). So the scatter runs on the storage up to the
    // base's last element, as one dense row, and the base's geometry is taken from the result.
    const auto numel = static_cast<int64_t>(
        at::detail::computeStorageNbytes(base.sizes(), base.strides(), 1, base.storage_offset()));
    const at::Tensor row =
        views_kept ? base.as_strided({numel}, {1}, 0) : at::as_strided_copy(base, {numel}, {1}, 0);
    const at::Tensor scattered = strided_scatter(row, value, view.sym_sizes(), view.sym_strides(),
                                                 view.sym_storage_offset());
    return views_kept ? scattered.as_strided(base.sizes(), base.strides(), base.storage_offset())
                      : at::as_strided_copy(scattered, base.sizes(), base.strides(),
                                            base.storage_offset());
  }
  if (view.scalar_type() == base.scalar_type()) {
    return strided_scatter(base, value, view.sym_sizes(), view.sym_strides(),
                           view.sym_storage_offset());
  }
  // A 0-d base (x.expand(3).view(torch.int32)[0] = 1 of a scalar x) is scattered as its 1-element
  // 1-D view. (An empty braced list would pick view(ScalarType).)
  if (base.dim() == 0) {
    const c10::IntArrayRef scalar{};
    const at::Tensor flat = views_kept ? base.view({1}) : at::view_copy(base, {1});
    auto scattered = scatter_at(flat, value, view, views_kept);
    if (!scattered) return std::nullopt;
    return views_kept ? scattered->view(scalar) : at::view_copy(*scattered, scalar);
  }
  const auto item = static_cast<int64_t>(view.itemsize());
  const auto base_item = static_cast<int64_t>(base.itemsize());
  if (base.dim() != 1 || !base.is_non_overlapping_and_dense() ||
      (base.numel() * base_item) % item != 0 || (base.storage_offset() * base_item) % item != 0 ||
      item % base_item != 0) {
    return std::nullopt;
  }
  // A bool view is scattered as uint8 (Note [Kernel: bool views of other bytes]).
  const auto dtype = view.scalar_type() == c10::kBool ? c10::kByte : view.scalar_type();
  const at::Tensor as_view_dtype = views_kept ? base.view(dtype) : at::view_copy(base, dtype);
  const at::Tensor bytes =
      dtype == view.scalar_type() ? value : (views_kept ? value.view(dtype) : value.to(dtype));
  const int64_t offset = base.storage_offset() * base_item / item;
  // Without views the reinterpreted base is a fresh copy, from offset 0.
  const at::Tensor scattered =
      strided_scatter(as_view_dtype, bytes, view.sym_sizes(), view.sym_strides(),
                      views_kept ? view.sym_storage_offset() : view.sym_storage_offset() - offset);
  return views_kept ? scattered.view(base.scalar_type())
                    : at::view_copy(scattered, base.scalar_type());
}

// See Note [Strides: what eager gives], case "inverted base".
at::Tensor in_base_strides(const at::Tensor& base, at::Tensor value, bool views_kept) {
  if (!same_sizes_other_strides(base, value) || base.layout() != c10::kStrided ||
      base.unsafeGetTensorImpl()->has_symbolic_sizes_strides() ||
      may_self_overlap(base.sizes(), base.strides())) {
    // See Note [Strides: what eager gives], case "written base", for dimensions of size 1.
    return views_kept ? with_size_one_strides_of(base, value) : value;
  }
  return restrided_copy(at::empty_strided(base.sizes(), base.strides(), value.options()), value);
}
}  // namespace

at::Tensor AliasStorage::folded_(const Update& update) {
  if (update.chain.empty()) return in_own_storage_(update.value);
  const auto chain = update.chain.steps();
  // unfold's and as_strided's inverses, and the scatter of a chain through expand, address the
  // base's storage: a graph holds for inputs laid out as the traced one
  // (Note [Inputs: storage coordinates under a tracer]).
  if (C10_UNLIKELY(traced_input_.defined()) &&
      std::any_of(chain.begin(), chain.end(), [](auto* s) { return may_overlap(*s); })) {
    guard_traced_input(*this);
  }
  if (chain.size() > 1 &&
      std::any_of(chain.begin(), chain.end() - 1, [](auto* s) { return may_overlap(*s); }) &&
      base_.layout() == c10::kStrided &&
      !base_.unsafeGetTensorImpl()->has_symbolic_sizes_strides() &&
      !may_self_overlap(base_.sizes(), base_.strides())) {
    // See Note [Alias: writes through an overlapping view].
    if (auto view = written_geometry(base_, chain)) {
      if (auto scattered = scatter_at(base_, update.value, *view, chain.back()->reapply)) {
        return std::move(*scattered);
      }
    }
  }
  // See Note [Alias: runs of regrouping views]: chain[run..] regroup only.
  size_t run = chain.size();
  while (run > 0 && is_regrouping(*chain[run - 1])) --run;
  const bool collapse = run + 1 < chain.size();
  const size_t inverted = collapse ? run : chain.size();  // steps inverted one by one
  // bases[i] is what chain[i] is applied to; the last step needs no forward replay, and a
  // collapsed run needs only its first base.
  std::vector<at::Tensor> bases{base_};
  const size_t forwards = collapse ? run : chain.size() - 1;
  at::Tensor value = update.value;
  try {
    for (size_t i = 0; i < forwards; ++i) bases.push_back(chain[i]->forward(bases.back()));
    // See Note [Kernel: bool views of other bytes], case "write through a view of v".
    size_t bytes_from = chain.size();  // the first step inverted as bytes
    for (size_t j = 0; j < forwards; ++j) {
      if (views_as_bool(*chain[j], bases[j])) {
        if (chain[j]->reapply) bytes_from = j + 1;
        TORCH_CHECK_NOT_IMPLEMENTED(
            chain[j]->reapply || bases[j].itemsize() == 1, "functionalize: a write through ",
            chain.back()->name(), " of a bool view of a ", bases[j].scalar_type(),
            " tensor (x.view(torch.bool)) is not supported with "
            "remove=\"mutations_and_views\": its copies would turn the tensor's other bytes "
            "into 0 or 1. Use remove=\"mutations\".");
        break;
      }
    }
    auto invert = [&](size_t i, const at::Tensor& v) {
      if (i < bytes_from || bases[i].scalar_type() != c10::kBool || sums_copies(*chain[i])) {
        return chain[i]->inverse(bases[i], v);
      }
      return chain[i]->inverse(bases[i].view(c10::kByte), v.view(c10::kByte)).view(c10::kBool);
    };
    if (collapse) value = invert(run, value);
    for (size_t i = inverted; i-- > 0;) value = invert(i, value);
  } catch (const c10::Error& e) {
    // A scatter into a view whose elements share memory, where no single geometry could take
    // the write (another dtype in the chain, say): named rather than torch's overlap error.
    const bool overlapping =
        std::any_of(chain.begin(), chain.end() - 1, [](auto* s) { return may_overlap(*s); });
    TORCH_CHECK_NOT_IMPLEMENTED(
        !overlapping, "functionalize: a write through a view made by ", chain.back()->name(),
        " of a tensor whose elements share memory (expand, unfold or as_strided in its chain) "
        "cannot be written back here (",
        e.what_without_backtrace(), "). Clone the tensor before viewing and writing it.");
    throw;
  }
  // See Note [Alias: writes to a value that is not its whole storage], then
  // Note [Strides: what eager gives], case "inverted base".
  at::Tensor placed = in_own_storage_(value);
  return placed.is_same(value) ? in_base_strides(base_, std::move(value), chain.back()->reapply)
                               : std::move(placed);
}

bool AliasStorage::apply_updates() {
  if (updates_.empty()) return false;
  InnerCallGuard guard;
  for (auto& update : updates_) {
    // Each write is folded in under the grad mode it was made in, whatever the mode of the read
    // that syncs; a hidden one leaves the base its autograd identity
    // (Note [Autograd: writes autograd does not see]).
    at::Tensor folded;
    {
      c10::AutoGradMode grad_mode(update.visible);
      folded = folded_(update);
    }
    const bool views_kept = update.chain.empty() || update.chain.back()->reapply;
    if (update.visible) {
      base_ = std::move(folded);
    } else if (base_.requires_grad()) {
      base_ = with_history_of_hidden_write(folded, base_, {&update.value}, views_kept);
    } else if (update.chain.cuts_history()) {
      // A base that requires no grad stays so, whatever history the detached alias written has
      // of its own (a leaf made from the base's detach(), nn.Parameter(base)).
      base_ = without_history(folded, views_kept);
    } else {
      // An alias that took this storage with `x.data = y` keeps x's identity through its replays
      // from this base (Note [Wrapper: x.data = y keeps x's autograd identity]).
      base_ = std::move(folded);
    }
  }
  updates_.clear();
  return true;
}

}  // namespace tfz::detail
