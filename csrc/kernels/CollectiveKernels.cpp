// The c10d ops torch.distributed calls (c10d::allreduce_, broadcast_, _allgather_base_, ...) on
// wrappers: each in-place collective runs as its _c10d_functional op plus wait_tensor on the
// current values, and the results are written back like any mutation; collectives with no
// functional form raise. The row that routes c10d ops here is in SpecialOps.cpp.
// See Note [Collectives: in-place c10d ops].
#include "kernels/SpecialOps.h"

#include "core/C10dObjects.h"
#include "core/Conversions.h"
#include "core/Recorder.h"

#include <ATen/Functions.h>
#include <ATen/core/class_type.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>

#include <array>
#include <mutex>
#include <string_view>
#include <unordered_map>

namespace tfz::detail {

// Note [Collectives: in-place c10d ops]
// dist.all_reduce(y) reaches the dispatcher as
//   c10d::allreduce_([y], <ProcessGroup>, <ReduceOp SUM>, None, False) -> ([y], <Work>)
// which writes y in place, carries the group and the reduction as script objects, and is not
// annotated as a write (Tensor[] tensors, no (a!)), so the generic plan would see a functional op.
// Here it becomes, on y's current value,
//   y1 = _c10d_functional.all_reduce(y, "sum", "0")
//   y2 = _c10d_functional.wait_tensor(y1)            # y := y2 (write_back)
// and y2 is written back through the ordinary mutation path (replace_, commit to the alias
// storage), so a collective on a view updates its base and every alias, and on an input it lands
// in the copy_ epilogue. The group is passed by its registered name and size
// (Note [Collectives: c10d objects]). The table kCollectives pairs each in-place op with its
// functional form:
//   allreduce_                          all_reduce
//   allreduce_coalesced_                all_reduce_coalesced
//   broadcast_                          broadcast
//   _allgather_base_                    all_gather_into_tensor (viewed as the output's shape)
//   allgather_                          all_gather_into_tensor, split into the output list
//   allgather_into_tensor_coalesced_    all_gather_into_tensor_coalesced
//   _reduce_scatter_base_               reduce_scatter_tensor
//   reduce_scatter_                     reduce_scatter_tensor of the inputs concatenated
//   reduce_scatter_tensor_coalesced_    reduce_scatter_tensor_coalesced
//   alltoall_base_                      all_to_all_single (even splits made explicit)
//   alltoall_                           all_to_all_single of the flattened inputs, split back
// Every other c10d op that takes a ProcessGroup (reduce_, gather_, scatter_, send, recv_,
// barrier, ...) raises NotImplementedError naming the op and what to use instead (kNoFunctional),
// so no graph silently keeps an in-place collective or a script object. The per-call timeout is
// not carried: the functional ops use the group's default timeout.
// Rejected: tracing c10d ops through as they are (what make_fx and torch.func do): the graph keeps
// the write, the ProcessGroup object and an unwaited Work, and replaying it races the reduction
// against the reads that follow. Rejected: a Python torch function mode rewriting dist.* calls
// (what non-strict export does): C++ callers and ProcessGroup methods called directly would miss
// it.

// Note [Collectives: where wait_tensor sits]
// The functional op only launches the collective; _c10d_functional.wait_tensor is what makes its
// result valid. The kernel emits wait_tensor right after the collective, before the value is
// written back or read by anything, whatever async_op says. So the wait is never later than
// eager's (eager waits in dist.* for async_op=False, and at work.wait() otherwise) and the graph
// needs no Work. The kernel returns a Work that is already completed (Work::create_from_future
// on a finished future holding the written tensors), so a later work.wait() is harmless and
// work.result() gives the outputs. The cost is overlap: communication no longer runs behind the
// computation between the call and work.wait(); a compiler that reorders wait_tensor (as
// Inductor does) can win it back on the functional graph.
// Rejected: keeping the wait where the user waits (a Work wrapper whose wait() emits the
// wait_tensor): between the call and the wait, reads of the tensor would see either the old or
// the new value depending on the wrapper's bookkeeping, and a Work that is never waited (legal
// eagerly when the tensor is never read) would leave an unwaited collective in the graph.

// Note [Collectives: in place when unobserved]
// all_reduce on a gradient is the hot path of data-parallel training, and the functional form
// costs a full copy of the buffer per call (all_reduce clones its input before reducing the clone;
// the same cost upstream's functional collectives have, pytorch/pytorch#134388). When the written
// tensors are contiguous bases that nothing else can observe and nothing traces (the rule of
// can_write_inner_in_place, see Note [Kernel: in-place on the inner value]), allreduce_,
// broadcast_ and allreduce_coalesced_ run their in-place functional forms
// (_c10d_functional.all_reduce_, broadcast_, all_reduce_coalesced_) plus wait_tensor on the inner
// values instead, and the value becomes its storage's new base: eager's memory traffic, and no
// graph can see the difference because none is being recorded. Outputs of other shapes (all_gather,
// reduce_scatter, all_to_all) and anything traced, viewed or aliased take the functional path.
// Inputs of the function never qualify (their caller holds them), so they pay the clone and the
// copy_ epilogue. Rejected: the functional form always (a copy of every gradient bucket per step).

namespace {

using Stack = torch::jit::Stack;

// The arguments of one c10d call, by schema name.
class CallArgs {
 public:
  CallArgs(const c10::OperatorHandle& op, Stack* stack, bool views)
      : schema_(op.schema()), name_(c10::toString(op.operator_name())), views_(views) {
    const size_t n = schema_.arguments().size();
    values_.assign(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    torch::jit::drop(*stack, n);
  }

  const std::string& op_name() const { return name_; }
  /// remove="mutations": reshaping the collective's result may use views (else *_copy ops).
  bool views() const { return views_; }
  /// Run the in-place functional op on the inner values.
  /// See Note [Collectives: in place when unobserved].
  bool in_place() const { return in_place_; }
  void set_in_place(bool in_place) { in_place_ = in_place; }

  const c10::IValue& operator[](std::string_view arg) const {
    const auto index = schema_.argumentIndexWithName(arg);
    TORCH_INTERNAL_ASSERT(index.has_value(), name_, " has no argument '", arg, "'");
    return values_[*index];
  }

  /// Every tensor of argument `arg` (a Tensor, Tensor[] or Tensor[][]), in order.
  std::vector<at::Tensor> tensors(std::string_view arg) const {
    std::vector<at::Tensor> out;
    for_each_tensor((*this)[arg], [&](const at::Tensor& t) { out.push_back(t); });
    return out;
  }

  GroupRef group() const { return group_ref(name_, (*this)["process_group"]); }
  std::string reduce_op() const { return reduce_op_name(name_, (*this)["reduce_op"]); }

 private:
  const c10::FunctionSchema& schema_;
  std::string name_;
  bool views_;
  bool in_place_ = false;
  std::vector<c10::IValue> values_;
};

// `t` (contiguous) with sizes `sizes`: a view, or view_copy when views are removed.
// Symbolic sizes throughout, so make_fx(tracing_mode="symbolic") traces these too.
at::Tensor reshaped(const CallArgs& a, const at::Tensor& t, c10::SymIntArrayRef sizes) {
  return a.views() ? t.view_symint(sizes) : at::view_copy_symint(t, sizes);
}

// The first dimension of `t` cut into pieces of `sizes`: split_with_sizes or its *_copy.
std::vector<at::Tensor> split_rows(const CallArgs& a, const at::Tensor& t,
                                   c10::SymIntArrayRef sizes) {
  return a.views() ? t.split_with_sizes_symint(sizes) : at::split_with_sizes_copy_symint(t, sizes);
}

const c10::OperatorHandle& functional_op(const char* name) {
  static std::mutex mutex;
  static std::unordered_map<std::string, c10::OperatorHandle> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto handle = c10::Dispatcher::singleton().findOp({name, ""});
    TORCH_CHECK_NOT_IMPLEMENTED(handle.has_value(), "functionalize: ", name,
                                " is not registered in this torch, so the collective cannot be "
                                "functionalized here (see docs/distributed.md for the torch "
                                "versions). Call it outside the function.");
    it = cache.emplace(name, *handle).first;
  }
  return it->second;
}

// Calls a _c10d_functional op (below our key: a tracer records it) and waits for every tensor it
// returns. See Note [Collectives: where wait_tensor sits].
std::vector<at::Tensor> collective(const char* name, Stack args) {
  functional_op(name).callBoxed(args);
  std::vector<at::Tensor> results;
  for_each_tensor(args.at(0), [&](const at::Tensor& t) { results.push_back(t); });
  const auto& wait = functional_op("_c10d_functional::wait_tensor");
  for (auto& t : results) {
    Stack w{t};
    wait.callBoxed(w);
    t = w.at(0).toTensor();
  }
  return results;
}

c10::List<at::Tensor> as_list(const std::vector<at::Tensor>& ts) {
  c10::List<at::Tensor> list;
  list.reserve(ts.size());
  for (const auto& t : ts) list.push_back(t);
  return list;
}

std::vector<at::Tensor> contiguous(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.contiguous());
  return out;
}

void check_one_tensor(const CallArgs& a, const std::vector<at::Tensor>& ts) {
  TORCH_CHECK_NOT_IMPLEMENTED(ts.size() == 1, "functionalize: ", a.op_name(),
                              ": expected one tensor per call (what torch.distributed passes); "
                              "got ",
                              ts.size(), ". Call the collective once per tensor.");
}

// One entry of kCollectives: computes the new values of the written tensors from the current
// values `in` of the read argument (already synced and unwrapped).
using Compute = std::vector<at::Tensor> (*)(const CallArgs& a, const std::vector<at::Tensor>& in,
                                            const std::vector<at::Tensor>& out);

std::vector<at::Tensor> allreduce(const CallArgs& a, const std::vector<at::Tensor>& in,
                                  const std::vector<at::Tensor>& /*out*/) {
  check_one_tensor(a, in);
  TORCH_CHECK_NOT_IMPLEMENTED(a["sparse_indices"].isNone(), "functionalize: ", a.op_name(),
                              ": sparse all_reduce has no _c10d_functional form. Reduce the dense "
                              "tensor, or call it outside the function.");
  return collective(a.in_place() ? "_c10d_functional::all_reduce_" : "_c10d_functional::all_reduce",
                    {in[0], a.reduce_op(), a.group().name});
}

std::vector<at::Tensor> allreduce_coalesced(const CallArgs& a, const std::vector<at::Tensor>& in,
                                            const std::vector<at::Tensor>& /*out*/) {
  return collective(a.in_place() ? "_c10d_functional::all_reduce_coalesced_"
                                 : "_c10d_functional::all_reduce_coalesced",
                    {as_list(in), a.reduce_op(), a.group().name});
}

std::vector<at::Tensor> broadcast(const CallArgs& a, const std::vector<at::Tensor>& in,
                                  const std::vector<at::Tensor>& /*out*/) {
  check_one_tensor(a, in);
  TORCH_CHECK_NOT_IMPLEMENTED(a["root_tensor"].toInt() == 0, "functionalize: ", a.op_name(),
                              ": root_tensor must be 0; got ", a["root_tensor"].toInt(), ".");
  return collective(a.in_place() ? "_c10d_functional::broadcast_" : "_c10d_functional::broadcast",
                    {in[0], a["root_rank"], a.group().name});
}

std::vector<at::Tensor> allgather_base(const CallArgs& a, const std::vector<at::Tensor>& in,
                                       const std::vector<at::Tensor>& /*out*/) {
  const auto g = a.group();
  return collective("_c10d_functional::all_gather_into_tensor",
                    {in[0].contiguous(), g.size, g.name});
}

std::vector<at::Tensor> allgather_coalesced(const CallArgs& a, const std::vector<at::Tensor>& in,
                                            const std::vector<at::Tensor>& /*out*/) {
  const auto g = a.group();
  return collective("_c10d_functional::all_gather_into_tensor_coalesced",
                    {as_list(contiguous(in)), g.size, g.name});
}

// dist.all_gather(list, t): the gathered tensor, one slice of the first dimension per rank.
std::vector<at::Tensor> allgather_list(const CallArgs& a, const std::vector<at::Tensor>& in,
                                       const std::vector<at::Tensor>& out) {
  check_one_tensor(a, in);
  const auto g = a.group();
  TORCH_CHECK_NOT_IMPLEMENTED(static_cast<int64_t>(out.size()) == g.size,
                              "functionalize: ", a.op_name(), ": expected one output list of ",
                              g.size, " tensors; got ", out.size(), " tensors.");
  at::Tensor flat = reshaped(a, in[0].contiguous(), {-1});
  at::Tensor gathered =
      collective("_c10d_functional::all_gather_into_tensor", {flat, g.size, g.name})[0];
  return split_rows(a, gathered, std::vector<c10::SymInt>(out.size(), flat.sym_numel()));
}

std::vector<at::Tensor> reduce_scatter_base(const CallArgs& a, const std::vector<at::Tensor>& in,
                                            const std::vector<at::Tensor>& /*out*/) {
  const auto g = a.group();
  return collective("_c10d_functional::reduce_scatter_tensor",
                    {in[0].contiguous(), a.reduce_op(), g.size, g.name});
}

std::vector<at::Tensor> reduce_scatter_coalesced(const CallArgs& a,
                                                 const std::vector<at::Tensor>& in,
                                                 const std::vector<at::Tensor>& /*out*/) {
  const auto g = a.group();
  return collective("_c10d_functional::reduce_scatter_tensor_coalesced",
                    {as_list(contiguous(in)), a.reduce_op(), g.size, g.name});
}

// dist.reduce_scatter(out, list): the inputs stacked, reduced, this rank's slice kept.
std::vector<at::Tensor> reduce_scatter_list(const CallArgs& a, const std::vector<at::Tensor>& in,
                                            const std::vector<at::Tensor>& out) {
  const auto g = a.group();
  TORCH_CHECK_NOT_IMPLEMENTED(out.size() == 1 && static_cast<int64_t>(in.size()) == g.size,
                              "functionalize: ", a.op_name(), ": expected one output and ", g.size,
                              " inputs; got ", out.size(), " and ", in.size(), ".");
  std::vector<at::Tensor> flat;
  for (const auto& t : in) flat.push_back(reshaped(a, t.contiguous(), {-1}));
  return collective("_c10d_functional::reduce_scatter_tensor",
                    {at::cat(flat), a.reduce_op(), g.size, g.name});
}

std::vector<c10::SymInt> even_splits(const c10::IValue& given, const c10::SymInt& dim0,
                                     int64_t group_size) {
  std::vector<c10::SymInt> splits;
  for (int64_t s : given.toIntVector()) splits.emplace_back(s);
  if (splits.empty()) splits.assign(static_cast<size_t>(group_size), dim0 / group_size);
  return splits;
}

std::vector<at::Tensor> alltoall_base(const CallArgs& a, const std::vector<at::Tensor>& in,
                                      const std::vector<at::Tensor>& out) {
  const auto g = a.group();
  const c10::SymInt in0 = in[0].dim() == 0 ? c10::SymInt(1) : in[0].sym_size(0);
  const c10::SymInt out0 = out[0].dim() == 0 ? c10::SymInt(1) : out[0].sym_size(0);
  return collective("_c10d_functional::all_to_all_single",
                    {in[0].contiguous(), even_splits(a["output_split_sizes"], out0, g.size),
                     even_splits(a["input_split_sizes"], in0, g.size), g.name});
}

// dist.all_to_all(out_list, in_list): one flat all_to_all_single, split back per output.
std::vector<at::Tensor> alltoall_list(const CallArgs& a, const std::vector<at::Tensor>& in,
                                      const std::vector<at::Tensor>& out) {
  const auto g = a.group();
  std::vector<at::Tensor> flat;
  std::vector<c10::SymInt> in_splits, out_splits;
  for (const auto& t : in) {
    flat.push_back(reshaped(a, t.contiguous(), {-1}));
    in_splits.push_back(t.sym_numel());
  }
  for (const auto& t : out) {
    out_splits.push_back(t.sym_numel());
  }
  at::Tensor received = collective("_c10d_functional::all_to_all_single",
                                   {at::cat(flat), out_splits, in_splits, g.name})[0];
  return split_rows(a, received, out_splits);
}

struct Collective {
  const char* name;     // the c10d op
  const char* read;     // the argument the functional form reads
  const char* written;  // the argument the op writes (Tensor, Tensor[] or Tensor[][])
  Compute compute;
  bool has_in_place;  // compute has an in-place functional form (reads and writes one argument)
};

constexpr std::array<Collective, 11> kCollectives{{
    {"c10d::allreduce_", "tensors", "tensors", &allreduce, true},
    {"c10d::allreduce_coalesced_", "tensors", "tensors", &allreduce_coalesced, true},
    {"c10d::broadcast_", "tensors", "tensors", &broadcast, true},
    {"c10d::_allgather_base_", "input_tensor", "output_tensor", &allgather_base, false},
    {"c10d::allgather_", "input_tensors", "output_tensors", &allgather_list, false},
    {"c10d::allgather_into_tensor_coalesced_", "inputs", "outputs", &allgather_coalesced, false},
    {"c10d::_reduce_scatter_base_", "input_tensor", "output_tensor", &reduce_scatter_base, false},
    {"c10d::reduce_scatter_", "input_tensors", "output_tensors", &reduce_scatter_list, false},
    {"c10d::reduce_scatter_tensor_coalesced_", "inputs", "outputs", &reduce_scatter_coalesced,
     false},
    {"c10d::alltoall_base_", "input", "output", &alltoall_base, false},
    {"c10d::alltoall_", "input_tensors", "output_tensors", &alltoall_list, false},
}};

// c10d ops with no functional form, and what to use instead.
struct NoFunctional {
  const char* name;
  const char* instead;
};

constexpr std::array<NoFunctional, 10> kNoFunctional{{
    {"c10d::reduce_",
     "use dist.all_reduce (every rank gets the result), or "
     "torch.distributed._functional_collectives.all_reduce"},
    {"c10d::gather_", "use dist.all_gather_into_tensor (every rank gets the result)"},
    {"c10d::gather_into_tensor_", "use dist.all_gather_into_tensor (every rank gets the result)"},
    {"c10d::scatter_",
     "use dist.broadcast of the whole tensor and keep this rank's slice, or "
     "dist.all_to_all_single"},
    {"c10d::allgather_coalesced_", "use dist.all_gather_into_tensor once per tensor"},
    {"c10d::send",
     "point-to-point calls are not functionalized (send and isend are one op, so where eager "
     "waits is unknown); use dist.all_to_all_single, or call send/recv outside the function"},
    {"c10d::recv_",
     "point-to-point calls are not functionalized (recv and irecv are one op, so where eager "
     "waits is unknown); use dist.all_to_all_single, or call send/recv outside the function"},
    {"c10d::recv_any_source_", "use dist.all_to_all_single, or call recv outside the function"},
    {"c10d::barrier", "call dist.barrier outside the function (it has no functional form)"},
    {"c10d::monitored_barrier_", "call dist.monitored_barrier outside the function"},
}};

bool takes_process_group(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    const auto cls = arg.type()->cast<c10::ClassType>();
    if (cls && cls->name().has_value() &&
        cls->name()->qualifiedName() == "__torch__.torch.classes.c10d.ProcessGroup") {
      return true;
    }
  }
  return false;
}

const Collective* find_collective(std::string_view name) {
  for (const auto& row : kCollectives) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

[[noreturn]] void refuse(const std::string& op_name) {
  const char* instead =
      "use the functional API (torch.distributed._functional_collectives), or call the "
      "collective outside the function";
  for (const auto& row : kNoFunctional) {
    if (op_name == row.name) instead = row.instead;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "functionalize: ", op_name,
                              ": this collective has no functional form that functionalize can "
                              "emit, and running it in place would leave a mutation and a "
                              "ProcessGroup object in the program. Instead, ",
                              instead, ".");
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

}  // namespace

// Note [Collectives: captured tensors]
// A collective whose tensors are all plain (a parameter, buffer or global that the function
// captures instead of taking as an argument) has no wrapper to write back into. Like every op on
// plain tensors it passes through and runs in place, as eager does. Under a tracer (a dispatch
// mode on the thread: make_fx, export) that would record the in-place c10d op with its
// ProcessGroup object, the graph this row exists to prevent, so there it raises instead, naming
// the op and the remedy. Rejected: lifting the tensor into a wrapper, as views of captured
// tensors are (see Note [Kernel: views of captured tensors]): the reduced value must reach the
// captured tensor, and no graph output carries it there.
void check_plain_collective(const c10::OperatorHandle& op) {
  if (!ops_are_recorded()) return;
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "functionalize: ", c10::toString(op.operator_name()),
      ": every tensor of this collective was created outside the function (a parameter, buffer "
      "or global), so under a tracer it would stay an in-place collective on a constant, with "
      "the ProcessGroup baked into the graph. Pass the tensor to the function as an input.");
}

bool is_c10d_collective(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name().name;
  return name.rfind("c10d::", 0) == 0 && takes_process_group(op.schema());
}

void collective_kernel(const OpInfo& /*info*/, const c10::OperatorHandle& op, Stack* stack,
                       const Layer& layer) {
  const std::string op_name = op.operator_name().name;
  const Collective* row = find_collective(op_name);
  if (row == nullptr) refuse(c10::toString(op.operator_name()));
  CallArgs a(op, stack, layer.reapply_views);

  const std::vector<at::Tensor> written = a.tensors(row->written);
  for (const auto& t : written) check_writable(a.op_name(), row->written, t);
  a.set_in_place(row->has_in_place && !written.empty() &&
                 std::all_of(written.begin(), written.end(), [](const at::Tensor& t) {
                   return can_write_inner_in_place(t) &&
                          unsafe_get_impl(t)->value().is_contiguous();
                 }));

  InnerCallGuard guard;  // syncs replay views below our key; write_back runs under it too
  std::vector<at::Tensor> in;
  for (const auto& t : a.tensors(row->read)) in.push_back(sync_and_unwrap(t));
  std::vector<at::Tensor> out_values;
  out_values.reserve(written.size());
  for (const auto& t : written) out_values.push_back(sync_and_unwrap(t));
  std::vector<at::Tensor> values = row->compute(a, in, out_values);
  TORCH_INTERNAL_ASSERT(values.size() == written.size(), a.op_name(), ": computed ", values.size(),
                        " values for ", written.size(), " written tensors");
  if (a.in_place()) {
    for (const auto& t : written) commit_written_in_place(t);
    values.clear();
  }
  // The functional forms return flat layouts (all_gather: the first dimension times the group
  // size); eager writes the same elements into the output's own shape, which must hold as many.
  for (size_t i = 0; i < values.size(); ++i) {
    TORCH_CHECK(values[i].sym_numel() == written[i].sym_numel(), "functionalize: ", a.op_name(),
                ": the output tensor has ", written[i].sym_numel(), " elements (sizes ",
                written[i].sym_sizes(), ") where the collective produces ", values[i].sym_numel(),
                " (sizes ", values[i].sym_sizes(), "). Pass an output of the collective's size.");
    TORCH_CHECK(values[i].scalar_type() == written[i].scalar_type(), "functionalize: ", a.op_name(),
                ": the output tensor has dtype ", written[i].scalar_type(), " and the input ",
                values[i].scalar_type(), "; they must match.");
    if (values[i].sym_sizes() != written[i].sym_sizes())
      values[i] = reshaped(a, values[i], written[i].sym_sizes());
  }
  for (size_t i = 0; i < values.size(); ++i) write_back(written[i], values[i]);

  for (const auto& ret : op.schema().returns()) {
    if (ret.type()->kind() == c10::TypeKind::ClassType) {
      torch::jit::push(*stack, completed_work(written));
    } else {
      torch::jit::push(*stack, a[row->written]);
    }
  }
}

}  // namespace tfz::detail
