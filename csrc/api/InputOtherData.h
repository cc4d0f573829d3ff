// An input given other data inside f (`x.data = y`, x.set_(y)): whether it was, what the caller's
// tensor then takes, refused by name before any input is written, and giving it. The epilogue
// (api/Epilogue.cpp) calls these around its writes; see Note [Inputs: an input given other data].
#pragma once

#include "core/FunctionalTensorImpl.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace tfz::detail {

/// How the caller's input `original` takes its wrapper's other data, decided (and refused) before
/// any input is written, so a refusal leaves every input as it was.
struct OtherData {
  size_t index;          // of the input
  at::Tensor in_caller;  // untraced, a tensor on another input's memory: the data to give
  bool eager_data;       // untraced: set_data with the wrapper's value (or in_caller)
};

/// Whether input `original`'s wrapper was given data outside the caller's storage of `original`.
bool moved_to_other_data(const at::Tensor& original, const FunctionalTensorImpl& impl);
/// Decides how input i takes its wrapper's other data; raises (naming the case) where it cannot.
OtherData plan_other_data(const std::vector<at::Tensor>& originals,
                          const std::vector<at::Tensor>& wrappers, size_t i);
/// Gives the caller's input the data `plan` names; after the epilogue's writes of its old memory.
void give_other_data(const at::Tensor& original, const at::Tensor& wrapper, const OtherData& plan);

}  // namespace tfz::detail
