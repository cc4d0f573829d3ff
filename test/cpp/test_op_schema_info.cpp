// Unit tests of OpSchemaInfo (classification from schemas and the functional-variant plan) and of
// the special-op table's plans, on a sample of ATen operators whose expected classification is
// stated by their schemas (alias annotations, tags) and by torchgen's grouping rule.
#include "TestUtils.h"

#include "core/OpSchemaInfo.h"
#include "kernels/Registration.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

using namespace tfz::detail;

namespace {

class OpSchemaInfoTest : public ::testing::Test {
 protected:
  // The functional-variant table is filled when the kernels register.
  static void SetUpTestSuite() { ensure_registered(); }

  static c10::OperatorHandle op(const char* name, const char* overload) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  }
  static std::string name_of(const std::optional<c10::OperatorHandle>& h) {
    return h ? c10::toString(h->operator_name()) : "<none>";
  }
};

}  // namespace

TEST_F(OpSchemaInfoTest, KindNamesAreDistinct) {
  std::set<std::string> names;
  for (auto k : {OpKind::Functional, OpKind::View, OpKind::InplaceView, OpKind::Mutable,
                 OpKind::Unsupported}) {
    names.insert(to_string(k));
  }
  EXPECT_EQ(names.size(), 5u);
}

TEST_F(OpSchemaInfoTest, OpWithoutAliasAnnotationsIsFunctional) {
  const OpInfo info = classify(op("aten::add", "Tensor"));
  EXPECT_EQ(info.kind, OpKind::Functional);
  EXPECT_EQ(info.name, "aten::add.Tensor");
  EXPECT_FALSE(info.wraps_plain_outputs);
}

TEST_F(OpSchemaInfoTest, FactoryWrapsItsOutputs) {
  const OpInfo info = classify(op("aten::ones", ""));
  EXPECT_EQ(info.kind, OpKind::Functional);
  EXPECT_TRUE(info.wraps_plain_outputs);
}

TEST_F(OpSchemaInfoTest, ReturnAliasingSelfIsAViewWithCopyTwinAndInverse) {
  const OpInfo info = classify(op("aten::slice", "Tensor"));
  EXPECT_EQ(info.kind, OpKind::View);
  EXPECT_EQ(name_of(info.view_op), "aten::slice.Tensor");
  EXPECT_EQ(name_of(info.copy_op), "aten::slice_copy.Tensor");
  EXPECT_NE(info.inverse, nullptr);
}

TEST_F(OpSchemaInfoTest, InplaceViewOpReplaysItsOutOfPlaceView) {
  const OpInfo info = classify(op("aten::transpose_", ""));
  EXPECT_EQ(info.kind, OpKind::InplaceView);
  EXPECT_EQ(name_of(info.view_op), "aten::transpose.int");
  EXPECT_EQ(name_of(info.copy_op), "aten::transpose_copy.int");
}

TEST_F(OpSchemaInfoTest, InPlaceOpPairsWithItsFunctionalVariantWithSelfAsTheWrittenReturn) {
  const OpInfo info = classify(op("aten::add_", "Tensor"));
  ASSERT_EQ(info.kind, OpKind::Mutable);
  EXPECT_EQ(name_of(info.functional_op), "aten::add.Tensor");
  ASSERT_EQ(info.written.size(), 1u);
  EXPECT_EQ(info.written[0].index, 0);
  EXPECT_EQ(info.written[0].functional_return, 0);
  EXPECT_FALSE(info.written[0].is_out);
  EXPECT_TRUE(info.written[0].is_returned);
  EXPECT_EQ(info.return_aliases, std::vector<int>{0});
  // self, other, alpha: each from the argument of the same name.
  ASSERT_EQ(info.functional_args.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(info.functional_args[i].kind, ArgSource::FromMutableArg);
    EXPECT_EQ(info.functional_args[i].index, i);
  }
}

TEST_F(OpSchemaInfoTest, OutOpWritesItsOutArgumentWhichMayResize) {
  const auto handle = op("aten::add", "out");
  const OpInfo info = classify(handle);
  ASSERT_EQ(info.kind, OpKind::Mutable);
  EXPECT_EQ(name_of(info.functional_op), "aten::add.Tensor");
  ASSERT_EQ(info.written.size(), 1u);
  EXPECT_EQ(handle.schema().arguments()[info.written[0].index].name(), "out");
  EXPECT_TRUE(info.written[0].is_out);
}

TEST_F(OpSchemaInfoTest, OpReturningNothingGetsItsWritesAppendedToTheFunctionalReturns) {
  // _foreach_add_.List(Tensor(a!)[] self, Tensor[] other) -> (): self's new value is the
  // functional variant's first return.
  const OpInfo info = classify(op("aten::_foreach_add_", "List"));
  ASSERT_EQ(info.kind, OpKind::Mutable);
  EXPECT_EQ(name_of(info.functional_op), "aten::_foreach_add.List");
  ASSERT_EQ(info.written.size(), 1u);
  EXPECT_EQ(info.written[0].index, 0);
  EXPECT_EQ(info.written[0].functional_return, 0);
  EXPECT_FALSE(info.written[0].is_returned);
  EXPECT_TRUE(info.return_aliases.empty());
}

TEST_F(OpSchemaInfoTest, GeneratedFunctionalVariantIsFound) {
  EXPECT_EQ(name_of(classify(op("aten::normal_", "")).functional_op), "aten::normal_functional");
  EXPECT_EQ(name_of(classify(op("aten::_native_batch_norm_legit", "")).functional_op),
            "aten::_native_batch_norm_legit_functional");
}

TEST_F(OpSchemaInfoTest, NormalizedSignatureDropsOutArgumentsAndAliasAnnotations) {
  EXPECT_EQ(normalized_signature(op("aten::add_", "Tensor").schema()),
            normalized_signature(op("aten::add", "Tensor").schema()));
  EXPECT_EQ(normalized_signature(op("aten::add", "out").schema()),
            normalized_signature(op("aten::add", "Tensor").schema()));
  EXPECT_NE(normalized_signature(op("aten::add", "Tensor").schema()),
            normalized_signature(op("aten::sub", "Tensor").schema()));
}

TEST_F(OpSchemaInfoTest, NormalizedSignatureSpellsEveryKindOfDefault) {
  // Scalar (alpha=1), float, bool, None, int list and string defaults all print: the code path
  // that streams default values (an int through ostream << long) runs for each.
  for (auto [name, overload] : {std::pair{"aten::add", "Tensor"},
                                {"aten::leaky_relu", ""},
                                {"aten::mean", "dim"},
                                {"aten::max_pool2d", ""},
                                {"aten::gelu", ""}}) {
    const std::string sig = normalized_signature(op(name, overload).schema());
    EXPECT_NE(sig.find(std::string(name).substr(6)), std::string::npos) << sig;
    EXPECT_NE(sig.find('='), std::string::npos) << "no default printed: " << sig;
  }
}

TEST_F(OpSchemaInfoTest, SpecialRowsAdjustThePlan) {
  // native_batch_norm and the backend batch norms share one row (hidden running-stat writes).
  for (const char* name :
       {"aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm"}) {
    const auto bn = plan_by_name(name, "");
    ASSERT_NE(bn.special, nullptr) << name;
    EXPECT_STREQ(bn.special->name, "batch norm (hidden stat writes)") << name;
    EXPECT_EQ(name_of(bn.info.functional_op), "aten::_native_batch_norm_legit_functional") << name;
  }

  // set_ without a source is refused in the plan; onto a tensor, its row serves some cases
  // (Note [Kernel: set_ onto another functional tensor]).
  const auto set = plan_by_name("aten::set_", "");
  EXPECT_EQ(set.info.kind, OpKind::Unsupported);
  EXPECT_NE(set.info.unsupported_reason.find("set_"), std::string::npos);
  const auto set_onto = plan_by_name("aten::set_", "source_Tensor");
  ASSERT_NE(set_onto.special, nullptr);
  EXPECT_NE(set_onto.info.kind, OpKind::Unsupported);

  EXPECT_TRUE(plan_by_name("aten::lift_fresh", "").info.wraps_plain_outputs);
  EXPECT_EQ(plan_by_name("aten::_unsafe_view", "").info.kind, OpKind::View);
  EXPECT_EQ(name_of(plan_by_name("aten::_reshape_alias", "").info.view_op), "aten::view");

  for (const char* name : {"aten::resize_", "aten::resize_as_"}) {
    const auto resize = plan_by_name(name, "");
    ASSERT_NE(resize.special, nullptr) << name;
    EXPECT_NE(resize.special->handle, nullptr) << name;
  }
}

TEST_F(OpSchemaInfoTest, OrdinaryOpsHaveNoSpecialRow) {
  for (auto [name, overload] : {std::pair{"aten::add", "Tensor"},
                                {"aten::add_", "Tensor"},
                                {"aten::slice", "Tensor"},
                                {"aten::t_", ""}}) {
    EXPECT_EQ(plan_by_name(name, overload).special, nullptr) << name;
  }
}
