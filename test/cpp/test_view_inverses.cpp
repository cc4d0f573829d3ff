// Every row of the view-inverse table (core/ViewInverses.cpp), checked against eager: a write made
// through a real view of the op must leave the base exactly as the inverse rebuilds it, with views
// kept (reapply) and removed (the inverse must then not alias the old base).
#include "TestUtils.h"

#include "core/ViewInverses.h"
#include "core/ViewMeta.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <set>
#include <string>
#include <vector>

using namespace tfz::detail;

namespace {

struct InverseCase {
  const char* name;
  const char* overload;
  std::function<at::Tensor()> make_base;  // deterministic: called once per side
  std::function<std::vector<c10::IValue>(const at::Tensor& base)> args;
  int64_t out_index = -1;
  // torch has no *_copy kernel for the base's layout (a sparse base's _values_copy): without
  // views the kernel refuses the op by name, and the check is that torch's copy op still fails.
  bool views_kept_only = false;
};

// A coalesced sparse COO vector of 5 with values 0, 1, 2 at 0, 2 and 3.
at::Tensor sparse_base() {
  return at::sparse_coo_tensor(at::tensor(std::vector<int64_t>{0, 2, 3}).view({1, 3}),
                               at::arange(3, at::kFloat), {5})
      .coalesce();
}

at::Tensor grid(std::vector<int64_t> sizes, at::ScalarType dtype = at::kFloat) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return at::arange(n, at::kFloat).to(dtype).view(sizes);
}

using Args = std::vector<c10::IValue>;
auto fixed(Args args) {
  return [args](const at::Tensor&) { return args; };
}

const std::vector<InverseCase>& cases() {
  static const std::vector<InverseCase> all = {
      {"aten::as_strided", "",
       [] {
         return grid({4, 4});
       },
       fixed({std::vector<int64_t>{2, 2}, std::vector<int64_t>{4, 1}, int64_t{5}})},
      {"aten::diagonal", "",
       [] {
         return grid({3, 4});
       },
       fixed({int64_t{1}, int64_t{0}, int64_t{1}})},
      {"aten::expand", "", [] { return grid({3}); }, fixed({std::vector<int64_t>{1, 3}, false})},
      {"aten::permute", "",
       [] {
         return grid({2, 3, 4});
       },
       fixed({std::vector<int64_t>{2, 0, 1}})},
      {"aten::_reshape_alias", "",
       [] {
         return grid({2, 3});
       },
       fixed({std::vector<int64_t>{3, 2}, std::vector<int64_t>{2, 1}})},
      {"aten::view", "",
       [] {
         return grid({2, 3});
       },
       fixed({std::vector<int64_t>{6}})},
      {"aten::view", "dtype",
       [] {
         return grid({2, 3}, at::kInt);
       },
       fixed({at::kFloat})},
      {"aten::squeeze", "",
       [] {
         return grid({2, 1, 3});
       },
       fixed({})},
      {"aten::squeeze", "dim",
       [] {
         return grid({2, 1, 3});
       },
       fixed({int64_t{1}})},
      {"aten::squeeze", "dims",
       [] {
         return grid({2, 1, 3});
       },
       fixed({std::vector<int64_t>{1}})},
      {"aten::unsqueeze", "",
       [] {
         return grid({2, 3});
       },
       fixed({int64_t{1}})},
      {"aten::select", "int",
       [] {
         return grid({3, 4});
       },
       fixed({int64_t{1}, int64_t{2}})},
      {"aten::slice", "Tensor",
       [] {
         return grid({5, 3});
       },
       fixed({int64_t{0}, int64_t{1}, int64_t{4}, int64_t{2}})},
      {"aten::split", "Tensor",
       [] {
         return grid({5, 3});
       },
       fixed({int64_t{2}, int64_t{0}}), 2},
      {"aten::split_with_sizes", "",
       [] {
         return grid({5, 3});
       },
       fixed({std::vector<int64_t>{2, 3}, int64_t{0}}), 1},
      {"aten::unbind", "int",
       [] {
         return grid({3, 4});
       },
       fixed({int64_t{1}}), 2},
      {"aten::t", "",
       [] {
         return grid({2, 3});
       },
       fixed({})},
      {"aten::transpose", "int",
       [] {
         return grid({2, 3, 4});
       },
       fixed({int64_t{0}, int64_t{2}})},
      // size < step: a gapped unfold, whose gaps must keep their values.
      {"aten::unfold", "", [] { return grid({7}); }, fixed({int64_t{0}, int64_t{2}, int64_t{3}})},
      {"aten::alias", "",
       [] {
         return grid({2, 3});
       },
       fixed({})},
      {"aten::detach", "",
       [] {
         return grid({2, 3});
       },
       fixed({})},
      {"aten::lift_fresh", "",
       [] {
         return grid({2, 3});
       },
       fixed({})},
      {"aten::view_as_real", "", [] { return grid({3}, at::kComplexFloat); }, fixed({})},
      {"aten::view_as_complex", "",
       [] {
         return grid({3, 2});
       },
       fixed({})},
      {"aten::_conj", "", [] { return grid({3}, at::kComplexFloat) * c10::complex<float>(1, 2); },
       fixed({})},
      {"aten::_neg_view", "", [] { return grid({3}); }, fixed({})},
      {"aten::_values", "", sparse_base, fixed({}), -1, /*views_kept_only=*/true},
      {"aten::values", "", sparse_base, fixed({}), -1, /*views_kept_only=*/true},
      // slice_inverse(self, src, ...) views the storage self (a slice of src's shape) lives in
      // as a tensor shaped like src: the base here is itself a slice of a larger tensor.
      {"aten::slice_inverse", "",
       [] {
         return grid({5, 3}).slice(0, 1, 4);
       },
       [](const at::Tensor&) {
         return Args{grid({5, 3}), int64_t{0}, int64_t{1}, int64_t{4}, int64_t{1}};
       }},
  };
  return all;
}

ViewMeta meta_for(const InverseCase& c, const at::Tensor& base, bool reapply) {
  auto& d = c10::Dispatcher::singleton();
  auto op = d.findSchemaOrThrow(c.name, c.overload);
  auto copy = d.findOp({std::string(c.name) + "_copy", c.overload});
  return ViewMeta(op, copy, c.args(base), c.out_index, reapply, find_inverse(op.operator_name()));
}

// Distinct new values of the view's shape and dtype (negative, so none equals an old value).
at::Tensor new_values_like(const at::Tensor& view) {
  return (-grid(view.sizes().vec()) - 1).to(view.scalar_type());
}

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage());
}

class ViewInverseTest : public ::testing::TestWithParam<std::tuple<size_t, bool>> {};

}  // namespace

TEST(ViewInverseTableTest, EveryRowHasAnEagerCheck) {
  std::set<std::string> rows, checked;
  for (const auto& name : view_ops_with_inverse()) rows.insert(c10::toString(name));
  for (const auto& c : cases())
    checked.insert(c10::toString(c10::OperatorName(c.name, c.overload)));
  EXPECT_EQ(rows, checked);
}

TEST_P(ViewInverseTest, InverseRebuildsTheBaseEagerLeavesAfterAWriteThroughTheView) {
  const auto& [index, reapply] = GetParam();
  const InverseCase& c = cases()[index];
  if (c.views_kept_only && !reapply) {
    const at::Tensor base = c.make_base();
    EXPECT_THROW(meta_for(c, base, /*reapply=*/false).forward(base), c10::NotImplementedError)
        << "torch now has this *_copy kernel: the kernel's refusal (ViewKernels.cpp) can go";
    return;
  }

  // Eager: write through a real view of the base.
  at::Tensor eager_base = c.make_base();
  const at::Tensor eager_view = meta_for(c, eager_base, /*reapply=*/true).forward(eager_base);
  const at::Tensor values = new_values_like(eager_view);
  eager_view.copy_(values);

  // Ours: the inverse of the same step, from the untouched base and the written view's values.
  const at::Tensor base = c.make_base();
  const ViewMeta meta = meta_for(c, base, reapply);
  const at::Tensor view = meta.forward(base);
  ASSERT_EQ(view.sizes(), values.sizes()) << "forward replay changed the view's shape";
  const at::Tensor rebuilt = meta.inverse(base, values);
  ASSERT_EQ(rebuilt.sizes(), eager_base.sizes());
  ASSERT_EQ(rebuilt.scalar_type(), eager_base.scalar_type());
  if (eager_base.is_sparse()) {
    ASSERT_TRUE(rebuilt.is_sparse());
    EXPECT_EQ(rebuilt.is_coalesced(), eager_base.is_coalesced());
    EXPECT_TRUE(at::equal(rebuilt._indices(), eager_base._indices()));
    EXPECT_TRUE(at::equal(rebuilt.to_dense(), eager_base.to_dense()));
    return;
  }
  EXPECT_TRUE(at::equal(rebuilt.resolve_conj().resolve_neg(), eager_base.resolve_conj()))
      << "rebuilt\n"
      << rebuilt << "\neager\n"
      << eager_base;
  if (!reapply) {
    // No view of the old base may survive (the written values themselves may become the base).
    EXPECT_FALSE(shares_storage(rebuilt, base)) << "views removed: the new base aliases the old";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllRows, ViewInverseTest,
    ::testing::Combine(::testing::Range<size_t>(0, cases().size()), ::testing::Bool()),
    [](const ::testing::TestParamInfo<ViewInverseTest::ParamType>& info) {
      const InverseCase& c = cases()[std::get<0>(info.param)];
      std::string name = std::string(c.name).substr(6) + (*c.overload ? "_" : "") + c.overload;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name + (std::get<1>(info.param) ? "_views_kept" : "_views_removed");
    });
