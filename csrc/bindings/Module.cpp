// PYBIND11_MODULE(_C): exposes the public C++ API to Python. No logic lives here; the Python
// package (python/torch_functionalize) composes these calls.
#include <torch_functionalize/functionalize.h>

#include "core/Inputs.h"
#include "kernels/Kernels.h"

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

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-functionalize C++ core (see torch_functionalize for the public API)";
  py::class_<PyGuard>(m, "_Guard")
      .def(py::init<const std::string&>(), py::arg("remove"))
      .def("close", &PyGuard::close);
  m.def("_parse_remove", [](const std::string& r) { tfz::parse_remove(r); });
  m.def("_is_functional", &tfz::is_functional);
  m.def("_to_functional", py::overload_cast<const at::Tensor&>(&tfz::to_functional));
  m.def("_to_functional_list", [](const std::vector<at::Tensor>& ts) {
    torch::PyWarningHandler warnings;  // TORCH_WARN (aliased inputs) -> Python warnings
    return tfz::to_functional(ts);
  });
  m.def("_from_functional", &tfz::from_functional);
  m.def("_sync", &tfz::sync);
  m.def("_has_data_mutation", &tfz::has_data_mutation);
  m.def("_has_metadata_mutation", &tfz::has_metadata_mutation);
  m.def("_propagate_input_mutation", &tfz::propagate_input_mutation);
  m.def("_propagate_input_mutations", &tfz::propagate_input_mutations);
  m.def("_wrap_fresh", &tfz::wrap_fresh);
  m.def("_unwrap_output", &tfz::detail::unwrap_output, py::arg("out"), py::arg("originals"),
        py::arg("wrappers"), py::arg("alias_inputs"));
  m.def("_registered_op_count", &tfz::detail::registered_op_count);
  m.def("_unboxed_listed_ops", &tfz::detail::unboxed_listed_ops);
  m.def("_unboxed_registered_ops", &tfz::detail::unboxed_registered_ops);
  m.def("_classify", [](const std::string& name, const std::string& overload) {
    static const char* kinds[] = {"functional", "view", "inplace_view", "mutable", "unsupported"};
    auto info = tfz::detail::classify_by_name(name, overload);
    auto op_name = [](const std::optional<c10::OperatorHandle>& h) -> std::optional<std::string> {
      if (!h) return std::nullopt;
      const auto& n = h->operator_name();
      return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
    };
    py::dict d;
    d["kind"] = kinds[static_cast<int>(info.kind)];
    d["functional"] = op_name(info.functional_op);
    d["view"] = op_name(info.view_op);
    d["copy"] = op_name(info.copy_op);
    d["has_inverse"] = info.inverse != nullptr;
    return d;
  });
}
