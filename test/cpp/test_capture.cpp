// Tests of tfz::capture, the C++ graph capture: each program is captured on clones, the graph is
// run on other clones, and outputs and final inputs must equal eager's on a third set. Also: what
// the graph holds (functional ops, the epilogue, no dead view), meta inputs, printing, errors.
#include <torch_functionalize/functionalize.h>

#include "TestUtils.h"
#include "core/Graph.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>

#include <string>
#include <vector>

namespace {

using namespace tfz::test;

void expect_graph_matches_eager(const tfz::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                                tfz::Remove remove) {
  SCOPED_TRACE("remove=" + mode_name(remove));
  std::vector<at::Tensor> eager_inputs = clone_all(inputs);
  const auto eager_outputs = fn(eager_inputs);
  const tfz::CapturedGraph graph = tfz::capture(fn, clone_all(inputs), remove);
  std::vector<at::Tensor> graph_inputs = clone_all(inputs);
  const auto graph_outputs = graph(graph_inputs);
  ASSERT_EQ(graph_outputs.size(), eager_outputs.size());
  for (size_t i = 0; i < eager_outputs.size(); ++i) {
    expect_same_tensor(graph_outputs[i], eager_outputs[i], "output " + std::to_string(i), false);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    expect_same_tensor(graph_inputs[i], eager_inputs[i], "input " + std::to_string(i), true);
  }
  for (const auto& node : graph.graph().nodes) {
    const auto& schema = node.op.schema();
    const std::string name = schema.name();
    if (schema.is_mutable()) {
      EXPECT_TRUE(name == "aten::copy_" || name == "aten::as_strided_" || name == "aten::resize_")
          << "mutable op left in the graph:\n"
          << graph.str();
    }
  }
}

std::vector<at::Tensor> write_row_through_view(const std::vector<at::Tensor>& in) {
  at::Tensor x = in[0];
  x.select(0, 1).add_(in[1]);
  at::Tensor unused = x.diagonal();  // a dead view: not in the graph
  return {x.view({-1}).sum(), x * 2};
}

TEST(Capture, WriteThroughViewOfInputMatchesEager) {
  for (auto remove : {tfz::Remove::Mutations, tfz::Remove::MutationsAndViews}) {
    expect_graph_matches_eager(write_row_through_view,
                               {float_grid(3, 4), float_grid(1, 4, 7).view({-1})}, remove);
  }
}

TEST(Capture, GraphIsFunctionalWithOneEpilogueCopy) {
  const auto graph =
      tfz::capture(write_row_through_view, {float_grid(3, 4), float_grid(1, 4, 7).view({-1})},
                   tfz::Remove::MutationsAndViews);
  const auto names = op_names(graph);
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::copy_"), 1) << graph.str();
  EXPECT_EQ(names.back(), "aten::copy_") << graph.str();
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::diagonal_copy"), 0) << graph.str();
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::add_.Tensor"), 0) << graph.str();
}

TEST(Capture, FactoriesAndMultipleOutputsMatchEager) {
  auto fn = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    at::Tensor buf = at::zeros({4, 3});
    buf.narrow(0, 1, 2).copy_(in[0]);
    auto parts = buf.split(2);
    parts[1].mul_(3);
    return {buf, parts[0]};
  };
  for (auto remove : {tfz::Remove::Mutations, tfz::Remove::MutationsAndViews}) {
    expect_graph_matches_eager(fn, {float_grid(2, 3)}, remove);
  }
}

TEST(Capture, MetaInputsComputeNothingAndGraphRunsOnRealOnes) {
  const at::Tensor x = at::empty({3, 4}, at::kMeta);
  const at::Tensor y = at::empty({4}, at::kMeta);
  const auto graph = tfz::capture(write_row_through_view, {x, y});
  std::vector<at::Tensor> real = {float_grid(3, 4), float_grid(1, 4, 7).view({-1})};
  std::vector<at::Tensor> eager = clone_all(real);
  const auto expected = write_row_through_view(eager);
  const auto got = graph(real);
  expect_same_tensor(got[0], expected[0], "output 0", false);
  expect_same_tensor(real[0], eager[0], "input 0", true);
}

TEST(Capture, PrintsOneLinePerOp) {
  const auto graph =
      tfz::capture(write_row_through_view, {float_grid(3, 4), float_grid(1, 4).view({-1})});
  const std::string text = graph.str();
  EXPECT_NE(text.find("aten::select_scatter("), std::string::npos) << text;
  // Only row 1 was written: the epilogue copies into a view of the input, not the input.
  EXPECT_NE(text.find("aten::select.int(%0, 0, 1)"), std::string::npos) << text;
  EXPECT_EQ(text.find("aten::copy_(%0, "), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), graph.num_nodes() + 2) << text;
}

TEST(Capture, EpilogueWritesOnlyTheWrittenRegions) {
  // Two overlapping slices of an input written in turn, nothing read after: the epilogue copies
  // into the two slices in order and the graph keeps no whole-input value.
  auto fn = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    in[0].narrow(0, 0, 2).add_(1);
    in[0].narrow(0, 1, 2).mul_(2);
    return {};
  };
  expect_graph_matches_eager(fn, {float_grid(4, 3)}, tfz::Remove::Mutations);
  const auto graph = tfz::capture(fn, {float_grid(4, 3)});
  const auto names = op_names(graph);
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::copy_"), 2) << graph.str();
  EXPECT_EQ(std::count(names.begin(), names.end(), "aten::slice_scatter"), 1) << graph.str();
}

TEST(Capture, NestedCaptureIsAnError) {
  auto outer = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    tfz::capture([](const std::vector<at::Tensor>& v) { return v; }, in);
    return in;
  };
  const auto before = dispatch_tls();
  expect_throws_with<c10::Error>([&] { tfz::capture(outer, {float_grid(2, 2)}); },
                                 "capture: called inside a functionalized function");
  expect_same_dispatch_tls(before);
}

TEST(Capture, ExceptionLeavesDispatchStateAsItWas) {
  auto failing = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    in[0].add_(1);
    return {at::mm(in[0], in[0])};  // 2x3 @ 2x3: eager's shape error
  };
  const auto before = dispatch_tls();
  EXPECT_THROW(tfz::capture(failing, {float_grid(2, 3)}), c10::Error);
  expect_same_dispatch_tls(before);
  // And the next capture works.
  expect_graph_matches_eager(write_row_through_view,
                             {float_grid(3, 4), float_grid(1, 4).view({-1})},
                             tfz::Remove::Mutations);
}

}  // namespace

// A value read out of a tensor in C++ (item<float>()) is guarded in the graph: the graph replays
// on an input that gives the same value and refuses one that gives another, naming the read.
// See Note [Capture: guards on values read].
TEST(Capture, ValueReadOutOfATensorIsGuarded) {
  auto scale_by_sum = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const float s = in[0].sum().item<float>();
    return {in[0] * s};
  };
  const auto graph = tfz::capture(scale_by_sum, {at::ones({3})});
  EXPECT_NE(graph.str().find("tfz::_guard_value"), std::string::npos) << graph.str();
  const at::Tensor same = at::full({3}, 1.0);
  EXPECT_TRUE(at::allclose(graph({same})[0], scale_by_sum({same})[0]));
  try {
    graph({at::full({3}, 2.0)});
    FAIL() << "the guard did not raise";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("specialized on it"), std::string::npos) << e.what();
  }
}

// The graph is specialized on its inputs' metadata and aliasing: a replay on inputs of other
// sizes or dtype, or that share memory where the captured ones did not, raises naming the input
// instead of computing numbers of the captured shapes. See Note [Capture: guards on inputs].
TEST(Capture, InputsOfOtherSizesDtypeOrAliasingAreRefused) {
  auto sized_like_input = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    in[1].add_(in[0]);
    return {at::zeros({in[0].size(0)}).add_(in[0].sum())};
  };
  const auto graph = tfz::capture(sized_like_input, {at::ones({3}), at::ones({3})});
  std::vector<at::Tensor> same = {at::ones({3}), at::ones({3})};
  EXPECT_TRUE(at::allclose(graph(same)[0], at::full({3}, 3.0)));
  const at::Tensor shared = at::ones({3});
  const std::vector<std::pair<std::string, std::vector<at::Tensor>>> refused = {
      {"sizes", {at::ones({5}), at::ones({3})}},
      {"dtype", {at::ones({3}, at::kDouble), at::ones({3})}},
      {"memory shared with", {shared, shared}},
  };
  for (const auto& [what, inputs] : refused) {
    try {
      graph(inputs);
      ADD_FAILURE() << "no error for other " << what;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("with " + what), std::string::npos) << e.what();
    }
  }
}

// An input read through a small storage it does not span (x = b[:6] of a 37-element b) makes the
// storage's size an input guard: a replay on a smaller storage raises naming it instead of failing
// inside as_strided. See Note [Inputs: storage coordinates under a tracer].
TEST(Capture, TheSizeOfAStorageReadWholeIsGuarded) {
  auto add_one = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    in[0].add_(1);
    return {in[0] * 2};
  };
  const auto graph = tfz::capture(add_one, {at::zeros({37}).slice(0, 0, 6)});
  const at::Tensor same = at::zeros({37});
  EXPECT_TRUE(at::allclose(graph({same.slice(0, 0, 6)})[0], at::full({6}, 2.0)));
  EXPECT_TRUE(at::allclose(same.slice(0, 0, 6), at::ones({6})));
  try {
    graph({at::zeros({6})});
    FAIL() << "no error for a smaller storage";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("with a storage of 148 bytes"), std::string::npos)
        << e.what();
  }
}

// A write autograd does not see of a value whose gradient comes from an input: the graph holds
// tfz::_with_gradient_of, and run under autograd gives eager's gradient (the identity through
// the clamp, not clamp's derivative). An SGD step's write of a parameter that is only written
// back holds none (no copy). See Note [Graphs: writes autograd does not see].
TEST(Capture, HiddenWriteKeepsTheGradientWhenTheGraphRunsUnderAutograd) {
  auto clamp_unseen = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    at::Tensor h = in[0] * 2;
    {
      c10::NoGradGuard no_grad;
      h.clamp_min_(0);
    }
    return {(h * in[1]).sum()};
  };
  const at::Tensor x = float_grid(2, 3, -3.0);
  for (auto remove : {tfz::Remove::Mutations, tfz::Remove::MutationsAndViews}) {
    SCOPED_TRACE("remove=" + mode_name(remove));
    const auto graph =
        tfz::capture(clamp_unseen, {float_grid(2, 3, -2.5).requires_grad_(), x}, remove);
    const auto names = op_names(graph);
    EXPECT_EQ(std::count(names.begin(), names.end(), "tfz::_with_gradient_of"), 1) << graph.str();
    const at::Tensor eager_w = float_grid(2, 3, -2.0).requires_grad_();
    const at::Tensor graph_w = float_grid(2, 3, -2.0).requires_grad_();
    const at::Tensor expected = torch::autograd::grad(clamp_unseen({eager_w, x}), {eager_w})[0];
    const at::Tensor actual = torch::autograd::grad(graph({graph_w, x}), {graph_w})[0];
    EXPECT_TRUE(at::allclose(actual, expected)) << actual << expected;
  }
}

TEST(Capture, ParameterStepOnlyWrittenBackHoldsNoGradientCopy) {
  auto sgd_step = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const at::Tensor loss = (in[0] * in[1]).square().sum();
    const at::Tensor g = torch::autograd::grad({loss}, {in[0]})[0];
    {
      c10::NoGradGuard no_grad;
      in[0].sub_(g * 0.1);
    }
    return {loss.detach()};
  };
  for (auto remove : {tfz::Remove::Mutations, tfz::Remove::MutationsAndViews}) {
    SCOPED_TRACE("remove=" + mode_name(remove));
    const at::Tensor x = float_grid(2, 3, 1.0);
    const auto graph = tfz::capture(sgd_step, {float_grid(2, 3).requires_grad_(), x}, remove);
    const auto names = op_names(graph);
    EXPECT_EQ(std::count(names.begin(), names.end(), "tfz::_with_gradient_of"), 0) << graph.str();
    const at::Tensor eager_w = float_grid(2, 3).requires_grad_();
    const at::Tensor graph_w = float_grid(2, 3).requires_grad_();
    EXPECT_TRUE(at::allclose(graph({graph_w, x})[0], sgd_step({eager_w, x})[0]));
    EXPECT_TRUE(at::allclose(graph_w.detach(), eager_w.detach()));
    EXPECT_TRUE(graph_w.is_leaf() && graph_w.requires_grad());
  }
}
