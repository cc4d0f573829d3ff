// What a write that eager's autograd does not see leaves of a tensor's autograd identity: the
// new value takes the old one's gradient edge (Note [Autograd: writes autograd does not see]).
// Pure functions on plain tensors; knows nothing about wrappers or layers.
#pragma once

#include <ATen/core/Tensor.h>

namespace tfz::detail {

/// `value` (the new data of a tensor) carrying `old`'s autograd identity: the same grad_fn and
/// output number, or, for a leaf that requires grad, a grad_fn that is the leaf's own grad
/// accumulator (so gradients still accumulate into the leaf). `value` itself when `old` requires
/// no grad or `value` already has that edge. `value` is changed in place only when it has no
/// autograd metadata and is none of `holders` (tensors someone else keeps, whose autograd state
/// must not change); otherwise the result is a new tensor sharing its data: a shallow copy
/// eagerly, an `alias` (views kept) or a `clone` (views removed) when ops are recorded, so a
/// tracer knows it. Call under an InnerCallGuard.
at::Tensor with_history_of(const at::Tensor& value, const at::Tensor& old,
                           std::initializer_list<const at::Tensor*> holders, bool views_kept);

/// with_history_of for the new value of a write autograd does not see (under no_grad, through
/// x.detach() or x.data). Where ops are recorded into a graph and `old` requires grad, the value
/// is the recorded tfz::_with_gradient_of(value, old) with old's edge, so the graph run under
/// autograd gives it that edge too (Note [Graphs: writes autograd does not see]). Call under an
/// InnerCallGuard.
at::Tensor with_history_of_hidden_write(const at::Tensor& value, const at::Tensor& old,
                                        std::initializer_list<const at::Tensor*> holders,
                                        bool views_kept);

/// `value`'s data without autograd history: the new data of a tensor that requires no grad,
/// written through an alias autograd does not connect to it (a leaf made from its detach()
/// that requires grad, nn.Parameter(t)). `value` itself when it requires no grad; otherwise a
/// new tensor sharing its data, made under no_grad as with_history_of makes one. Call under an
/// InnerCallGuard.
at::Tensor without_history(const at::Tensor& value, bool views_kept);

/// at::copy(dst, src): src's values in dst's layout (and dtype), as a functional op a graph can
/// hold, with src's gradient edge when src requires grad (torch gives aten::copy no derivative;
/// as a change of layout its gradient is the identity). Call under an InnerCallGuard.
at::Tensor restrided_copy(const at::Tensor& dst, const at::Tensor& src);

/// The leaf whose grad accumulator is `value`'s grad_fn (a value that stands for that leaf after
/// a write autograd did not see), or an undefined tensor.
at::Tensor leaf_standing_for(const at::Tensor& value);

/// Whether a tensor made without dispatch (a shallow copy of `value`) would be unknown to someone
/// who tracks tensors by identity: make_fx's mode, a tensor subclass, a torch.func transform, or
/// a capture's recorder.
bool may_be_tracked(const at::Tensor& value);

/// Whether `value` has `original`'s gradient edge: the writes that made it were hidden from
/// autograd, so writing it back into `original` must record no history either.
bool has_history_of(const at::Tensor& value, const at::Tensor& original);

}  // namespace tfz::detail
