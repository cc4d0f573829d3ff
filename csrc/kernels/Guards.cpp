// The guard ops a captured graph holds where the program read a value out of a tensor
// (tfz::_guard_value, tfz::_guard_equal, tfz::_guard_allclose, tfz::_guard_scalar_op) or took a
// size that depends on values (tfz::_guard_sizes), and the one a make_fx graph holds for an input
// it reads through its storage (tfz::_guard_layout): each checks, on replay, that what the graph
// specialized on holds, and raises naming it otherwise. See Note [Capture: guards on values read]
// and Note [Inputs: storage coordinates under a tracer].
#include <ATen/core/Formatting.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/allclose.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <sstream>

namespace {

bool same_scalar(const c10::Scalar& a, const c10::Scalar& b) {
  if (a.isComplex() || b.isComplex()) return a.toComplexDouble() == b.toComplexDouble();
  if (a.isFloatingPoint() || b.isFloatingPoint()) {
    // -0.0 is not 0.0 for what follows (atan2(0, -0.0) is pi, 1 / -0.0 is -inf).
    const double x = a.toDouble(), y = b.toDouble();
    return (x == y && std::signbit(x) == std::signbit(y)) || (std::isnan(x) && std::isnan(y));
  }
  if (a.isBoolean() || b.isBoolean()) return a.toBool() == b.toBool();
  return a.toLong() == b.toLong();
}

constexpr const char* kRemedy =
    " Capture again for inputs that give this value, or keep the value a tensor (torch.where "
    "instead of a Python if; capturable=True for torch.optim optimizers on devices that support "
    "it).";

void guard_value(const at::Tensor& self, const c10::Scalar& expected, c10::string_view what) {
  const c10::Scalar actual = self.item();
  TORCH_CHECK(same_scalar(actual, expected),
              "functionalize: the captured graph read a value out "
              "of a tensor (",
              what, ") and specialized on it: it was ", expected, " when captured and is ", actual,
              " now.", kRemedy);
}

// A comparison of two tensors read as a Python bool (torch.equal, torch.allclose).
void check_comparison(bool actual, bool expected, c10::string_view what) {
  TORCH_CHECK(actual == expected,
              "functionalize: the captured graph read a value out of two tensors (", what,
              ") and specialized on it: it was ", expected ? "True" : "False",
              " when captured and is ", actual ? "True" : "False", " now.", kRemedy);
}

void guard_equal(const at::Tensor& self, const at::Tensor& other, bool expected,
                 c10::string_view what) {
  check_comparison(self.equal(other), expected, what);
}

void guard_allclose(const at::Tensor& self, const at::Tensor& other, double rtol, double atol,
                    bool equal_nan, bool expected, c10::string_view what) {
  check_comparison(at::allclose(self, other, rtol, atol, equal_nan), expected, what);
}

void guard_sizes(const at::Tensor& self, c10::SymIntArrayRef expected, c10::string_view what) {
  TORCH_CHECK(self.sym_sizes() == expected,
              "functionalize: the captured graph specialized on "
              "the sizes of a result that depend on the values of its inputs (",
              what, "): they were ", expected, " when captured and are ", self.sym_sizes(), " now.",
              kRemedy);
}

// An op that returns a Python number computed from its tensors (q_scale, q_zero_point, _nnz of a
// sparse tensor, _nested_tensor_from_mask_left_aligned): called again, by name, on the replay's.
void guard_scalar_op(at::TensorList args, c10::string_view op, c10::string_view overload,
                     const c10::Scalar& expected, c10::string_view what) {
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(std::string(op).c_str(),
                                                                     std::string(overload).c_str());
  torch::jit::Stack stack(args.begin(), args.end());
  handle.callBoxed(stack);
  const c10::Scalar actual = stack.back().toScalar();
  TORCH_CHECK(same_scalar(actual, expected),
              "functionalize: the captured graph read a value out of a tensor (", what,
              ") and specialized on it: it was ", expected, " when captured and is ", actual,
              " now.", kRemedy);
}

// An input a make_fx graph reads through its storage coordinates: its strides and offset, its
// storage's size, and the input it shares that storage with, as when traced. See
// Note [Inputs: storage coordinates under a tracer].
void guard_layout(const at::Tensor& self, at::IntArrayRef stride, int64_t storage_offset,
                  int64_t storage_nbytes, const std::optional<at::Tensor>& shares_with,
                  c10::string_view what) {
  const bool same_storage =
      !shares_with.has_value() || (self.has_storage() && shares_with->has_storage() &&
                                   self.storage().is_alias_of(shares_with->storage()));
  const auto nbytes = self.has_storage() ? static_cast<int64_t>(self.storage().nbytes()) : 0;
  TORCH_CHECK(
      self.strides() == stride && self.storage_offset() == storage_offset &&
          nbytes == storage_nbytes && same_storage,
      "functionalize: the make_fx graph depends on the layout of ", what,
      " (as_strided, resize_ or a metadata change of it, a write through unfold, a random fill "
      "drawn in its memory order; or it overlaps itself or shares memory with another input: "
      "Note [Inputs: storage coordinates under a tracer]) and was traced with strides ",
      stride, ", storage offset ", storage_offset, " and a storage of ", storage_nbytes, " bytes",
      shares_with.has_value() ? " shared with an earlier input" : "",
      "; it is called with strides ", self.strides(), ", storage offset ", self.storage_offset(),
      " and a storage of ", nbytes, " bytes",
      shares_with.has_value() ? (same_storage ? " shared with it" : " not shared with it") : "",
      ". Trace again for inputs laid out like these.");
}

void no_check_on_meta(const at::Tensor&, const c10::Scalar&, c10::string_view) {}
void no_op_check_on_meta(at::TensorList, c10::string_view, c10::string_view, const c10::Scalar&,
                         c10::string_view) {}
void no_equal_check_on_meta(const at::Tensor&, const at::Tensor&, bool, c10::string_view) {}
void no_allclose_check_on_meta(const at::Tensor&, const at::Tensor&, double, double, bool, bool,
                               c10::string_view) {}

}  // namespace

TORCH_LIBRARY(tfz, m) {
  m.def("_guard_value(Tensor self, Scalar expected, str what) -> ()");
  m.def("_guard_equal(Tensor self, Tensor other, bool expected, str what) -> ()");
  m.def(
      "_guard_allclose(Tensor self, Tensor other, float rtol, float atol, bool equal_nan, "
      "bool expected, str what) -> ()");
  m.def("_guard_sizes(Tensor self, SymInt[] expected, str what) -> ()");
  m.def("_guard_scalar_op(Tensor[] args, str op, str overload, Scalar expected, str what) -> ()");
  m.def(
      "_guard_layout(Tensor self, int[] stride, int storage_offset, int storage_nbytes, "
      "Tensor? shares_with, str what) -> ()");
}

TORCH_LIBRARY_IMPL(tfz, CompositeExplicitAutograd, m) {
  m.impl("_guard_value", &guard_value);
  m.impl("_guard_equal", &guard_equal);
  m.impl("_guard_allclose", &guard_allclose);
  m.impl("_guard_sizes", &guard_sizes);
  m.impl("_guard_scalar_op", &guard_scalar_op);
  m.impl("_guard_layout", &guard_layout);
}

// Meta tensors hold no values: a replay on meta checks sizes only.
TORCH_LIBRARY_IMPL(tfz, Meta, m) {
  m.impl("_guard_value", &no_check_on_meta);
  m.impl("_guard_equal", &no_equal_check_on_meta);
  m.impl("_guard_allclose", &no_allclose_check_on_meta);
  m.impl("_guard_scalar_op", &no_op_check_on_meta);
}

// A conjugate or negative view keeps its bit: the fallbacks of those keys would hand
// _guard_layout a resolved copy, whose storage is not the input's.
TORCH_LIBRARY_IMPL(tfz, Conjugate, m) {
  m.impl("_guard_layout", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(tfz, Negative, m) {
  m.impl("_guard_layout", torch::CppFunction::makeFallthrough());
}
