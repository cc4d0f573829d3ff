// One recorded view step: which view op, its arguments, which output. Replays forward from a
// base (the view op, or its *_copy twin when views are removed) and inverts a mutated view back
// into a new base (ViewInverses.h). Pure data plus two calls; knows nothing about wrappers.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tfz::detail {

struct ViewMeta;

/// Rebuilds a base from the base before the mutation and the mutated view.
using InverseFn = at::Tensor (*)(const at::Tensor& base, const at::Tensor& mutated_view,
                                 const ViewMeta& meta);

struct ViewMeta {
  ViewMeta(c10::OperatorHandle op, std::optional<c10::OperatorHandle> copy_op,
           std::vector<c10::IValue> args, int64_t out_index, bool reapply, InverseFn inverse_fn)
      : op(std::move(op)),
        copy_op(std::move(copy_op)),
        args(std::move(args)),
        out_index(out_index),
        reapply(reapply),
        inverse_fn(inverse_fn) {}

  c10::OperatorHandle op;  // the (out-of-place) view op, e.g. aten::slice.Tensor
  std::optional<c10::OperatorHandle> copy_op;  // its *_copy twin, if any
  std::vector<c10::IValue> args;               // every argument after self, as passed
  int64_t out_index;                           // output index of a multi-output view, -1 otherwise
  bool reapply;                                // true: replay with `op`; false: with `copy_op`
  InverseFn inverse_fn;                        // nullptr: mutation through this view unsupported

  /// A step as_strided(sizes, strides, offset) over a storage's flat base (aliased inputs,
  /// resize_), replayed with as_strided (reapply) or as_strided_copy, inverted by
  /// as_strided_scatter.
  static std::shared_ptr<const ViewMeta> as_strided(c10::SymIntArrayRef sizes,
                                                    c10::SymIntArrayRef strides,
                                                    const c10::SymInt& offset, bool reapply);

  /// A step of the single-output view op `view_op` (which must have an inverse) with the
  /// arguments after self, replayed with it or its *_copy twin.
  static std::shared_ptr<const ViewMeta> of(const c10::OperatorName& view_op,
                                            std::vector<c10::IValue> args, bool reapply);

  /// Replays this step on `base`. Call inside an InnerCallGuard.
  at::Tensor forward(const at::Tensor& base) const;
  /// Is `view_op` view(dtype)?
  static bool is_dtype_view(const c10::OperatorHandle& view_op);
  /// This step is view(torch.bool) (of any dtype: callers check the input's).
  bool views_as_bool() const {
    return args.size() == 1 && args[0].isInt() &&
           static_cast<c10::ScalarType>(args[0].toInt()) == c10::kBool && is_dtype_view(op);
  }
  /// What the *_copy variant of `view_op` reads for `base`: `base`, or an empty tensor of its
  /// sizes where view(dtype) needs other strides.
  /// See Note [Strides: what eager gives], case "empty views".
  static at::Tensor copy_input(const c10::OperatorHandle& view_op, const at::Tensor& base);
  /// Untraced without views, the value of base.view(torch.bool) of another dtype: its bytes'
  /// copy seen as bool; nullopt where view_copy gives the value.
  /// See Note [Kernel: bool views of other bytes], case "v without views".
  static std::optional<at::Tensor> bool_view_keeping_bytes(const c10::OperatorHandle& view_op,
                                                           const at::Tensor& base,
                                                           const c10::IValue& dtype);
  /// Replays this step with the view op itself, whatever `reapply` says: the view's geometry on
  /// a meta probe (Note [Alias: writes through an overlapping view]).
  at::Tensor forward_as_view(const at::Tensor& base) const;
  /// Runs `handle` (a view op or its *_copy twin) on the boxed `stack` (self, then the other
  /// arguments); a detach_copy runs with grad mode off. See Note [View: detach without views].
  static void call_view_op(const c10::OperatorHandle& handle, torch::jit::Stack* stack);
  /// Returns the new base after `mutated_view` was written through this step. Throws
  /// NotImplementedError naming the op if it has no inverse.
  at::Tensor inverse(const at::Tensor& base, const at::Tensor& mutated_view) const;
  /// Runs `handle` (`op` or `copy_op`) on `base` with this step's arguments.
  at::Tensor replay(const c10::OperatorHandle& handle, const at::Tensor& base) const;
  /// "aten::slice.Tensor"
  std::string name() const { return c10::toString(op.operator_name()); }
  /// Argument i (after self) as the given type.
  const c10::IValue& arg(size_t i) const { return args.at(i); }
};

}  // namespace tfz::detail
