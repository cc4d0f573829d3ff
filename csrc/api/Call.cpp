// call_functionalized: wrap, run, sync, epilogue, unwrap. See api/Call.h.
#include "api/Call.h"

#include "api/AliasedOutputs.h"
#include "api/Epilogue.h"
#include "api/InputGroups.h"
#include "core/Conversions.h"
#include "core/Layer.h"
#include "core/Recorder.h"
#include "core/UndoLog.h"
#include "kernels/Registration.h"

namespace tfz::detail {

// Note [API: input epilogue]
// After the call, each input gets exactly what eager would have done to it, in the caller's
// dispatch state (so make_fx records it at the end of the graph):
//   1. if its metadata changed in place (t_, transpose_, squeeze_, resize_, ...), eager's final
//      sizes, strides and offset, computed on a meta probe and applied with resize_ (storage
//      growth) and as_strided_ (Note [Inputs: metadata epilogue]);
//   2. if its size changed otherwise, a resize_ to the new size;
//   3. if any data was written to its storage (through it or any alias), one copy_ of the new
//      value; inputs sharing a storage are written once (Note [Inputs: aliased inputs]).
//      Inputs that were only viewed or whose metadata alone changed get no copy_.
// call_functionalized runs it; the work is done by write_back_inputs (api/Epilogue.cpp).
// Rejected: a copy_ of every input whatever f did to it (simpler, but every graph would then
// write every input in full, a mutation a backend must keep even for inputs f only read); and
// returning the new values for the caller to write back, as AOTAutograd does (functionalize(f)
// keeps f's contract: the caller's inputs end as eager leaves them).

std::vector<at::Tensor> call_functionalized(const std::vector<at::Tensor>& inputs, Remove remove,
                                            bool alias_outputs, const FlatFn& fn) {
  ensure_registered();
  std::vector<at::Tensor> wrapped, outputs;
  std::unique_ptr<LayerAutograd> autograd;  // See Note [Autograd: .backward() inside the function]
  UndoLog undo;                             // See Note [Undo: writes into the caller's memory]
  try {
    LayerGuard layer(remove == Remove::Mutations);
    UndoScope undo_scope(layer.layer().id, undo);
    wrapped = wrap_inputs(inputs, layer.layer());
    outputs = fn(wrapped);
    for (auto& t : outputs) {
      if (auto* impl = maybe_get_impl(t)) {
        impl->sync_();
      } else if (C10_UNLIKELY(t.defined() && ops_are_recorded())) {
        // A gradient torch.autograd.grad returned plain: its traced value.
        // See Note [Autograd: formula temporaries written in place].
        if (auto traced = traced_saved_output(t)) t = *std::move(traced);
      }
    }
    for (const auto& t : wrapped) {
      if (auto* impl = maybe_get_impl(t)) impl->sync_();
    }
    autograd = layer.take_autograd();
  } catch (...) {
    undo.rollback();  // after the layer is gone: plain ops on the caller's tensors
    throw;
  }
  write_back_inputs(inputs, wrapped);
  if (autograd) autograd->finish(ops_are_recorded());
  const bool eager_strides = remove == Remove::MutationsAndViews && !ops_are_recorded();
  for (auto& t : outputs) {
    const at::Tensor wrapper = t;
    t = unwrap_output(t, inputs, wrapped, alias_outputs);
    if (eager_strides && maybe_get_impl(wrapper) != nullptr) {
      t = output_in_eager_strides(wrapper, t);
    }
  }
  return outputs;
}

}  // namespace tfz::detail
