// The one implementation of a functionalized call, shared by the C++ API (tfz::functionalize) and
// the Python one (torch_functionalize.functionalize, through the bindings): each keeps only what
// is its own (C++: IValue trees; Python: pytrees, argument checks, tracer detection).
#pragma once

#include <torch_functionalize/functionalize.h>

#include <functional>
#include <vector>

namespace tfz::detail {

/// The function being functionalized, over flat tensor lists: wrappers in, tensors out.
using FlatFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Enters a layer (`remove`), wraps `inputs` (inputs sharing a storage share one alias storage,
/// Note [Inputs: aliased inputs]), runs `fn` on the wrappers and syncs what it returned and the
/// inputs; then, with the layer gone and in the caller's dispatch state (so tracers record it
/// last), writes input mutations back (Note [API: input epilogue]) and unwraps the outputs. With
/// `alias_outputs`, an output that is an input or a view of one aliases the caller's tensor
/// (Note [Inputs: outputs that alias inputs]). Undefined tensors pass through. On an exception
/// nothing is written back and the thread's dispatch state is restored.
std::vector<at::Tensor> call_functionalized(const std::vector<at::Tensor>& inputs, Remove remove,
                                            bool alias_outputs, const FlatFn& fn);

}  // namespace tfz::detail
