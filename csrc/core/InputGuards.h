// What a captured graph specialized on in its inputs (sizes, strides, dtype, device, grad
// requirement, which inputs share memory), recorded before the program runs and checked before
// each replay. Knows nothing of graphs or of Python. See Note [Capture: guards on inputs].
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace tfz::detail {

struct InputGuard {
  bool defined = false;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  // The storage's size, for an input whose graph may address its whole storage (one that does
  // not span it, alone in a small storage or sharing one with another input); -1 otherwise.
  int64_t storage_nbytes = -1;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool requires_grad = false;
  bool conj = false;
  bool neg = false;
  // The first input whose memory this input's shares (itself if none before it; -1 without
  // storage): the alias groups the program was captured with.
  int64_t alias_group = -1;
};

/// The guards of `inputs`, read before the program runs (it may change their metadata).
std::vector<InputGuard> record_input_guards(const std::vector<at::Tensor>& inputs);

/// Raises, naming the input (`names[i]`, or "input i" where names is shorter) and both values,
/// unless `inputs` match `guards`. The device is not compared where either side is meta.
void check_input_guards(const std::vector<InputGuard>& guards,
                        const std::vector<at::Tensor>& inputs,
                        const std::vector<std::string>& names = {});

}  // namespace tfz::detail
