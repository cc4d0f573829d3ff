// Tests of tfz::reinplace, the C++ reinplacing pass on a captured graph, whose rules are in
// Note [Reinplace: the C++ pass]: a KV-cache step captured in C++ writes its cache in place with
// no epilogue copy, an inference chain reuses its buffers, slices fill their buffer in place and a
// product is computed into the input it is written to; each graph still gives eager's outputs and
// inputs.
// What each rule keeps is tested from Python (test/python/test_reinplace_cpp.py).
#include <torch_functionalize/functionalize.h>
#include <torch_functionalize/reinplace.h>

#include "TestUtils.h"
#include "core/Graph.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace tfz::test;

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Captures fn, reinplaces the graph, and checks the rewritten graph against eager.
tfz::CapturedGraph reinplaced_matching_eager(const tfz::TensorFn& fn,
                                             const std::vector<at::Tensor>& inputs,
                                             std::vector<std::string>* explain) {
  std::vector<at::Tensor> eager_inputs = clone_all(inputs);
  const auto expected = fn(eager_inputs);
  const tfz::CapturedGraph graph = tfz::capture(fn, clone_all(inputs));
  const tfz::CapturedGraph rewritten = tfz::reinplace(graph, explain);
  std::vector<at::Tensor> graph_inputs = clone_all(inputs);
  const auto actual = rewritten(graph_inputs);
  EXPECT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    expect_same_tensor(actual[i], expected[i], "output " + std::to_string(i), false);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    expect_same_tensor(graph_inputs[i], eager_inputs[i], "input " + std::to_string(i), true);
  }
  return rewritten;
}

std::vector<at::Tensor> kv_cache_step(const std::vector<at::Tensor>& in) {
  at::Tensor cache = in[0];
  cache.index_copy_(1, in[1], in[2]);
  return {cache.index_select(1, at::arange(2)).sum()};
}

TEST(Reinplace, KvCacheWriteHappensInTheCacheWithNoEpilogueCopy) {
  c10::AutoGradMode no_grad(false);
  std::vector<std::string> explain;
  const auto rewritten = reinplaced_matching_eager(
      kv_cache_step, {at::randn({2, 64, 4}), at::tensor({5}, at::kLong), at::randn({2, 1, 4})},
      &explain);
  const auto names = op_names(rewritten);
  EXPECT_TRUE(has(names, "aten::index_copy_")) << rewritten.str();
  EXPECT_FALSE(has(names, "aten::index_copy")) << rewritten.str();
  EXPECT_FALSE(has(names, "aten::copy_")) << rewritten.str();
  ASSERT_FALSE(explain.empty());
}

std::vector<at::Tensor> inference_chain(const std::vector<at::Tensor>& in) {
  at::Tensor h = at::matmul(in[0], in[1]);
  h = h + 1;
  h = at::relu(h);
  h = h * 0.5;
  return {h};
}

TEST(Reinplace, InferenceChainReusesItsBuffer) {
  c10::AutoGradMode no_grad(false);
  std::vector<std::string> explain;
  const auto rewritten =
      reinplaced_matching_eager(inference_chain, {at::randn({3, 4}), at::randn({4, 5})}, &explain);
  const auto names = op_names(rewritten);
  // (h + 1 and h * 0.5 from C++ are the Scalar overloads.)
  EXPECT_TRUE(has(names, "aten::add_.Scalar")) << rewritten.str();
  EXPECT_TRUE(has(names, "aten::relu_")) << rewritten.str();
  EXPECT_TRUE(has(names, "aten::mul_.Scalar")) << rewritten.str();
  EXPECT_TRUE(has(names, "aten::mm")) << "mm has no in-place twin: " << rewritten.str();
  EXPECT_EQ(explain.size(), 3U);
}

// A buffer filled slice by slice, then a product written into an input with out=.
std::vector<at::Tensor> fill_then_project(const std::vector<at::Tensor>& in) {
  at::Tensor buf = at::zeros({4, 8});
  buf.narrow(1, 0, 3).copy_(in[0]);
  buf.narrow(1, 3, 5).copy_(in[1] * 2);
  at::Tensor out = in[2];
  at::mm_out(out, buf.t(), buf);
  return {buf.sum()};
}

TEST(Reinplace, SlicesFillTheirBufferAndTheProductLandsInTheInput) {
  c10::AutoGradMode no_grad(false);
  std::vector<std::string> explain;
  const auto rewritten = reinplaced_matching_eager(
      fill_then_project, {at::randn({4, 3}), at::randn({4, 5}), at::empty({8, 8})}, &explain);
  const auto names = op_names(rewritten);
  EXPECT_FALSE(has(names, "aten::slice_scatter")) << rewritten.str();
  EXPECT_TRUE(has(names, "aten::mm.out")) << rewritten.str();
  EXPECT_FALSE(has(names, "aten::mm")) << rewritten.str();
}

TEST(Reinplace, GivenGraphIsUnchanged) {
  c10::AutoGradMode no_grad(false);
  const tfz::CapturedGraph graph =
      tfz::capture(inference_chain, {at::randn({3, 4}), at::randn({4, 5})});
  const std::string before = graph.str();
  const auto rewritten = tfz::reinplace(graph);
  EXPECT_EQ(graph.str(), before);
  EXPECT_NE(rewritten.str(), before);
}

}  // namespace
