// tfz::save and tfz::load (public API): a detail::Graph as one IValue tuple in LibTorch's pickle
// format, and back. See Note [Serialize: a captured graph on disk].
#include <torch_functionalize/serialize.h>

#include "core/Graph.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

namespace tfz {

// Note [Serialize: a captured graph on disk]
// A captured graph leaves the process as one IValue: ("tfz-graph", version, values, inputs,
// constants, nodes, outputs, grad mode, input guards), each part a tuple or list of plain
// IValues (ints, strings, bools, int lists, tensors, and each argument's recorded constant as
// recorded), pickled by torch::pickle_save: the same format torch.save writes, tensors (the
// weights) included. An op is stored by its qualified name and overload and found again in the
// dispatcher on load, so a constant keeps the type its schema gives it (a dtype stays the int
// the schema reads as a ScalarType). Input guards travel with the program: the loaded graph
// refuses inputs the program was not captured for, as the original does. Rejected: printing the
// graph as Python code (C++ programs have no Python to read it, and weights would need a second
// file), and TorchScript's archive (deprecated, and it would retrace the ops as a script).

namespace {

constexpr const char* kFormat = "tfz-graph";
constexpr int64_t kVersion = 1;

using detail::GraphArg;

c10::IValue arg_to_ivalue(const GraphArg& a) {
  return c10::ivalue::Tuple::create(
      {static_cast<int64_t>(a.kind), a.constant, c10::IValue(a.values), a.optional_elements});
}

GraphArg arg_from_ivalue(const c10::IValue& v) {
  const auto& e = v.toTupleRef().elements();
  GraphArg a;
  a.kind = static_cast<GraphArg::Kind>(e[0].toInt());
  a.constant = e[1];
  a.values = e[2].toIntVector();
  a.optional_elements = e[3].toBool();
  return a;
}

c10::impl::GenericList args_to_list(const std::vector<GraphArg>& args) {
  c10::impl::GenericList out(c10::AnyType::get());
  for (const auto& a : args) out.push_back(arg_to_ivalue(a));
  return out;
}

std::vector<GraphArg> args_from_list(const c10::IValue& v) {
  std::vector<GraphArg> out;
  for (const auto& a : v.toListRef()) out.push_back(arg_from_ivalue(a));
  return out;
}

}  // namespace

void save(const CapturedGraph& captured, const std::string& path) {
  const detail::Graph& g = captured.graph();
  c10::impl::GenericList values(c10::AnyType::get());
  for (const auto& v : g.values) {
    values.push_back(
        c10::ivalue::Tuple::create({static_cast<int64_t>(v.kind), v.index, v.position, v.element}));
  }
  c10::List<at::Tensor> constants;
  for (const auto& t : g.constants) constants.push_back(t);
  c10::impl::GenericList nodes(c10::AnyType::get());
  for (const auto& n : g.nodes) {
    const auto& name = n.op.operator_name();
    nodes.push_back(c10::ivalue::Tuple::create({name.name, name.overload_name, args_to_list(n.args),
                                                args_to_list(n.returns), n.grad_enabled}));
  }
  c10::impl::GenericList guards(c10::AnyType::get());
  for (const auto& q : g.input_guards) {
    guards.push_back(
        c10::ivalue::Tuple::create({q.defined, c10::IValue(q.sizes), c10::IValue(q.strides),
                                    q.storage_offset, static_cast<int64_t>(q.dtype), q.device.str(),
                                    q.requires_grad, q.conj, q.neg, q.alias_group}));
  }
  const c10::IValue all = c10::ivalue::Tuple::create(
      {std::string(kFormat), kVersion, values, c10::IValue(g.inputs), constants, nodes,
       args_to_list(g.outputs), g.grad_enabled, guards});
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(all);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "tfz::save: the graph holds a value with no pickled form (",
                e.what_without_backtrace(), "); a random op's Generator argument is one.");
  }
  std::ofstream out(path, std::ios::binary);
  TORCH_CHECK(out.good(), "tfz::save: cannot open ", path, " for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TORCH_CHECK(out.good(), "tfz::save: writing ", path, " failed");
}

CapturedGraph load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "tfz::load: cannot open ", path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const c10::IValue all = torch::jit::pickle_load(bytes);
  TORCH_CHECK(all.isTuple() && all.toTupleRef().elements().size() == 9 &&
                  all.toTupleRef().elements()[0].isString() &&
                  all.toTupleRef().elements()[0].toStringRef() == kFormat,
              "tfz::load: ", path, " is not a graph written by tfz::save");
  const auto& e = all.toTupleRef().elements();
  TORCH_CHECK(e[1].toInt() == kVersion, "tfz::load: ", path, " has format version ", e[1].toInt(),
              "; this build reads version ", kVersion);
  auto g = std::make_shared<detail::Graph>();
  for (const auto& v : e[2].toListRef()) {
    const auto& f = v.toTupleRef().elements();
    g->values.push_back({static_cast<detail::ValueSource::Kind>(f[0].toInt()), f[1].toInt(),
                         f[2].toInt(), f[3].toInt()});
  }
  g->inputs = e[3].toIntVector();
  for (const auto& t : e[4].toTensorVector()) g->constants.push_back(t);
  for (const auto& v : e[5].toListRef()) {
    const auto& f = v.toTupleRef().elements();
    const auto& name = f[0].toStringRef();
    const auto& overload = f[1].toStringRef();
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    TORCH_CHECK(op.has_value(), "tfz::load: ", path, " uses the op ", name, ".", overload,
                ", which this process has not registered (register custom ops before loading)");
    g->nodes.push_back({*op, args_from_list(f[2]), args_from_list(f[3]), f[4].toBool()});
  }
  g->outputs = args_from_list(e[6]);
  g->grad_enabled = e[7].toBool();
  for (const auto& v : e[8].toListRef()) {
    const auto& f = v.toTupleRef().elements();
    detail::InputGuard q;
    q.defined = f[0].toBool();
    q.sizes = f[1].toIntVector();
    q.strides = f[2].toIntVector();
    q.storage_offset = f[3].toInt();
    q.dtype = static_cast<at::ScalarType>(f[4].toInt());
    q.device = at::Device(f[5].toStringRef());
    q.requires_grad = f[6].toBool();
    q.conj = f[7].toBool();
    q.neg = f[8].toBool();
    q.alias_group = f[9].toInt();
    g->input_guards.push_back(std::move(q));
  }
  return CapturedGraph(std::move(g));
}

}  // namespace tfz
