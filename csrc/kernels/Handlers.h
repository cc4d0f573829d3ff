// What the kernel files share: the handler signature, the generic handler of each OpKind, the
// pieces of the mutation plan that the unboxed kernels reuse, and output wrapping. Registration
// and the table of special operators have headers of their own (Registration.h, SpecialOps.h).
#pragma once

#include "core/Layer.h"
#include "core/OpSchemaInfo.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tfz::detail {

class FunctionalTensorImpl;

/// Handles one call of `op` whose arguments (on top of `stack`) include a wrapper of `layer`,
/// and leaves the op's returns on the stack.
using Handler = void (*)(const OpInfo& info, const c10::OperatorHandle& op,
                         torch::jit::Stack* stack, const Layer& layer);

// The generic handlers: what an op's schema (OpKind) asks for.
/// Without views, some argument (a wrapper) reports other strides than its value has:
/// the op's fresh results then take eager's strides from a meta run
/// (Note [Strides: what eager gives], case "op results").
bool reports_eager_strides_of_results(const c10::IValue& arg);
/// `args` with every tensor replaced by its meta twin (core/Layout.h: same sizes, strides and
/// offset, on the meta device); raises for a symbolic or non-strided tensor. Call under
/// MetaComputeGuard.
std::vector<c10::IValue> meta_twins_of(std::vector<c10::IValue> args);
/// `result`, a fresh wrapper, reports `meta`'s geometry where the sizes agree.
void adopt_eager_strides(const at::Tensor& result, const at::Tensor& meta);
/// Without views: replaces the storage's base by a copy in eager's strides where they differ, so
/// storage coordinates name eager's elements.
/// See Note [Strides: what eager gives], case "storage coordinates".
void base_in_eager_strides(FunctionalTensorImpl& impl);
void functional_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                       const Layer& layer);
void view_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 const Layer& layer);
void inplace_view_kernel(const OpInfo& info, const c10::OperatorHandle& op,
                         torch::jit::Stack* stack, const Layer& layer);
void mutable_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const Layer& layer);
/// The generic handler of info.kind (Unsupported raises NotImplementedError with the reason).
void generic_kernel(const OpInfo& info, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                    const Layer& layer);

/// After rrelu_with_noise_functional ran on `inner` (the mutable op's arguments, unwrapped) and
/// left `results`: the result autograd sees is self * noise_out, whose derivative is eager's.
/// See Note [Kernel: rrelu's noise under autograd].
void differentiate_rrelu_through_its_noise(const OpInfo& info, const c10::OperatorHandle& op,
                                           const std::vector<c10::IValue>& inner,
                                           torch::jit::Stack& results);

/// Inside a layer, while a backward runs: an in-place op whose one written argument is a plain
/// temporary nothing else can see runs on the values (under a tracer as its functional variant,
/// the temporary's memory taking the result unrecorded). Returns false (nothing done) otherwise.
/// See Note [Autograd: formula temporaries written in place].
bool write_formula_temporary(const OpInfo& info, const c10::OperatorHandle& op,
                             torch::jit::Stack* stack);

/// After `copy` ran on `inner` (copy_'s arguments, unwrapped) and left `results`: the result's
/// grad_fn is eager's CopyBackwards. See Note [Kernel: copy's derivative].
void differentiate_copy(const OpInfo& info, const std::vector<c10::IValue>& inner,
                        torch::jit::Stack& results);

/// Calls copy_'s functional variant on `inner` into `fstack` when self or src carries a
/// forward-mode tangent, giving the result src's; returns false (nothing done) otherwise.
/// See Note [Kernel: copy's forward derivative].
bool copy_with_tangent(const OpInfo& info, const std::vector<c10::IValue>& inner,
                       torch::jit::Stack& fstack);

/// mutable_kernel with the functional variant called on the wrappers instead of their inner
/// values, Python un-hidden, so a composite variant decomposes above our key (under a
/// TorchDispatchMode only; see Note [Kernel: composites intercepted whole]).
void mutable_kernel_on_wrappers(const OpInfo& info, const c10::OperatorHandle& op,
                                torch::jit::Stack* stack, const Layer& layer);

/// Whether `layer` runs a control-flow branch that lifts closures (Note [Control flow: closures]).
bool lifts_closures(const Layer* layer);

/// A wrapper of another layer (or of none) reached op `op_name`'s kernel: throws the error that
/// says why (a torch.func transform inside the function, or an escaped wrapper).
[[noreturn]] void report_foreign_wrapper(std::string_view op_name, const FunctionalTensorImpl& impl,
                                         const Layer* layer);

// Pieces of mutable_kernel shared with the unboxed in-place/out= kernels.
/// Eager's rules for writing `value` into `written` (Note [Kernel: eager errors of in-place ops]).
void check_eager_rules(std::string_view op_name, const at::Tensor& written, const at::Tensor& value,
                       bool resizes);
/// Argument `read_index` of `op` may not share memory with the written argument `written_index`
/// in a way eager's kernel order would observe (Note [Kernel: writes that read their own memory]).
/// `resized_to`: the sizes an out= resize gives `written` before the kernel writes it.
void check_read_of_written(const c10::OperatorName& op, const at::Tensor& written,
                           int written_index, const at::Tensor& read, int read_index,
                           c10::OptionalIntArrayRef resized_to = std::nullopt);
/// A write of the function's values into captured plain tensors, run eagerly as eager runs it;
/// false (nothing done) under a tracer or a capture, or when a written tensor is a wrapper.
/// See Note [Kernel: writes into captured tensors].
bool write_captured_eagerly(const OpInfo& info, const c10::OperatorHandle& op,
                            torch::jit::Stack* stack, const Layer& layer);
/// Eager's call of `op` on the arguments' values (our keys excluded); results are wrapped, except
/// a result that is the first of a pair of `returned_as` (a plain tensor the op wrote and
/// returns), which comes back as its second.
void run_on_values_eagerly(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const Layer& layer,
                           const std::vector<std::pair<at::Tensor, at::Tensor>>& returned_as);
/// `t`, passed as written argument `arg_name`, must be a wrapper without internal overlap.
void check_writable(std::string_view op_name, std::string_view arg_name, const at::Tensor& t);
/// The written wrapper now holds `value`: replace, commit to its alias storage, sync. An out=
/// wrapper of another shape is first resized as eager's resize_output does (resize_functional),
/// whose refusals name `op_name` (the out= op).
void write_back(const at::Tensor& wrapper, const at::Tensor& value, bool counts_version = true,
                std::string_view op_name = "aten::resize_");
/// resize_ of a wrapper (Note [Kernel: resize_]); `layer` is the layer the wrapper belongs to.
/// With `then_strides`, the resized wrapper is then restrided to them in place (as_strided_ at its
/// offset), as a structured out= kernel restrides the output it resized
/// (Note [Strides: what eager gives], case "resized out="). `overwritten`: the caller writes every
/// element of the resized tensor next (an out= result), so none of the storage's old ones shows.
void resize_functional(std::string_view op_name, const at::Tensor& self,
                       const std::vector<int64_t>& size, const c10::IValue& memory_format,
                       const Layer& layer, c10::IntArrayRef then_strides = {},
                       bool overwritten = false, bool counts_version = true);
/// Whether an in-place op may write the wrapper's inner value directly, because nothing else
/// can observe it (Note [Kernel: in-place on the inner value]).
bool can_write_inner_in_place(const at::Tensor& wrapper);
/// Whether the out= wrapper `wrapper` (inner value `out`) gets its value from the out= kernel
/// itself run into fresh_out_like(wrapper, out), not from the functional `result`: eager's numbers
/// in out's dtype, eager's strides after a resize (Note [Kernel: out= of another dtype]).
bool out_takes_eager_kernel(const at::Tensor& wrapper, const at::Tensor& out,
                            const at::Tensor& result);
/// A private tensor of the wrapper's sizes and strides and the inner out's options.
at::Tensor fresh_out_like(const at::Tensor& wrapper, const at::Tensor& out);
/// A bool wrapper over a storage of wider elements (x.view(torch.bool) of a float x): its in-place
/// writes take the boxed path (Note [Kernel: bool views of other bytes]).
bool is_bool_view_of_wider_bytes(const at::Tensor& wrapper);
/// After such a write: the inner value is the storage's new base.
void commit_written_in_place(const at::Tensor& wrapper, bool counts_version = true);
/// Whether self's inner value is the caller's memory with grad mode on: an in-place op on it
/// then reads a clone when any argument requires grad.
/// See Note [Kernel: writes to inputs under autograd].
bool reads_input_under_autograd(const at::Tensor& wrapper, const at::Tensor& self_inner);

/// The functional variant's argument that `src` names, from the unwrapped arguments `args` of
/// the mutable op (`first_out`: its first out= tensor, or undefined).
c10::IValue functional_arg(const ArgSource& src, const c10::Argument& schema_arg,
                           const std::vector<c10::IValue>& args, const at::Tensor& first_out);
/// Why a result of a *_scatter op or copy of a view has an offset base without views: eager's
/// result holds the view's whole storage.
/// See Note [Alias: writes to a value that is not its whole storage].
extern const char* const kCopiedViewStorage;
/// A plain strided tensor with concrete sizes and data: not meta, fake (Python key) or a
/// torch.func wrapper, so an op can run on it for real (hidden from tracers).
bool is_real(const at::Tensor& t);
/// No tracer, torch.func transform, tensor subclass or autograd records ops on `value`.
bool nothing_records(const at::Tensor& value);

// Steps of mutable_kernel (MutationKernels.cpp) that live in files of their own.
/// WriteChecks.cpp: refuses, before the call, a write that torch's functional copy or *_scatter
/// cannot make (Note [Kernel: functional variants that clone a storage of partial elements]).
void check_whole_elements_for_clone(const OpInfo& info, const std::vector<c10::IValue>& inner);
/// WriteChecks.cpp: no argument may read memory the op writes in a way eager's kernel order would
/// observe (Note [Kernel: writes that read their own memory]); `args` are the wrappers, and
/// `results` (if given) the functional results, whose sizes an out= tensor is resized to.
void check_no_read_of_written_memory(const OpInfo& info, const c10::FunctionSchema& schema,
                                     const std::vector<c10::IValue>& args,
                                     const torch::jit::Stack* results = nullptr);
/// OutArguments.cpp: out= results that resize their out= tensor take the strides eager's out=
/// kernel leaves (Note [Strides: what eager gives], case "resized out="); `fstack` holds the
/// functional results.
void out_results_in_eager_strides(const OpInfo& info, const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& args, torch::jit::Stack& fstack,
                                  bool views_kept);
/// OutArguments.cpp: replaces the functional result by the out= kernel's own where
/// out_takes_eager_kernel says so (Note [Kernel: out= of another dtype], case "eagerly").
void rerun_out_eagerly(const OpInfo& info, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& args, const std::vector<c10::IValue>& inner,
                       torch::jit::Stack& fstack);
/// OutArguments.cpp: an out= op whose composite decomposition is recorded in graphs, and the sizes
/// out must be resized to first (Note [Kernel: out= of another dtype],
/// case "composites in graphs").
struct CompositeOut {
  c10::DispatchKey key;
  std::optional<std::vector<int64_t>> resize_to;  // the result's sizes, where out has others
};
std::optional<CompositeOut> composite_out_of_another_dtype(const OpInfo& info,
                                                           const c10::OperatorHandle& op,
                                                           const torch::jit::Stack& stack);
/// BoolViewWrites.cpp: the written bool view's new value, computed byte-exactly where it must be,
/// or nullopt for the functional path.
/// See Note [Kernel: bool views of other bytes].
std::optional<at::Tensor> write_bool_bytes_in_place(const OpInfo& info,
                                                    const c10::OperatorHandle& op,
                                                    const std::vector<c10::IValue>& args,
                                                    const std::vector<c10::IValue>& inner,
                                                    const Layer& layer);

/// Wraps every tensor among the last `count` stack entries as a fresh base wrapper.
void wrap_outputs(torch::jit::Stack* stack, size_t count, int64_t layer_id);

/// Un-hides the Python key (but not PythonTLSSnapshot) for a composite op's work on wrappers under
/// a TorchDispatchMode: ATen's dispatch_mode_enabled() then holds, so CIA kernels take their
/// dispatcher-only paths. Every op they call still reaches our key first (it is in the included
/// set and above Python), so nothing reaches the mode except through an inner call. See
/// Note [Kernel: composites intercepted whole].
class PythonUnhiddenGuard {
 public:
  PythonUnhiddenGuard() : guard_(unhidden()) {}

 private:
  static c10::impl::LocalDispatchKeySet unhidden();
  c10::impl::ForceDispatchKeyGuard guard_;
};

}  // namespace tfz::detail
