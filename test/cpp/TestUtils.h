// Helpers shared by the GoogleTest suites: the two remove modes, exact comparison of the thread's
// dispatch TLS, tensor comparison against eager, a captured graph's op names, and exception checks
// with a message fragment.
#pragma once

#include <torch_functionalize/functionalize.h>

#include "core/Graph.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace tfz::test {

constexpr std::array<tfz::Remove, 2> kBothModes = {tfz::Remove::Mutations,
                                                   tfz::Remove::MutationsAndViews};

inline std::string mode_name(tfz::Remove remove) {
  return remove == tfz::Remove::Mutations ? "mutations" : "mutations_and_views";
}

/// Raw bits of the thread's local dispatch key set, so before/after can be compared exactly.
struct DispatchTls {
  uint64_t included;
  uint64_t excluded;
};

inline DispatchTls dispatch_tls() {
  const c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
  return {tls.included_.raw_repr(), tls.excluded_.raw_repr()};
}

inline void expect_same_dispatch_tls(const DispatchTls& before) {
  const DispatchTls after = dispatch_tls();
  EXPECT_EQ(after.included, before.included) << "TLS included_ set changed";
  EXPECT_EQ(after.excluded, before.excluded) << "TLS excluded_ set changed";
}

/// Values, dtype and sizes always; strides only when asked (`*_copy` results may be contiguous).
/// Floating values with allclose, everything else exactly. `actual` must be a plain tensor.
inline void expect_same_tensor(const at::Tensor& actual, const at::Tensor& expected,
                               const std::string& what, bool check_strides) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(actual.defined());
  ASSERT_TRUE(expected.defined());
  EXPECT_FALSE(tfz::is_functional(actual)) << "a functional wrapper reached the caller";
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  if (check_strides) {
    EXPECT_EQ(actual.strides(), expected.strides());
  }
  if (c10::isFloatingType(expected.scalar_type()) || c10::isComplexType(expected.scalar_type())) {
    EXPECT_TRUE(at::allclose(actual, expected)) << "got\n" << actual << "\neager\n" << expected;
  } else {
    EXPECT_TRUE(at::equal(actual, expected)) << "got\n" << actual << "\neager\n" << expected;
  }
}

// The qualified op names of a captured graph's nodes, in order.
inline std::vector<std::string> op_names(const tfz::CapturedGraph& g) {
  std::vector<std::string> names;
  for (const auto& node : g.graph().nodes) names.push_back(c10::toString(node.op.operator_name()));
  return names;
}

inline std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(t.clone());
  return out;
}

/// `f()` must throw exactly an `E` whose message contains `fragment`.
template <typename E, typename F>
void expect_throws_with(F&& f, const std::string& fragment) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos)
        << "message does not mention \"" << fragment << "\": " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a different exception type: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

/// A rows x cols float tensor holding offset, offset + 1, ... in row-major order.
inline at::Tensor float_grid(int64_t rows, int64_t cols, double offset = 0.0) {
  return (at::arange(rows * cols, at::kFloat) + offset).view({rows, cols});
}

}  // namespace tfz::test
