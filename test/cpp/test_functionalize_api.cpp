// Tests of the public whole-call transform `tfz::functionalize`, used the way a LibTorch user
// would. Every behaviour test runs a program eagerly on clones and functionalized on other clones,
// then compares outputs and the final state of the inputs. Errors and thread dispatch state are
// checked too.
#include <torch_functionalize/functionalize.h>

#include "TestUtils.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <array>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace tfz::test;

// Runs `fn` eagerly on clones and functionalized on other clones; outputs and final inputs must
// agree.
void expect_matches_eager(const tfz::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                          tfz::Remove remove) {
  SCOPED_TRACE("remove=" + mode_name(remove));
  std::vector<at::Tensor> eager_inputs = clone_all(inputs);
  const std::vector<at::Tensor> eager_outputs = fn(eager_inputs);

  std::vector<at::Tensor> func_inputs = clone_all(inputs);
  std::vector<const void*> data_ptrs;
  for (const at::Tensor& t : func_inputs) {
    data_ptrs.push_back(t.const_data_ptr());
  }
  const std::vector<at::Tensor> func_outputs = tfz::functionalize(fn, remove)(func_inputs);

  ASSERT_EQ(func_outputs.size(), eager_outputs.size());
  for (size_t i = 0; i < eager_outputs.size(); ++i) {
    expect_same_tensor(func_outputs[i], eager_outputs[i], "output " + std::to_string(i), false);
  }
  for (size_t i = 0; i < eager_inputs.size(); ++i) {
    expect_same_tensor(func_inputs[i], eager_inputs[i], "input " + std::to_string(i), true);
    // The epilogue writes into the caller's tensor; it does not hand back a new one.
    EXPECT_EQ(func_inputs[i].const_data_ptr(), data_ptrs[i]) << "input " << i;
  }
}

void expect_matches_eager_in_both_modes(const tfz::TensorFn& fn,
                                        const std::vector<at::Tensor>& inputs) {
  for (tfz::Remove remove : kBothModes) {
    expect_matches_eager(fn, inputs, remove);
  }
}

// Checks that `f` throws exactly an `E` (or subclass) whose message contains `fragment`.
// Deep copy of an IValue: every tensor inside lists, tuples and dicts is cloned.
c10::IValue deep_clone(const c10::IValue& v) {
  if (v.isTensor()) {
    return v.toTensor().clone();
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(t.clone());
    }
    return out;
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) {
      out.push_back(deep_clone(e));
    }
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elems;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      elems.push_back(deep_clone(e));
    }
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  if (v.isGenericDict()) {
    const c10::impl::GenericDict dict = v.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) {
      out.insert(entry.key(), deep_clone(entry.value()));
    }
    return out;
  }
  return v;
}

void expect_same_ivalue(const c10::IValue& actual, const c10::IValue& expected,
                        const std::string& path, bool check_strides) {
  SCOPED_TRACE(path);
  ASSERT_EQ(actual.tagKind(), expected.tagKind());
  if (expected.isTensor()) {
    expect_same_tensor(actual.toTensor(), expected.toTensor(), path, check_strides);
  } else if (expected.isList()) {
    const auto a = actual.toListRef();
    const auto e = expected.toListRef();
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < e.size(); ++i) {
      expect_same_ivalue(a[i], e[i], path + "[" + std::to_string(i) + "]", check_strides);
    }
  } else if (expected.isTuple()) {
    const auto& a = actual.toTupleRef().elements();
    const auto& e = expected.toTupleRef().elements();
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < e.size(); ++i) {
      expect_same_ivalue(a[i], e[i], path + "(" + std::to_string(i) + ")", check_strides);
    }
  } else if (expected.isGenericDict()) {
    const c10::impl::GenericDict a = actual.toGenericDict();
    const c10::impl::GenericDict e = expected.toGenericDict();
    ASSERT_EQ(a.size(), e.size());
    for (const auto& entry : e) {
      ASSERT_TRUE(a.contains(entry.key())) << "missing key " << entry.key();
      expect_same_ivalue(a.at(entry.key()), entry.value(),
                         path + "{" + entry.key().toStringRef() + "}", check_strides);
    }
  } else {
    EXPECT_TRUE(actual == expected) << "got " << actual << ", eager " << expected;
  }
}

}  // namespace

TEST(FunctionalizeApiTest, InPlaceAddOnACloneMatchesEager) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor y = xs[0].clone();
    y.add_(1);
    y.mul_(xs[0]);
    return {y};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3)});
}

TEST(FunctionalizeApiTest, MutationOfAnInputIsWrittenBackAfterTheCall) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].mul_(2).add_(xs[1]);
    return {xs[0], xs[1] * 3};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3), float_grid(2, 3, 10.0)});
}

TEST(FunctionalizeApiTest, InputIsUntouchedWhileFnRunsAndUpdatedAfterwards) {
  for (tfz::Remove remove : kBothModes) {
    SCOPED_TRACE("remove=" + mode_name(remove));
    at::Tensor x = float_grid(2, 3);
    const at::Tensor before = x.clone();
    const at::Tensor expected = before + 5;
    bool untouched_inside = false;
    tfz::TensorFn fn = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
      xs[0].add_(5);
      // Functionalized, the write lands in the wrapper only; `x` itself changes in the epilogue.
      untouched_inside = at::equal(x, before);
      return {};
    };
    tfz::functionalize(fn, remove)({x});
    EXPECT_TRUE(untouched_inside);
    expect_same_tensor(x, expected, "input after the call", true);
  }
}

TEST(FunctionalizeApiTest, FnSeesWrappersAndTheCallerGetsPlainTensors) {
  bool inputs_functional = false;
  bool input_was_plain = true;
  at::Tensor x = float_grid(2, 2);
  tfz::TensorFn fn = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    inputs_functional = tfz::is_functional(xs[0]) && tfz::is_functional(xs[1]);
    input_was_plain = !tfz::is_functional(x);
    return {xs[0] + xs[1], xs[0].view({-1})};
  };
  const std::vector<at::Tensor> out = tfz::functionalize(fn)({x, x.clone()});
  EXPECT_TRUE(inputs_functional);
  EXPECT_TRUE(input_was_plain);
  ASSERT_EQ(out.size(), 2u);
  expect_same_tensor(out[0], x + x, "sum", false);
  expect_same_tensor(out[1], x.view({-1}), "flat view", false);
}

TEST(FunctionalizeApiTest, MutationThroughAFlatViewUpdatesTheBase) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor flat = xs[0].view({-1});
    flat.add_(1);
    flat.mul_(flat);
    return {xs[0] * 1, flat, xs[0].sum(0)};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(3, 4)});
}

TEST(FunctionalizeApiTest, InPlaceMulOnASelectedRowUpdatesThatRowOnly) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].select(0, 1).mul_(2);
    return {xs[0].clone(), xs[0].select(0, 1)};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(3, 4, 1.0)});
}

TEST(FunctionalizeApiTest, FillOnASliceUpdatesTheBaseAndTheSlice) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor s = xs[0].slice(1, 1, 3);
    s.fill_(7);
    at::Tensor fresh = xs[1].clone();
    fresh.slice(0, 0, 2, 2).fill_(-1);
    return {xs[0] * 2, s, fresh};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 4), float_grid(3, 3)});
}

TEST(FunctionalizeApiTest, MutationThroughATransposeUpdatesTheBase) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor y = xs[0].clone();
    at::Tensor t = y.transpose(0, 1);
    t.mul_(xs[1]);
    xs[0].transpose(0, 1).add_(xs[1]);
    return {y, t, xs[0] + 0};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3), float_grid(3, 2, 1.0)});
}

TEST(FunctionalizeApiTest, SeveralAliasesOfOneBaseSeeEachOthersWrites) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor base = xs[0].clone();
    at::Tensor flat = base.view({-1});
    at::Tensor row = base.select(0, 0);
    at::Tensor cols = base.slice(1, 0, 2);
    flat.add_(1);
    row.mul_(3);
    // Snapshot between writes: `cols` must already see the two writes above.
    at::Tensor cols_snapshot = cols.clone();
    cols.sub_(2);
    return {base, flat, row, cols, cols_snapshot};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(3, 3)});
}

TEST(FunctionalizeApiTest, SeveralAliasesOfAnInputAllReachTheInput) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor row = xs[0].select(0, 2);
    at::Tensor col = xs[0].select(1, 1);
    at::Tensor t = xs[0].t();
    row.add_(100);
    col.mul_(-1);
    t.select(0, 0).fill_(0.5);
    return {row + 0, col + 0};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(3, 3)});
}

TEST(FunctionalizeApiTest, AtFactoryResultCreatedInsideIsWrappedAndMutable) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor z = at::zeros({2, 3});
    z.add_(xs[0]);
    z.select(0, 0).fill_(5);
    at::Tensor r = at::arange(3, at::kFloat);
    r.mul_(z.select(0, 1));
    return {z, r};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3, 1.0)});
}

TEST(FunctionalizeApiTest, AtFactoryInsideFnReturnsAWrapper) {
  bool zeros_functional = false;
  bool like_functional = false;
  tfz::TensorFn fn = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor z = at::zeros({2});
    zeros_functional = tfz::is_functional(z);
    like_functional = tfz::is_functional(at::ones_like(xs[0]));
    return {z};
  };
  const std::vector<at::Tensor> out = tfz::functionalize(fn)({float_grid(1, 2)});
  EXPECT_TRUE(zeros_functional);
  EXPECT_TRUE(like_functional);
  ASSERT_EQ(out.size(), 1u);
  expect_same_tensor(out[0], at::zeros({2}), "zeros", true);
}

TEST(FunctionalizeApiTest, TorchFactoryWrappedWithWrapFreshMatchesEager) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    at::Tensor z = torch::zeros({2, 3});
    // wrap_fresh needs an active transform; the eager reference run has none.
    if (tfz::is_functional(xs[0])) {
      z = tfz::wrap_fresh(z);
    }
    z.add_(xs[0]);
    z.slice(1, 0, 1).mul_(4);
    return {z, z.sum()};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3, 2.0)});
}

TEST(FunctionalizeApiTest, WrapFreshReturnsAWrapperInsideFn) {
  bool wrapped_functional = false;
  tfz::TensorFn fn = [&](const std::vector<at::Tensor>&) -> std::vector<at::Tensor> {
    at::Tensor z = tfz::wrap_fresh(torch::ones({3}));
    wrapped_functional = tfz::is_functional(z);
    z.mul_(2);
    return {z};
  };
  const std::vector<at::Tensor> out = tfz::functionalize(fn)({});
  EXPECT_TRUE(wrapped_functional);
  ASSERT_EQ(out.size(), 1u);
  expect_same_tensor(out[0], at::ones({3}) * 2, "ones * 2", true);
}

TEST(FunctionalizeApiTest, OutVariantsWriteFreshAndInputOutTensors) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    // An empty out= tensor is resized by the op; an input used as out= is written back.
    at::Tensor out = at::empty({0});
    at::add_out(out, xs[0], xs[1]);
    at::Tensor input_out = xs[2];  // at::*_out takes a non-const Tensor&
    at::mul_out(input_out, xs[0], xs[1]);
    return {out, out.sum(1)};
  };
  expect_matches_eager_in_both_modes(fn,
                                     {float_grid(2, 3), float_grid(2, 3, 3.0), at::zeros({2, 3})});
}

TEST(FunctionalizeApiTest, ProgramWithoutMutationLeavesInputsUnchanged) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    return {xs[0].t().matmul(xs[1]), xs[0].view({-1}).sin(), xs[0], xs[1].select(1, 0)};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3), float_grid(2, 4, 1.0)});
}

TEST(FunctionalizeApiTest, Int64ProgramMatchesEagerExactly) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].add_(3);
    xs[0].select(1, 2).mul_(xs[0].select(1, 0));
    at::Tensor y = xs[0].view({-1}).clone();
    y.floor_divide_(2);
    return {xs[0].sum(1), y};
  };
  expect_matches_eager_in_both_modes(fn, {at::arange(6, at::kLong).view({2, 3})});
}

TEST(FunctionalizeApiTest, BoolProgramMatchesEagerExactly) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].select(0, 0).logical_not_();
    at::Tensor y = xs[1].clone();
    y.bitwise_or_(xs[0]);
    return {y, xs[0].any(1)};
  };
  const at::Tensor mask = at::arange(6, at::kLong).view({2, 3}).remainder(2).to(at::kBool);
  const at::Tensor other = at::arange(6, at::kLong).view({2, 3}).lt(2);
  expect_matches_eager_in_both_modes(fn, {mask, other});
}

TEST(FunctionalizeApiTest, TransposeInPlaceOnAnInputChangesItsSizesAndStridesLikeEager) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].t_();
    return {xs[0] * 1};
  };
  // Strides too, in both modes: the epilogue replays t_ itself (See Note [API: input epilogue]).
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3)});
}

TEST(FunctionalizeApiTest, TransposeInPlaceThenWriteOnAnInputMatchesEager) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].t_();
    xs[0].select(0, 1).add_(10);
    xs[1].unsqueeze_(0);
    return {xs[0] + 0, xs[1] * 2};
  };
  expect_matches_eager_in_both_modes(fn, {float_grid(2, 3), float_grid(1, 4).view({-1})});
}

TEST(FunctionalizeApiTest, ViewOfAnUnmutatedInputAliasesItOnlyWhenViewsAreKept) {
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    return {xs[0].view({-1})};
  };
  at::Tensor x = float_grid(2, 3);
  const at::Tensor kept = tfz::functionalize(fn, tfz::Remove::Mutations)({x}).at(0);
  const at::Tensor removed = tfz::functionalize(fn, tfz::Remove::MutationsAndViews)({x}).at(0);
  expect_same_tensor(kept, x.view({-1}), "Remove::Mutations", true);
  expect_same_tensor(removed, x.view({-1}), "Remove::MutationsAndViews", false);
  // Remove::Mutations keeps views (a real view of x); MutationsAndViews returns a *_copy result.
  EXPECT_TRUE(kept.is_alias_of(x));
  EXPECT_FALSE(removed.is_alias_of(x));
}

TEST(FunctionalizeApiTest, IValueOverloadWrapsTensorsInsideListsTuplesAndDicts) {
  tfz::IValueFn fn = [](const std::vector<c10::IValue>& args) -> c10::IValue {
    c10::List<at::Tensor> list = args[0].toTensorList();
    list.get(0).add_(1);
    const auto& tup = args[1].toTupleRef().elements();
    at::Tensor c = tup[0].toTensor();
    const int64_t k = tup[1].toInt();
    c.mul_(k);
    const c10::impl::GenericDict dict = args[2].toGenericDict();
    at::Tensor d = dict.at("w").toTensor();
    d.sub_(list.get(1));
    const double s = args[3].toDouble();
    c10::List<at::Tensor> out_list;
    out_list.push_back(d + 1);
    return c10::ivalue::Tuple::create({list.get(0) * s, c.view({-1}), out_list, k});
  };
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("w", float_grid(2, 2, 5.0));
  c10::List<at::Tensor> list;
  list.push_back(float_grid(2, 2));
  list.push_back(float_grid(2, 2, 1.0));
  const std::vector<c10::IValue> args = {
      list, c10::ivalue::Tuple::create({float_grid(1, 3), int64_t{3}}), dict, 0.5};

  for (tfz::Remove remove : kBothModes) {
    SCOPED_TRACE("remove=" + mode_name(remove));
    std::vector<c10::IValue> eager_args;
    std::vector<c10::IValue> func_args;
    for (const c10::IValue& a : args) {
      eager_args.push_back(deep_clone(a));
      func_args.push_back(deep_clone(a));
    }
    const c10::IValue eager_out = fn(eager_args);
    const c10::IValue func_out = tfz::functionalize(fn, remove)(func_args);
    expect_same_ivalue(func_out, eager_out, "result", false);
    // The tensors inside the caller's containers carry the mutations afterwards.
    for (size_t i = 0; i < args.size(); ++i) {
      expect_same_ivalue(func_args[i], eager_args[i], "arg " + std::to_string(i), true);
    }
  }
}

TEST(FunctionalizeApiTest, IValueOverloadPassesWrappersEverywhereInsideFn) {
  std::vector<bool> seen;
  tfz::IValueFn fn = [&](const std::vector<c10::IValue>& args) -> c10::IValue {
    seen.push_back(tfz::is_functional(args[0].toTensor()));
    seen.push_back(tfz::is_functional(args[1].toTensorList().get(0)));
    seen.push_back(tfz::is_functional(args[2].toTupleRef().elements()[0].toTensor()));
    return args[0].toTensor() * 2;
  };
  c10::List<at::Tensor> list;
  list.push_back(float_grid(1, 2));
  const at::Tensor x = float_grid(2, 2);
  const c10::IValue out =
      tfz::functionalize(fn)({x, list, c10::ivalue::Tuple::create({float_grid(1, 1)})});
  EXPECT_EQ(seen, std::vector<bool>({true, true, true}));
  ASSERT_TRUE(out.isTensor());
  expect_same_tensor(out.toTensor(), x * 2, "result", true);
}

TEST(FunctionalizeApiTest, ParseRemoveAcceptsBothModeNames) {
  EXPECT_EQ(tfz::parse_remove("mutations"), tfz::Remove::Mutations);
  EXPECT_EQ(tfz::parse_remove("mutations_and_views"), tfz::Remove::MutationsAndViews);
}

TEST(FunctionalizeApiTest, ParseRemoveRejectsAnUnknownNameWithValueError) {
  expect_throws_with<c10::ValueError>([] { tfz::parse_remove("bogus"); }, "mutations_and_views");
  // The message also echoes what the user passed (STYLE.md 10.5: "got <actual values>").
  expect_throws_with<c10::ValueError>([] { tfz::parse_remove("bogus"); }, "bogus");
}

TEST(FunctionalizeApiTest, NestedGuardIsRefused) {
  const DispatchTls before = dispatch_tls();
  // Made outside the guard: at:: factories inside it would already return wrappers.
  const at::Tensor x = float_grid(2, 2);
  const at::Tensor expected = x + 1;
  at::Tensor value;
  {
    tfz::FunctionalizeGuard outer;
    expect_throws_with<c10::Error>([] { tfz::FunctionalizeGuard inner; }, "nested");
    // The refused inner guard must leave the outer one working.
    at::Tensor w = tfz::to_functional(x);
    EXPECT_TRUE(tfz::is_functional(w));
    w.add_(1);
    value = tfz::from_functional(w);
  }
  expect_same_dispatch_tls(before);
  expect_same_tensor(value, expected, "outer still works", false);
}

TEST(FunctionalizeApiTest, NestedFunctionalizeCallIsRefused) {
  const DispatchTls before = dispatch_tls();
  tfz::TensorFn inner = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    return {xs[0] + 1};
  };
  tfz::TensorFn outer = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    return tfz::functionalize(inner)(xs);
  };
  at::Tensor x = float_grid(2, 2);
  expect_throws_with<c10::Error>([&] { tfz::functionalize(outer)({x}); }, "nested");
  expect_same_dispatch_tls(before);
  // The failed call left no layer behind: the same inner call now succeeds on its own.
  const std::vector<at::Tensor> out = tfz::functionalize(inner)({x});
  ASSERT_EQ(out.size(), 1u);
  expect_same_tensor(out[0], x + 1, "after refusal", true);
}

TEST(FunctionalizeApiTest, ToFunctionalWithoutAnActiveGuardThrows) {
  const at::Tensor x = float_grid(2, 2);
  EXPECT_THROW(tfz::to_functional(x), c10::Error);
  EXPECT_THROW(tfz::to_functional(std::vector<at::Tensor>{x, x.clone()}), c10::Error);
}

TEST(FunctionalizeApiTest, WrapperEscapedFromAFunctionalizeCallThrowsOnUse) {
  at::Tensor escaped;
  tfz::TensorFn fn = [&](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    escaped = xs[0].view({-1});
    return {xs[0] + 1};
  };
  tfz::functionalize(fn)({float_grid(2, 2)});
  ASSERT_TRUE(tfz::is_functional(escaped));
  expect_throws_with<c10::Error>([&] { (void)escaped.add(1); }, "escaped");
}

TEST(FunctionalizeApiTest, WrapperUsedAfterItsGuardIsGoneThrowsEscaped) {
  const at::Tensor x = float_grid(2, 2);
  at::Tensor w;
  {
    tfz::FunctionalizeGuard guard;
    w = tfz::to_functional(x);
  }
  expect_throws_with<c10::Error>([&] { (void)w.mul(2); }, "escaped");
}

TEST(FunctionalizeApiTest, ExceptionInsideFnPropagatesAndRestoresDispatchState) {
  const DispatchTls before = dispatch_tls();
  at::Tensor x = float_grid(2, 3);
  const at::Tensor original = x.clone();
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].add_(1);
    throw std::runtime_error("boom from fn");
  };
  expect_throws_with<std::runtime_error>([&] { tfz::functionalize(fn)({x}); }, "boom from fn");
  expect_same_dispatch_tls(before);
  // No epilogue runs on exception (api/Call.h), so the write before the throw is lost.
  expect_same_tensor(x, original, "input after the exception", true);
  // And no layer is left behind: a later call is not refused as nested.
  tfz::TensorFn ok = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].add_(1);
    return {};
  };
  tfz::functionalize(ok)({x});
  expect_same_tensor(x, original + 1, "input after a later call", true);
}

TEST(FunctionalizeApiTest, OpErrorInsideFnPropagatesAsC10ErrorAndRestoresDispatchState) {
  const DispatchTls before = dispatch_tls();
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    return {xs[0].add_(xs[1])};  // shapes (2, 3) and (4,) do not broadcast
  };
  EXPECT_THROW(tfz::functionalize(fn)({float_grid(2, 3), at::zeros({4})}), c10::Error);
  expect_same_dispatch_tls(before);
}

TEST(FunctionalizeApiTest, NormalCallLeavesDispatchStateUnchanged) {
  const DispatchTls before = dispatch_tls();
  tfz::TensorFn fn = [](const std::vector<at::Tensor>& xs) -> std::vector<at::Tensor> {
    xs[0].view({-1}).add_(1);
    return {at::zeros({2}) + xs[0].sum()};
  };
  for (tfz::Remove remove : kBothModes) {
    SCOPED_TRACE("remove=" + mode_name(remove));
    tfz::functionalize(fn, remove)({float_grid(2, 2)});
    expect_same_dispatch_tls(before);
  }
}

// Autograd runs the backward of CUDA tensors on a device thread, under the ThreadLocalState of the
// thread that called backward() (our keys included, no layer of that thread's own). This does the
// same on the CPU: a worker restores the caller's state and runs ops on the caller's wrappers,
// reads and writes. See Note [Layer: threads that carry a layer's TLS].
TEST(FunctionalizeApiTest, OpsOnAThreadCarryingTheCallersStateJoinTheLayer) {
  const tfz::TensorFn fn = [](const std::vector<at::Tensor>& in) {
    at::Tensor y = in[0].mul(2);
    at::Tensor z;
    std::exception_ptr error;
    at::ThreadLocalState state;
    std::thread worker([&] {
      try {
        at::ThreadLocalStateGuard guard(state);
        z = y.add(1);
        z.add_(at::ones({3}));  // a factory too: its result joins the layer
        in[0].sub_(1);          // a write to an input, replayed by the epilogue
      } catch (...) {
        error = std::current_exception();
      }
    });
    worker.join();
    if (error) std::rethrow_exception(error);
    return std::vector<at::Tensor>{z, y};
  };
  expect_matches_eager_in_both_modes(fn, {at::arange(3, at::kFloat)});
}
