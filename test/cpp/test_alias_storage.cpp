// Unit tests of AliasStorage (the update queue and its generation counter) and of the wrapper's
// regeneration from it (FunctionalTensorImpl::sync_). Expected values come from the same writes
// made eagerly through real views. See Note [Alias: storage and generations].
#include "TestUtils.h"

#include "core/AliasStorage.h"
#include "core/Conversions.h"
#include "core/FunctionalTensorImpl.h"
#include "core/ViewInverses.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

using namespace tfz::detail;
using tfz::test::float_grid;

namespace {

constexpr int64_t kLayer = 12345;  // wrappers outside a layer only need an id

std::shared_ptr<const ViewMeta> step(const char* name, const char* overload,
                                     std::vector<c10::IValue> args, int64_t out_index = -1) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  auto copy = c10::Dispatcher::singleton().findOp({std::string(name) + "_copy", overload});
  return std::make_shared<const ViewMeta>(op, copy, std::move(args), out_index, /*reapply=*/true,
                                          find_inverse(op.operator_name()));
}

// What a mutation does to the wrapper it writes (kernels' write_back, without the sync).
void write(const at::Tensor& wrapper, const at::Tensor& value) {
  unsafe_get_impl(wrapper)->replace_(value);
  unsafe_get_impl(wrapper)->commit_update_();
}

at::Tensor forward(const ViewChain& chain, at::Tensor t) {
  for (const ViewMeta* s : chain.steps()) t = s->forward(t);
  return t;
}

}  // namespace

TEST(AliasStorageTest, StartsAtGenerationZeroWithNothingQueued) {
  AliasStorage storage(float_grid(2, 3));
  EXPECT_EQ(storage.generation(), 0u);
  EXPECT_FALSE(storage.has_pending_updates());
  EXPECT_FALSE(storage.apply_updates());
}

TEST(AliasStorageTest, AddUpdateQueuesAndBumpsTheGeneration) {
  AliasStorage storage(float_grid(2, 3));
  storage.add_update(at::ones({3}), ViewChain{step("aten::select", "int", {0, 1})},
                     /*visible=*/true);
  EXPECT_EQ(storage.generation(), 1u);
  EXPECT_TRUE(storage.has_pending_updates());
  storage.add_update(at::ones({3}), ViewChain{step("aten::select", "int", {0, 0})},
                     /*visible=*/true);
  EXPECT_EQ(storage.generation(), 2u);
}

TEST(AliasStorageTest, ApplyUpdatesWithAnEmptyChainReplacesTheBase) {
  AliasStorage storage(float_grid(2, 3));
  const at::Tensor value = float_grid(2, 3, 100);
  storage.add_update(value, {}, /*visible=*/true);
  EXPECT_TRUE(storage.apply_updates());
  EXPECT_FALSE(storage.has_pending_updates());
  EXPECT_TRUE(at::equal(storage.base(), value));
}

TEST(AliasStorageTest, ApplyUpdatesReplaysInversesInReverseOrder) {
  // base[1][0:2] = [-1, -2], written through a chain select(0, 1) -> slice(0, 0, 2).
  const at::Tensor base = float_grid(2, 3);
  const ViewChain chain{step("aten::select", "int", {0, 1}),
                        step("aten::slice", "Tensor", {0, 0, 2, 1})};
  const at::Tensor value = at::tensor({-1.0f, -2.0f});
  AliasStorage storage(base);
  storage.add_update(value, chain, /*visible=*/true);
  storage.apply_updates();

  at::Tensor eager = base.clone();
  forward(chain, eager).copy_(value);
  EXPECT_TRUE(at::equal(storage.base(), eager)) << storage.base() << "\n" << eager;
}

TEST(AliasStorageTest, QueuedUpdatesApplyInTheOrderTheyWereMade) {
  // Two overlapping writes: the later one wins where they overlap, as in eager.
  const at::Tensor base = float_grid(3, 3);
  const ViewChain row{step("aten::select", "int", {0, 1})};
  const ViewChain col{step("aten::select", "int", {1, 2})};
  AliasStorage storage(base);
  storage.add_update(at::full({3}, 7.0f), row, /*visible=*/true);
  storage.add_update(at::full({3}, 9.0f), col, /*visible=*/true);
  storage.apply_updates();

  at::Tensor eager = base.clone();
  forward(row, eager).copy_(at::full({3}, 7.0f));
  forward(col, eager).copy_(at::full({3}, 9.0f));
  EXPECT_TRUE(at::equal(storage.base(), eager));
}

TEST(AliasStorageTest, SetBaseReplacesTheBaseAndBumpsTheGeneration) {
  AliasStorage storage(float_grid(2, 2));
  storage.set_base_(at::zeros({2, 2}));
  EXPECT_EQ(storage.generation(), 1u);
  EXPECT_TRUE(at::equal(storage.base(), at::zeros({2, 2})));
}

TEST(FunctionalTensorImplTest, ViewWrapperRegeneratesAfterItsBaseIsWritten) {
  const at::Tensor x = float_grid(2, 3);
  at::Tensor base = make_fresh_wrapper(x, kLayer);
  auto s = step("aten::select", "int", {0, 0});
  at::Tensor view = make_view_wrapper(s->forward(x), base, s);
  auto* base_impl = unsafe_get_impl(base);
  auto* view_impl = unsafe_get_impl(view);

  base_impl->replace_(x * 10);
  base_impl->commit_update_();
  EXPECT_TRUE(base_impl->is_up_to_date());
  EXPECT_FALSE(view_impl->is_up_to_date()) << "the view must notice the write";
  view_impl->sync_();
  EXPECT_TRUE(view_impl->is_up_to_date());
  EXPECT_TRUE(at::equal(view_impl->value(), (x * 10).select(0, 0)));
}

TEST(FunctionalTensorImplTest, WriteThroughAViewReachesTheBaseOnSync) {
  const at::Tensor x = float_grid(2, 3);
  at::Tensor base = make_fresh_wrapper(x, kLayer);
  auto s = step("aten::select", "int", {0, 1});
  at::Tensor view = make_view_wrapper(s->forward(x), base, s);
  write(view, at::full({3}, -5.0f));

  at::Tensor eager = x.clone();
  eager.select(0, 1).fill_(-5.0f);
  EXPECT_FALSE(unsafe_get_impl(base)->is_up_to_date());
  EXPECT_TRUE(at::equal(sync_and_unwrap(base), eager));
}

TEST(FunctionalTensorImplTest, UnrelatedStoragesDoNotSeeEachOthersWrites) {
  at::Tensor a = make_fresh_wrapper(float_grid(2, 2), kLayer);
  at::Tensor b = make_fresh_wrapper(float_grid(2, 2), kLayer);
  write(a, at::zeros({2, 2}));
  EXPECT_TRUE(unsafe_get_impl(b)->is_up_to_date());
  EXPECT_TRUE(at::equal(sync_and_unwrap(b), float_grid(2, 2)));
}

TEST(ViewChainTest, ExtendingSharesThePrefixAndLeavesTheOriginal) {
  const auto a = step("aten::select", "int", {0, 1});
  const auto b = step("aten::slice", "Tensor", {0, 0, 2, 1});
  const auto c = step("aten::select", "int", {0, 0});
  const ViewChain base{a};
  const ViewChain left = base.extended(b);
  const ViewChain right = base.extended(c);
  EXPECT_EQ(base.size(), 1u);
  EXPECT_EQ(left.size(), 2u);
  EXPECT_EQ(left.steps(), (std::vector<const ViewMeta*>{a.get(), b.get()}));
  EXPECT_EQ(right.steps(), (std::vector<const ViewMeta*>{a.get(), c.get()}));
  EXPECT_TRUE(left.starts_with(base));
  EXPECT_TRUE(left.starts_with(ViewChain{}));
  EXPECT_TRUE(left.starts_with(left));
  EXPECT_FALSE(left.starts_with(right));
  EXPECT_FALSE(base.starts_with(left));
  // Equal steps built separately (no shared node) still count as the same prefix.
  EXPECT_TRUE((ViewChain{a, b, c}).starts_with(ViewChain{a, b}));
  EXPECT_FALSE((ViewChain{a, c}).starts_with(ViewChain{a, b}));
}

TEST(ViewChainTest, AVeryDeepChainIsFreedWithoutRecursion) {
  // A million nodes freed recursively would overflow the stack; this must simply finish.
  const auto s = step("aten::view", "", {std::vector<int64_t>{-1}});
  ViewChain chain;
  for (int i = 0; i < 1000000; ++i) chain.push_back(s);
  EXPECT_EQ(chain.size(), 1000000u);
  chain.clear();
  EXPECT_TRUE(chain.empty());
}
