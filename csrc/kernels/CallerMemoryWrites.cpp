// Writes into an input done in the caller's memory, each with an undo entry: what makes a
// KV-cache update or a slice write inside a functionalized call cost what eager's does. See
// kernels/CallerMemoryWrites.h.
#include "kernels/CallerMemoryWrites.h"

#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/UndoLog.h"
#include "kernels/Handlers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <vector>

namespace tfz::detail {

// Note [Undo: writes into the caller's memory]
// cache.index_copy_(2, pos, k) on a 128 MiB input, run functionally, allocates a new 128 MiB
// cache and copies it back into the input in the epilogue: ~290x eager's time and 128 MiB more
// memory for a write of a few KiB; x[:, 0:64] = y costs the same through slice_scatter. Where
// nothing can tell, the write goes to the caller's tensor at once, as eager's does, and the call
// keeps an undo entry: the old values of what the op is about to overwrite (index_select /
// index of an indexed write's own indices; a clone of a written view), as small as the write.
// If the call raises, call_functionalized replays the entries newest first, so the contract that
// an exception leaves every input untouched holds. "Nothing can tell" means all of:
//   - the call keeps an undo log (call_functionalized; not a FunctionalizeGuard, whose caller
//     writes the inputs back itself) and nothing records the program (no tracer, no mode, no
//     torch.func transform): a graph must stay functional;
//   - the op writes one argument, self, in place, and self is either
//       an input's own wrapper (a base, up to date, no update queued, no other wrapper in its
//       alias storage) written by index_copy_ or index_put_ (an op that writes all of self keeps
//       the functional path: its undo copy would cost what the functional value costs), or
//       a view of an input (views kept, so its inner value is a view of the caller's tensor; no
//       conj/neg bit, no metadata change, no detach or .data step (their version counters and
//       autograd records are their own), a storage of plain geometry), written by any op;
//   - no argument requires grad under grad mode (autograd's records stay those of the
//     functional path), every wrapper among the arguments belongs to this call, and the op's
//     arguments do not read the memory it writes (check_no_read_of_written_memory, as on the
//     functional path).
// The op then runs as called on the inner values. If eager's kernel raises (its checks come
// before any write), the entry is dropped and the functional path runs, raising eager's rule
// under the op's name. A write to the input's own wrapper commits as the in-place fast path
// does; a write through a view starts a new generation of the storage with the same base (the
// caller's tensor, which holds the new values), so every wrapper of it replays its views. The
// write bumps the version once, as eager's does; the wrapper counts it too, so the epilogue adds
// none, and its copy_ of the base onto itself returns at once. A call that raises leaves the
// values restored and the version bumped.
// Rejected: an undo copy of the whole written tensor for any in-place op on an input (as large
// as the functional value it replaces: no gain); writing in place with no undo (an exception
// inside the call would leave the input half written, unlike the functional path).

namespace {

enum class Recipe { None, IndexCopy, IndexPut };

Recipe recipe_of(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (!schema.overload_name().empty()) return Recipe::None;
  if (schema.name() == "aten::index_copy_") return Recipe::IndexCopy;
  if (schema.name() == "aten::index_put_") return Recipe::IndexPut;
  return Recipe::None;
}

enum class Place { Elsewhere, CallerTensor, ViewOfCallerTensor };

// Where a written wrapper's value lies, for the Note's conditions on self.
Place place_of(const at::Tensor& wrapper, const Layer& layer) {
  auto* impl = maybe_get_impl(wrapper);
  // Most writes are to values made inside the call: one flag tells them apart before any sync.
  if (impl == nullptr || impl->layer_id() != layer.id || impl->has_metadata_mutation() ||
      !impl->alias_storage().has_caller_storage()) {
    return Place::Elsewhere;
  }
  // A view made from a base that a write left stale is itself stale until synced; syncing is
  // what the functional path does first too (a replay of its views when nothing is queued).
  impl->sync_();
  const auto& storage = impl->alias_storage();
  if (storage.has_pending_updates() || !impl->is_up_to_date()) return Place::Elsewhere;
  const at::Tensor& value = impl->value();
  const at::Tensor& base = storage.base();
  if (maybe_get_impl(value) != nullptr || !nothing_records(value) ||
      !storage.in_caller_storage(value) || !storage.in_caller_storage(base)) {
    return Place::Elsewhere;
  }
  if (impl->chain().empty()) {
    return value.unsafeGetTensorImpl() == base.unsafeGetTensorImpl() &&
                   wrapper.storage().use_count() == 1
               ? Place::CallerTensor
               : Place::Elsewhere;
  }
  const auto flips = impl->chain().bit_flips();
  const bool plain_storage = !storage.flat() && !storage.bytes() && !storage.offset_base() &&
                             !storage.captured() && !storage.grown_start();
  return layer.reapply_views && plain_storage && !flips.first && !flips.second &&
                 !impl->chain().cuts_history() && value.is_alias_of(base)
             ? Place::ViewOfCallerTensor
             : Place::Elsewhere;
}

// The undo entry for the op about to run on `inner` (its arguments, unwrapped): the old values of
// the slots an indexed write names, or of the whole written view.
void record_undo(Recipe recipe, const std::vector<c10::IValue>& inner, UndoLog& log) {
  const at::Tensor target = inner[0].toTensor();
  if (recipe == Recipe::IndexCopy) {
    const int64_t dim = inner[1].toInt();
    const at::Tensor index = inner[2].toTensor();
    at::Tensor saved = at::index_select(target, dim, index);
    log.record([target, dim, index, saved] { target.index_copy_(dim, index, saved); });
  } else if (recipe == Recipe::IndexPut) {
    const auto indices = inner[1].to<c10::List<std::optional<at::Tensor>>>();
    at::Tensor saved = at::index(target, indices);
    log.record([target, indices, saved] { target.index_put_(indices, saved, false); });
  } else {
    at::Tensor saved = target.clone();
    log.record([target, saved] { target.copy_(saved); });
  }
}

}  // namespace

bool writes_through_view_of_caller_memory(const at::Tensor& written, const Layer& layer) {
  return place_of(written, layer) == Place::ViewOfCallerTensor && undo_log_of(layer.id) != nullptr;
}

bool write_into_caller_memory(const OpInfo& info, const c10::OperatorHandle& op,
                              torch::jit::Stack* stack, const Layer& layer) {
  if (info.written.size() != 1 || info.written[0].index != 0 || info.written[0].is_out) {
    return false;
  }
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::IValue& first = *(stack->end() - static_cast<std::ptrdiff_t>(num_args));
  if (!first.isTensor()) return false;
  const Place place = place_of(first.toTensor(), layer);
  if (place == Place::Elsewhere) return false;
  const Recipe recipe = recipe_of(op);
  UndoLog* log = undo_log_of(layer.id);
  if (log == nullptr || (place == Place::CallerTensor && recipe == Recipe::None) ||
      is_bool_view_of_wider_bytes(first.toTensor())) {
    return false;
  }
  std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  const at::Tensor self = args[0].toTensor();
  bool other_layer_or_grad = false;
  for (size_t i = 1; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      auto* impl = maybe_get_impl(t);
      other_layer_or_grad |= (impl != nullptr && impl->layer_id() != layer.id) ||
                             (t.requires_grad() && c10::GradMode::is_enabled());
    });
  }
  if (other_layer_or_grad) return false;
  check_writable(info.name, schema.arguments()[0].name(), self);
  check_no_read_of_written_memory(info, schema, args);
  std::vector<c10::IValue> inner = args;
  for (auto& v : inner) transform_tensors(v, sync_and_unwrap);
  uint32_t bumps = 1;  // eager's in-place kernel bumps the written tensor's version once
  {
    InnerCallGuard guard;
    try {
      record_undo(recipe, inner, *log);
    } catch (const c10::Error&) {
      return false;  // bad indices: the functional path raises eager's rule under the op's name
    }
    torch::jit::Stack call(inner.begin(), inner.end());
    const uint32_t version_before = inner[0].toTensor()._version();
    try {
      op.callBoxed(call);
    } catch (const c10::Error&) {
      log->drop_last();
      return false;
    }
    // A custom op's body bumps the version once per in-place op it runs, after its own bump
    // (Note [Kernel: custom mutable ops]): the caller's memory counted them all.
    if (info.versions_counted_on_results) {
      bumps = std::max<uint32_t>(inner[0].toTensor()._version() - version_before, 1);
    }
  }
  inner.clear();  // back to the wrapper's and the storage's references before committing
  if (place == Place::CallerTensor) {
    commit_written_in_place(self, info.bumps_versions);
    bumps -= 1;
  }
  if (info.bumps_versions && self.unsafeGetTensorImpl()->version_counter().enabled()) {
    for (uint32_t i = 0; i < bumps; ++i) self.unsafeGetTensorImpl()->bump_version();
  }
  if (place != Place::CallerTensor) {
    // Written through a view: the base (the caller's tensor) holds the new values already. A new
    // generation makes every wrapper of the storage, this one included, replay its views of it.
    auto& storage = unsafe_get_impl(self)->alias_storage();
    storage.set_base_(storage.base());
  }
  torch::jit::drop(*stack, num_args);
  for (int alias : info.return_aliases) {
    torch::jit::push(*stack, alias >= 0 ? args[static_cast<size_t>(alias)] : c10::IValue());
  }
  return true;
}

}  // namespace tfz::detail
