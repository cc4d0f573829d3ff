// Tests of manual use: tfz::FunctionalizeGuard with to_functional / from_functional / sync, the
// mutation queries and propagate_input_mutation. Expected values come from the same ops run
// eagerly. Also checks that the guard restores the thread's dispatch state and leaves plain tensors
// alone.
#include <torch_functionalize/functionalize.h>

#include "TestUtils.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace tfz::test;

TEST(FunctionalizeGuardTest, ManualInPlaceAddReachesTheInputOnlyThroughPropagate) {
  at::Tensor x = float_grid(2, 3);
  const at::Tensor before = x.clone();
  at::Tensor eager = x.clone();
  eager.add_(1);
  const void* data_ptr = x.const_data_ptr();

  at::Tensor w;
  at::Tensor value;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    EXPECT_TRUE(tfz::is_functional(w));
    EXPECT_FALSE(tfz::is_functional(x));
    EXPECT_FALSE(tfz::has_data_mutation(w));
    EXPECT_FALSE(tfz::has_metadata_mutation(w));
    w.add_(1);
    EXPECT_TRUE(tfz::has_data_mutation(w));
    EXPECT_FALSE(tfz::has_metadata_mutation(w));
    // The write stays in the wrapper until propagate_input_mutation.
    EXPECT_TRUE(at::equal(x, before));
    value = tfz::from_functional(w);
  }
  expect_same_tensor(value, eager, "from_functional", false);
  expect_same_tensor(x, before, "input before propagate", true);
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, eager, "input after propagate", true);
  EXPECT_EQ(x.const_data_ptr(), data_ptr);
}

TEST(FunctionalizeGuardTest, MutationThroughAViewIsVisibleInTheBaseAndSiblings) {
  at::Tensor x = float_grid(3, 4);
  at::Tensor eager = x.clone();
  at::Tensor eager_flat = eager.view({-1});
  at::Tensor eager_row = eager.select(0, 1);
  eager_flat.mul_(2);
  eager_row.add_(10);

  at::Tensor w;
  at::Tensor base_value, flat_value, row_value;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    at::Tensor flat = w.view({-1});
    at::Tensor row = w.select(0, 1);
    flat.mul_(2);
    row.add_(10);
    tfz::sync(w);
    tfz::sync(flat);
    // Written through aliases only, yet the base and every alias report a data mutation.
    EXPECT_TRUE(tfz::has_data_mutation(w));
    EXPECT_TRUE(tfz::has_data_mutation(flat));
    EXPECT_TRUE(tfz::has_data_mutation(row));
    EXPECT_FALSE(tfz::has_metadata_mutation(w));
    base_value = tfz::from_functional(w);
    flat_value = tfz::from_functional(flat);
    row_value = tfz::from_functional(row);
  }
  expect_same_tensor(base_value, eager, "base", false);
  expect_same_tensor(flat_value, eager_flat, "flat view", false);
  expect_same_tensor(row_value, eager_row, "row view", false);
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, eager, "input after propagate", true);
}

TEST(FunctionalizeGuardTest, FromFunctionalAppliesPendingUpdatesWithoutAnExplicitSync) {
  at::Tensor eager = float_grid(2, 2);
  at::Tensor eager_view = eager.view({-1});
  eager.mul_(3);

  const at::Tensor x = float_grid(2, 2);
  at::Tensor view_value;
  {
    tfz::FunctionalizeGuard guard;
    at::Tensor w = tfz::to_functional(x);
    at::Tensor view = w.view({-1});
    // The view was taken before the write; from_functional must still show the write.
    w.mul_(3);
    view_value = tfz::from_functional(view);
  }
  expect_same_tensor(view_value, eager_view, "view", false);
}

TEST(FunctionalizeGuardTest, TransposeInPlaceIsAMetadataMutationThatPropagateReplays) {
  at::Tensor x = float_grid(2, 3);
  at::Tensor eager = x.clone();
  eager.t_();
  const void* data_ptr = x.const_data_ptr();

  at::Tensor w;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    w.t_();
    EXPECT_TRUE(tfz::has_metadata_mutation(w));
    EXPECT_FALSE(tfz::has_data_mutation(w));
    // The wrapper mirrors its value's metadata, as the eager tensor after t_().
    EXPECT_EQ(w.sizes(), eager.sizes());
    EXPECT_EQ(w.strides(), eager.strides());
    expect_same_tensor(tfz::from_functional(w), eager, "from_functional", false);
  }
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, eager, "input after propagate", true);
  EXPECT_EQ(x.const_data_ptr(), data_ptr);
}

TEST(FunctionalizeGuardTest, MetadataAndDataMutationsBothReachTheInput) {
  at::Tensor x = float_grid(2, 3);
  at::Tensor eager = x.clone();
  eager.t_();
  eager.select(0, 2).mul_(-1);

  at::Tensor w;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    w.t_();
    w.select(0, 2).mul_(-1);
    tfz::sync(w);
    EXPECT_TRUE(tfz::has_metadata_mutation(w));
    EXPECT_TRUE(tfz::has_data_mutation(w));
  }
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, eager, "input after propagate", true);
}

TEST(FunctionalizeGuardTest, PropagateWithoutMutationLeavesTheInputUnchanged) {
  at::Tensor x = float_grid(2, 3);
  const at::Tensor before = x.clone();
  const void* data_ptr = x.const_data_ptr();
  at::Tensor w;
  at::Tensor sum;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    // Reads and views are not writes.
    sum = tfz::from_functional(w.view({-1}).sum());
    EXPECT_FALSE(tfz::has_data_mutation(w));
    EXPECT_FALSE(tfz::has_metadata_mutation(w));
  }
  expect_same_tensor(sum, before.sum(), "sum", true);
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, before, "input", true);
  EXPECT_EQ(x.const_data_ptr(), data_ptr);
}

TEST(FunctionalizeGuardTest, ToFunctionalOfSeveralTensorsWrapsEachSeparately) {
  std::vector<at::Tensor> xs = {float_grid(2, 2), float_grid(2, 2, 4.0)};
  const std::vector<at::Tensor> before = {xs[0].clone(), xs[1].clone()};
  std::vector<at::Tensor> ws;
  {
    tfz::FunctionalizeGuard guard;
    ws = tfz::to_functional(xs);
    ASSERT_EQ(ws.size(), 2u);
    EXPECT_TRUE(tfz::is_functional(ws[0]));
    EXPECT_TRUE(tfz::is_functional(ws[1]));
    ws[1].sub_(ws[0]);
    EXPECT_FALSE(tfz::has_data_mutation(ws[0]));
    EXPECT_TRUE(tfz::has_data_mutation(ws[1]));
  }
  tfz::propagate_input_mutation(xs[0], ws[0]);
  tfz::propagate_input_mutation(xs[1], ws[1]);
  expect_same_tensor(xs[0], before[0], "unmutated input", true);
  expect_same_tensor(xs[1], before[1] - before[0], "mutated input", true);
}

TEST(FunctionalizeGuardTest, WrappingAWrapperOfTheSameGuardReturnsIt) {
  // at:: factories inside a guard already return wrappers, so wrapping is idempotent for them.
  const at::Tensor x = float_grid(2, 2);
  tfz::FunctionalizeGuard guard;
  const at::Tensor w = tfz::to_functional(x);
  EXPECT_TRUE(tfz::to_functional(w).is_same(w));
  const at::Tensor made_inside = at::ones({2});
  EXPECT_TRUE(tfz::is_functional(made_inside));
  EXPECT_TRUE(tfz::to_functional(made_inside).is_same(made_inside));
}

TEST(FunctionalizeGuardTest, WrappingAWrapperOfAnEarlierGuardIsRefusedAsEscaped) {
  const at::Tensor x = float_grid(2, 2);
  at::Tensor old_wrapper;
  {
    tfz::FunctionalizeGuard first;
    old_wrapper = tfz::to_functional(x);
  }
  tfz::FunctionalizeGuard second;
  expect_throws_with<c10::Error>([&] { (void)tfz::to_functional(old_wrapper); }, "escaped");
}

TEST(FunctionalizeGuardTest, FromFunctionalAndSyncLeavePlainTensorsUnchanged) {
  const at::Tensor x = float_grid(2, 2);
  const at::Tensor before = x.clone();
  tfz::FunctionalizeGuard guard;
  EXPECT_FALSE(tfz::is_functional(x));
  EXPECT_TRUE(tfz::from_functional(x).is_same(x));
  tfz::sync(x);
  EXPECT_TRUE(at::equal(x, before));
}

TEST(FunctionalizeGuardTest, PlainTensorsInsideTheGuardComputeEagerly) {
  at::Tensor x = float_grid(2, 3);
  const at::Tensor before = x.clone();
  tfz::FunctionalizeGuard guard;
  const at::Tensor y = x * 2 + 1;
  EXPECT_FALSE(tfz::is_functional(y));
  EXPECT_TRUE(at::allclose(y, before * 2 + 1));
  // An in-place op on a plain tensor is not functionalized: it writes x at once.
  x.view({-1}).add_(5);
  EXPECT_TRUE(at::allclose(x, before + 5));
}

TEST(FunctionalizeGuardTest, MixingAPlainTensorAndAWrapperGivesAWrapper) {
  const at::Tensor x = float_grid(2, 3);
  const at::Tensor y = float_grid(2, 3, 1.0);
  at::Tensor value;
  {
    tfz::FunctionalizeGuard guard;
    const at::Tensor w = tfz::to_functional(y);
    const at::Tensor r = w * x;
    EXPECT_TRUE(tfz::is_functional(r));
    value = tfz::from_functional(r);
  }
  expect_same_tensor(value, y * x, "product", true);
}

TEST(FunctionalizeGuardTest, AtFactoriesInsideTheGuardAreWrapped) {
  at::Tensor value;
  {
    tfz::FunctionalizeGuard guard;
    at::Tensor z = at::zeros({2, 3});
    EXPECT_TRUE(tfz::is_functional(z));
    z.select(1, 1).fill_(2);
    value = tfz::from_functional(z);
  }
  at::Tensor eager = at::zeros({2, 3});
  eager.select(1, 1).fill_(2);
  expect_same_tensor(value, eager, "zeros then fill_", true);
}

TEST(FunctionalizeGuardTest, MutationsAndViewsGuardStillGivesEagerValues) {
  at::Tensor x = float_grid(3, 3);
  at::Tensor eager = x.clone();
  eager.t().select(0, 0).add_(7);
  eager.view({-1}).slice(0, 4, 9).mul_(2);

  at::Tensor w;
  at::Tensor value;
  {
    tfz::FunctionalizeGuard guard(tfz::Remove::MutationsAndViews);
    w = tfz::to_functional(x);
    w.t().select(0, 0).add_(7);
    w.view({-1}).slice(0, 4, 9).mul_(2);
    value = tfz::from_functional(w);
  }
  expect_same_tensor(value, eager, "from_functional", false);
  tfz::propagate_input_mutation(x, w);
  expect_same_tensor(x, eager, "input after propagate", true);
}

TEST(FunctionalizeGuardTest, DispatchStateIsRestoredWhenTheGuardIsDestroyed) {
  for (tfz::Remove remove : {tfz::Remove::Mutations, tfz::Remove::MutationsAndViews}) {
    const DispatchTls before = dispatch_tls();
    const at::Tensor x = float_grid(2, 2);
    {
      tfz::FunctionalizeGuard guard(remove);
      at::Tensor w = tfz::to_functional(x);
      w.view({-1}).add_(1);
      (void)tfz::from_functional(at::ones({2}) + w.sum());
    }
    expect_same_dispatch_tls(before);
  }
}

TEST(FunctionalizeGuardTest, DispatchStateIsRestoredWhenUnwindingThroughTheGuard) {
  const DispatchTls before = dispatch_tls();
  const at::Tensor x = float_grid(2, 2);
  try {
    tfz::FunctionalizeGuard guard;
    at::Tensor w = tfz::to_functional(x);
    w.add_(1);
    throw std::runtime_error("leave the scope by exception");
  } catch (const std::runtime_error&) {
  }
  expect_same_dispatch_tls(before);
}

TEST(FunctionalizeGuardTest, AGuardCanBeCreatedAgainAfterThePreviousOneIsGone) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const at::Tensor x = float_grid(2, 2);
    at::Tensor value;
    {
      tfz::FunctionalizeGuard guard;
      at::Tensor w = tfz::to_functional(x);
      w.mul_(round + 2);
      value = tfz::from_functional(w);
    }
    expect_same_tensor(value, x * (round + 2), "value", false);
  }
}

TEST(FunctionalizeGuardTest, WrapperUsedAfterTheGuardIsGoneThrowsEscaped) {
  const at::Tensor x = float_grid(2, 2);
  at::Tensor w;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
    w.add_(1);
  }
  expect_throws_with<c10::Error>([&] { (void)w.add(1); }, "escaped");
  expect_throws_with<c10::Error>([&] { w.mul_(2); }, "escaped");
}

TEST(FunctionalizeGuardTest, GuardAppliesOnlyToItsOwnThread) {
  tfz::FunctionalizeGuard guard;
  bool refused_without_guard = false;
  bool own_guard_allowed = false;
  std::thread other([&] {
    // No guard on this thread: wrapping is refused.
    try {
      (void)tfz::to_functional(float_grid(1, 1));
    } catch (const c10::Error&) {
      refused_without_guard = true;
    }
    // A guard here is not nested inside the main thread's one.
    const at::Tensor y = float_grid(1, 1);
    try {
      tfz::FunctionalizeGuard own;
      own_guard_allowed = tfz::is_functional(tfz::to_functional(y));
    } catch (const c10::Error&) {
    }
  });
  other.join();
  EXPECT_TRUE(refused_without_guard);
  EXPECT_TRUE(own_guard_allowed);
}
