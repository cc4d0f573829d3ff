// PYBIND11_MODULE(_C): exposes the C++ API and diagnostics to Python. No logic lives here; the
// Python package (python/torch_functionalize) composes these calls. _C.pyi lists every binding
// (test_bindings.py checks that it stays complete).
#include <torch_functionalize/functionalize.h>

#include "api/Call.h"
#include "core/Layer.h"
#include "kernels/Registration.h"
#include "kernels/Subclasses.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>

namespace py = pybind11;

namespace {

// A guard whose lifetime Python controls explicitly (a context manager calls close()).
class PyGuard {
 public:
  explicit PyGuard(const std::string& remove)
      : guard_(std::make_unique<tfz::FunctionalizeGuard>(tfz::parse_remove(remove))) {}
  void close() { guard_.reset(); }

 private:
  std::unique_ptr<tfz::FunctionalizeGuard> guard_;
};

std::vector<at::Tensor> call(const std::vector<at::Tensor>& inputs, const std::string& remove,
                             bool alias_outputs, const tfz::detail::FlatFn& fn) {
  torch::PyWarningHandler warnings;  // TORCH_WARN (aliased inputs) -> Python warnings
  try {
    return tfz::detail::call_functionalized(inputs, tfz::parse_remove(remove), alias_outputs, fn);
  } catch (...) {
    warnings.set_in_exception();
    throw;
  }
}

std::optional<std::string> op_name(const std::optional<c10::OperatorHandle>& h) {
  if (!h) return std::nullopt;
  return c10::toString(h->operator_name());
}

py::dict classify(const std::string& name, const std::string& overload) {
  const auto plan = tfz::detail::plan_by_name(name, overload);
  const auto& info = plan.info;
  py::dict d;
  d["kind"] = tfz::detail::to_string(info.kind);
  d["special"] =
      plan.special != nullptr ? std::optional<std::string>(plan.special->name) : std::nullopt;
  d["functional"] = op_name(info.functional_op);
  d["view"] = op_name(info.view_op);
  d["copy"] = op_name(info.copy_op);
  d["has_inverse"] = info.inverse != nullptr;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-functionalize C++ core (see torch_functionalize for the public API)";
  // See Note [Kernel: wrapper subclasses]: what makes a tensor one is Python's to say.
  tfz::detail::set_subclass_predicate([](const at::Tensor& t) {
    py::gil_scoped_acquire gil;
    return py::hasattr(py::cast(t), "__tensor_flatten__");
  });
  py::class_<PyGuard>(m, "_Guard")
      .def(py::init<const std::string&>(), py::arg("remove"))
      .def("close", &PyGuard::close);
  m.def("_call", &call, py::arg("inputs"), py::arg("remove"), py::arg("alias_outputs"),
        py::arg("fn"));
  m.def("_parse_remove", [](const std::string& r) { tfz::parse_remove(r); });
  m.def("_is_functional", &tfz::is_functional);
  m.def("_layer_active", [] { return tfz::detail::current_layer() != nullptr; });
  m.def("_to_functional", py::overload_cast<const at::Tensor&>(&tfz::to_functional));
  m.def("_from_functional", &tfz::from_functional);
  m.def("_sync", &tfz::sync);
  m.def("_registered_op_count", &tfz::detail::registered_op_count);
  m.def("_unboxed_listed_ops", &tfz::detail::unboxed_listed_ops);
  m.def("_unboxed_registered_ops", &tfz::detail::unboxed_registered_ops);
  m.def("_classify", &classify, py::arg("name"), py::arg("overload"));
}
