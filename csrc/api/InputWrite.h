// Writing one input's final value into the caller's tensor, with the autograd history eager's
// in-place write records (or none, through .data, where eager's records none). Shared by the
// epilogue (api/Epilogue.cpp) and the phase that gives an input other data
// (api/InputOtherData.cpp); what is written when is theirs.
#pragma once

#include "core/FunctionalTensorImpl.h"

#include <ATen/core/Tensor.h>

namespace tfz::detail {

/// Whether `t` has a .data of its own to write through (no version bump, no history): a strided,
/// non-inference tensor that is no torch.func or Python-subclass wrapper, outside a recording.
bool has_data_of_its_own(const at::Tensor& t);
/// `t`'s .data where has_data_of_its_own, else `t`.
at::Tensor unversioned(const at::Tensor& t);
/// Whether a write of `value` into input `original` records no history: neither requires grad.
bool records_no_history(const at::Tensor& original, const at::Tensor& value);
/// Whether `value`, the final value of `original`, was written only where autograd does not see.
bool written_unseen(const at::Tensor& original, const at::Tensor& value);
/// The tensor through which `base`'s elements are written into `original`'s storage.
at::Tensor storage_writer(const at::Tensor& original, const at::Tensor& base);
/// Writes the wrapper's final value into `original` (resizing it where its sizes changed without
/// a metadata op), recording eager's history, or none where eager records none.
void write_data(const at::Tensor& original, const FunctionalTensorImpl& impl);

}  // namespace tfz::detail
