// Unit tests of the autograd-identity helpers of writes autograd does not see
// (core/AutogradHistory.h). The oracle is eager: the gradient a tensor written in place under
// no_grad passes on, computed with the same tensors.
// See Note [Autograd: writes autograd does not see].
#include "core/AutogradHistory.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

using namespace tfz::detail;

namespace {

at::Tensor grad_of(const at::Tensor& output, const at::Tensor& input) {
  return torch::autograd::grad({output.sum()}, {input})[0];
}

TEST(AutogradHistoryTest, NewValueOfANonLeafKeepsItsGradFn) {
  const at::Tensor w = at::arange(3.0).requires_grad_();
  const at::Tensor h = w * 2;
  at::Tensor written;
  {
    c10::NoGradGuard no_grad;
    written = with_history_of(h * 3, h, {}, /*views_kept=*/true);
  }
  EXPECT_EQ(written.grad_fn(), h.grad_fn());
  EXPECT_TRUE(at::equal(written.detach(), (h * 3).detach()));
  // Eager: h.mul_(3) under no_grad, then (h * h).sum() backward: d/dw = 2 * h_new * 2.
  EXPECT_TRUE(at::allclose(grad_of(written * written, w), 4 * written.detach()));
}

TEST(AutogradHistoryTest, NewValueOfALeafStandsForTheLeaf) {
  const at::Tensor w = at::arange(3.0).requires_grad_();
  at::Tensor written;
  {
    c10::NoGradGuard no_grad;
    written = with_history_of(w - 1, w, {}, /*views_kept=*/true);
  }
  EXPECT_TRUE(leaf_standing_for(written).is_same(w));
  EXPECT_TRUE(has_history_of(written, w));
  // Gradients through the new data reach the leaf's accumulator.
  (written * 5).sum().backward();
  EXPECT_TRUE(at::allclose(w.grad(), at::full({3}, 5.0)));
}

TEST(AutogradHistoryTest, HeldTensorIsNotChanged) {
  // A value someone else holds (another wrapper's, the caller's) keeps its autograd state: the
  // edge goes on a new tensor sharing its data.
  const at::Tensor w = at::arange(3.0).requires_grad_();
  const at::Tensor h = w * 2;
  const at::Tensor held = at::ones({3});
  const at::Tensor written = with_history_of(held, h, {&held}, /*views_kept=*/true);
  EXPECT_FALSE(held.requires_grad());
  EXPECT_FALSE(written.is_same(held));
  EXPECT_TRUE(written.is_alias_of(held));
  EXPECT_EQ(written.grad_fn(), h.grad_fn());
}

TEST(AutogradHistoryTest, ValueWithoutHistoryStaysAsItIsWhenTheOldOneHadNone) {
  const at::Tensor old = at::zeros({2});
  const at::Tensor value = at::ones({2});
  EXPECT_TRUE(with_history_of(value, old, {}, /*views_kept=*/true).is_same(value));
  EXPECT_FALSE(has_history_of(value, old));
}

TEST(AutogradHistoryTest, RestridedCopyPassesTheGradientThrough) {
  const at::Tensor w = at::arange(6.0).reshape({2, 3}).requires_grad_();
  const at::Tensor src = w * 2;
  const at::Tensor dst = at::empty_strided({2, 3}, {1, 2});
  const at::Tensor copied = restrided_copy(dst, src);
  EXPECT_EQ(copied.strides(), dst.strides());
  EXPECT_TRUE(at::equal(copied.detach(), src.detach()));
  EXPECT_TRUE(at::allclose(grad_of(copied * 3, w), at::full({2, 3}, 6.0)));
}

}  // namespace
