// PYBIND11_MODULE(_C): exposes the C++ API and diagnostics to Python. No logic lives here; the
// Python package (python/torch_functionalize) composes these calls. _C.pyi lists every binding
// (test_bindings.py checks that it stays complete).
#include <torch_functionalize/functionalize.h>
#include <torch_functionalize/reinplace.h>
#include <torch_functionalize/serialize.h>

#include "api/Call.h"
#include "core/Conversions.h"
#include "core/DispatchKey.h"
#include "core/Graph.h"
#include "core/Layer.h"
#include "core/LayerAutograd.h"
#include "core/MirroredLeaf.h"
#include "core/Recorder.h"
#include "kernels/Registration.h"
#include "kernels/Subclasses.h"
#include "kernels/WatchedDraws.h"

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <cstdint>
#include <cstring>
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

// Python's scope for running an operator on inner tensors with the layer suspended (a
// higher-order operator traced with its branch subgraphs, control_flow.py).
class PyInnerCall {
 public:
  PyInnerCall() : guard_(std::make_unique<tfz::detail::InnerCallGuard>()) {}
  void close() { guard_.reset(); }

 private:
  std::unique_ptr<tfz::detail::InnerCallGuard> guard_;
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

// --- captured graphs, as plain Python data for torch_functionalize.capture to build FX from ---

struct ValueRef {
  int64_t id;
};

// A constant argument as Python sees it: dtypes, layouts and memory formats are ints in an
// IValue, objects in Python.
py::object constant_to_py(const c10::IValue& v, const c10::TypePtr& type) {
  if (v.isInt()) {
    auto kind = type->kind();
    if (const auto* opt = type->castRaw<c10::OptionalType>()) kind = opt->getElementType()->kind();
    const auto i = v.toInt();
    if (kind == c10::TypeKind::ScalarTypeType) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(i))));
    }
    if (kind == c10::TypeKind::LayoutType) {
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(i))));
    }
    if (kind == c10::TypeKind::MemoryFormatType) {
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(i)));
    }
  }
  return torch::jit::toPyObject(v);
}

py::object arg_to_py(const tfz::detail::GraphArg& a, const c10::TypePtr& type) {
  using Kind = tfz::detail::GraphArg::Kind;
  switch (a.kind) {
    case Kind::kConstant:
      return constant_to_py(a.constant, type);
    case Kind::kValue:
      return py::cast(ValueRef{a.values[0]});
    case Kind::kValueList: {
      py::list out;
      for (int64_t id : a.values) {
        out.append(id < 0 ? py::none() : py::cast(ValueRef{id}));
      }
      return out;
    }
  }
  return py::none();
}

// (inputs, constants, nodes, outputs): value ids of the inputs; (id, tensor, is a wrapped Python
// number) per constant;
// (qualified op name, overload, args, kwargs, returns, grad mode) per node, where a tensor is a
// ValueRef, kwarg-only arguments at their defaults are left out, and a return is a ValueRef, a
// list of them, or None (non-tensor); outputs as ValueRefs (None: undefined); the grad mode the
// recording started under.
py::tuple export_graph(const tfz::CapturedGraph& captured) {
  const auto& g = captured.graph();
  py::list constants;
  for (size_t id = 0; id < g.values.size(); ++id) {
    const auto& v = g.values[id];
    if (v.kind == tfz::detail::ValueSource::Kind::kConstant) {
      const auto& t = g.constants[v.index];
      constants.append(py::make_tuple(id, t, t.unsafeGetTensorImpl()->is_wrapped_number()));
    }
  }
  py::list nodes;
  for (const auto& node : g.nodes) {
    const auto& schema = node.op.schema();
    py::list args;
    py::dict kwargs;
    const size_t shown = tfz::detail::num_positional_shown(node);
    for (size_t i = 0; i < node.args.size(); ++i) {
      const auto& sa = schema.arguments()[i];
      const auto& a = node.args[i];
      if (sa.kwarg_only()) {
        if (!tfz::detail::is_default_arg(sa, a)) {
          kwargs[py::str(sa.name())] = arg_to_py(a, sa.real_type());
        }
      } else if (i < shown) {
        args.append(arg_to_py(a, sa.real_type()));
      }
    }
    py::list returns;
    for (const auto& r : node.returns) {
      returns.append(r.kind == tfz::detail::GraphArg::Kind::kConstant ? py::none()
                                                                      : arg_to_py(r, nullptr));
    }
    nodes.append(py::make_tuple(schema.name(), schema.overload_name(), py::tuple(args), kwargs,
                                returns, node.grad_enabled));
  }
  py::list outputs;
  for (const auto& o : g.outputs) outputs.append(arg_to_py(o, nullptr));
  return py::make_tuple(g.inputs, constants, nodes, outputs, g.grad_enabled);
}

// (sizes, strides, storage offset, dtype, device, requires_grad) of each input a graph was
// captured with (None for an undefined one): what a graph loaded from a file is called with.
py::list input_specs(const tfz::CapturedGraph& captured) {
  py::list out;
  for (const auto& q : captured.graph().input_guards) {
    if (!q.defined) {
      out.append(py::none());
      continue;
    }
    out.append(py::make_tuple(q.sizes, q.strides, q.storage_offset,
                              py::reinterpret_borrow<py::object>(
                                  reinterpret_cast<PyObject*>(torch::getTHPDtype(q.dtype))),
                              q.device.str(), q.requires_grad));
  }
  return out;
}

// A captured graph's input guards, held by the FX module capture returns.
struct InputGuards {
  std::vector<tfz::detail::InputGuard> guards;
  void check(const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names) const {
    tfz::detail::check_input_guards(guards, inputs, names);
  }
};

tfz::CapturedGraph capture(const std::vector<at::Tensor>& inputs, const std::string& remove,
                           const tfz::TensorFn& fn) {
  torch::PyWarningHandler warnings;
  try {
    return tfz::capture(fn, inputs, tfz::parse_remove(remove));
  } catch (...) {
    warnings.set_in_exception();
    throw;
  }
}

// The Python observer of Note [Graphs: generator state set outside the dispatcher]; leaked on
// purpose (a py::object destroyed after the interpreter would crash at exit).
py::object* draw_observer = nullptr;

std::string observe_draw(const at::Generator& generator, bool before) {
  py::gil_scoped_acquire gil;
  if (draw_observer == nullptr) return {};
  try {
    auto py_generator = py::reinterpret_steal<py::object>(THPGenerator_Wrap(generator));
    const auto key = reinterpret_cast<std::uintptr_t>(generator.unsafeGetGeneratorImpl());
    return (*draw_observer)(py_generator, key, before).cast<std::string>();
  } catch (py::error_already_set& e) {
    return std::string("functionalize: the random generator's observer failed: ") + e.what();
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-functionalize C++ core (see torch_functionalize for the public API)";
  // See Note [Kernel: wrapper subclasses]: what makes a tensor one is Python's to say.
  tfz::detail::set_subclass_predicate([](const at::Tensor& t) {
    py::gil_scoped_acquire gil;
    return py::hasattr(py::cast(t), "__tensor_flatten__");
  });
  m.def("_generator_key", [](py::handle generator) {
    return reinterpret_cast<std::uintptr_t>(
        THPGenerator_Unwrap(generator.ptr()).unsafeGetGeneratorImpl());
  });
  // Two generator states (contiguous CPU bytes) compared without an op a graph would record.
  m.def("_same_state", [](const at::Tensor& a, const at::Tensor& b) {
    return a.nbytes() == b.nbytes() &&
           std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
  });
  m.def("_set_draw_observer", [](py::object observer) {
    if (draw_observer == nullptr) draw_observer = new py::object();
    *draw_observer = std::move(observer);
    tfz::detail::set_draw_observer(&observe_draw);
  });
  py::class_<PyGuard>(m, "_Guard")
      .def(py::init<const std::string&>(), py::arg("remove"))
      .def("close", &PyGuard::close);
  py::class_<PyInnerCall>(m, "_InnerCall").def(py::init<>()).def("close", &PyInnerCall::close);
  m.def("_layer_removes_views", [] {
    const auto* layer = tfz::detail::current_layer();
    return layer != nullptr && !layer->reapply_views;
  });
  m.def("_call", &call, py::arg("inputs"), py::arg("remove"), py::arg("alias_outputs"),
        py::arg("fn"));
  py::class_<ValueRef>(m, "_ValueRef").def_readonly("id", &ValueRef::id);
  py::class_<tfz::CapturedGraph>(m, "_CapturedGraph")
      .def("__call__", &tfz::CapturedGraph::operator())
      .def("__str__", &tfz::CapturedGraph::str)
      .def("num_nodes", &tfz::CapturedGraph::num_nodes)
      .def("export", &export_graph)
      .def("input_guards",
           [](const tfz::CapturedGraph& c) { return InputGuards{c.graph().input_guards}; })
      .def("input_specs", &input_specs);
  py::class_<InputGuards>(m, "_InputGuards").def("check", &InputGuards::check);
  m.def("_input_guards", [](const std::vector<at::Tensor>& inputs) {
    return InputGuards{tfz::detail::record_input_guards(inputs)};
  });
  m.def("_capture", &capture, py::arg("inputs"), py::arg("remove"), py::arg("fn"));
  m.def("_save_graph", &tfz::save, py::arg("graph"), py::arg("path"));
  m.def("_load_graph", &tfz::load, py::arg("path"));
  m.def("_reinplace_graph", [](const tfz::CapturedGraph& graph) {
    std::vector<std::string> explain;
    auto result = tfz::reinplace(graph, &explain);
    return std::make_pair(result, explain);
  });
  m.def("_parse_remove", [](const std::string& r) { tfz::parse_remove(r); });
  m.def("_is_functional", &tfz::is_functional);
  m.def("_layer_active", [] { return tfz::detail::current_layer() != nullptr; });
  m.def("_layer_id", [] {
    const auto* layer = tfz::detail::current_layer();
    return layer != nullptr ? layer->id : int64_t{0};
  });
  // See Note [Control flow: closures].
  m.def("_lift_closures", &tfz::detail::lift_closures);
  m.def("_is_layer_wrapper", &tfz::detail::is_current_layer_wrapper);
  m.def("_mirrored_leaf", [](const at::Tensor& t) -> std::optional<at::Tensor> {
    at::Tensor leaf = tfz::detail::mirrored_leaf(t);
    if (!leaf.defined()) return std::nullopt;
    return leaf;
  });
  m.def("_note_foreign_wrapper", &tfz::detail::note_foreign_wrapper);
  m.def("_take_foreign_wrapper", []() -> std::optional<at::Tensor> {
    at::Tensor t = tfz::detail::take_foreign_wrapper();
    if (!t.defined()) return std::nullopt;
    return t;
  });
  m.def("_ops_are_recorded", &tfz::detail::ops_are_recorded);
  m.def("_note_traced_plain_output", &tfz::detail::note_traced_plain_output);
  m.def("_dispatch_keys", [] {
    using tfz::detail::kAutogradKey, tfz::detail::kBackendKey, tfz::detail::kFactoryKey;
    return std::vector<int64_t>{static_cast<int64_t>(kAutogradKey),
                                static_cast<int64_t>(kBackendKey),
                                static_cast<int64_t>(kFactoryKey)};
  });
  m.def("_to_functional", py::overload_cast<const at::Tensor&>(&tfz::to_functional));
  m.def("_from_functional", &tfz::from_functional);
  m.def("_sync", &tfz::sync);
  m.def("_registered_op_count", &tfz::detail::registered_op_count);
  m.def("_unboxed_listed_ops", &tfz::detail::unboxed_listed_ops);
  m.def("_unboxed_registered_ops", &tfz::detail::unboxed_registered_ops);
  m.def("_classify", &classify, py::arg("name"), py::arg("overload"));
}
