// A functional program recorded by capture (core/Recorder.h): inputs, constants, ATen op nodes in
// program order and outputs, over numbered values. Knows how to print itself and run through the
// dispatcher (its passes: core/GraphPasses.h); knows nothing of registration or of Python.
#pragma once

#include "core/InputGuards.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tfz::detail {

/// One argument (or return) of a node: a constant, a value, or a list of values (-1: None).
struct GraphArg {
  enum class Kind : uint8_t { kConstant, kValue, kValueList };
  Kind kind = Kind::kConstant;
  c10::IValue constant;            // kConstant
  std::vector<int64_t> values;     // kValue: one id; kValueList: ids, -1 for a None element
  bool optional_elements = false;  // kValueList of Tensor?[] (index.Tensor) rather than Tensor[]
};

/// One ATen op call. `returns` holds one entry per schema return: a value (Tensor), a value list
/// (Tensor[]) or a constant (a non-tensor result, kept only for printing).
struct GraphNode {
  c10::OperatorHandle op;
  std::vector<GraphArg> args;  // one per schema argument, in schema order
  std::vector<GraphArg> returns;
  // Whether grad mode was on when the op ran: a graph replays each op in its mode, relative to
  // the mode it was recorded under (Note [Capture: grad mode]).
  bool grad_enabled = true;
};

/// Where a value comes from.
struct ValueSource {
  enum class Kind : uint8_t { kInput, kConstant, kNode };
  Kind kind;
  int64_t index;         // input index, constant index or node index
  int64_t position = 0;  // kNode: schema return index
  int64_t element = -1;  // kNode: index into a Tensor[] return, -1 for a Tensor return
};

struct Graph {
  std::vector<ValueSource> values;  // by value id
  std::vector<int64_t> inputs;      // value ids of the inputs, in order
  std::vector<at::Tensor> constants;
  std::vector<GraphNode> nodes;
  std::vector<GraphArg> outputs;  // kValue, or kConstant for an undefined output
  bool grad_enabled = true;       // the grad mode the recording started under
  // What the program specialized on in its inputs (Note [Capture: guards on inputs]).
  std::vector<InputGuard> input_guards;
};

/// True if `arg` is a constant equal to its schema default.
bool is_default_arg(const c10::Argument& schema_arg, const GraphArg& arg);

/// How many positional arguments of `node` to show: trailing ones at their defaults are left out,
/// as are keyword-only ones at their defaults (printing, and FX as make_fx writes its nodes).
size_t num_positional_shown(const GraphNode& node);

/// One line per node, `%3 = aten::add.Tensor(%0, 1)`, then the outputs.
std::string to_string(const Graph& graph);

/// Runs the graph's nodes through the dispatcher on `inputs` and returns its outputs. Inputs the
/// program mutated are written by the graph's epilogue, as by the functionalized call. Raises
/// first unless the inputs pass the graph's input guards.
std::vector<at::Tensor> run_graph(const Graph& graph, const std::vector<at::Tensor>& inputs);

}  // namespace tfz::detail
