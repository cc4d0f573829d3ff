// Reading c10d's script objects (ProcessGroup, ReduceOp) and making a completed Work, through the
// c10d headers torch ships. Nothing here calls a collective. See Note [Collectives: c10d objects].
#include "core/C10dObjects.h"

#include <c10/util/Exception.h>

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
#define TFZ_HAS_C10D 1
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#else
#define TFZ_HAS_C10D 0
#endif

namespace tfz::detail {

// Note [Collectives: c10d objects]
// torch.distributed's in-place ops receive the group and the reduction as script objects
// (c10d::allreduce_(Tensor[] tensors, ProcessGroup process_group, ReduceOp reduce_op, ...)) and
// return a c10d Work. The _c10d_functional ops take the group by its registered name (the string
// c10d's group registry resolves: "0" for the default group, the name new_group registered for a
// subgroup), the reduction as a string, and return tensors. So the kernel needs three things the
// dispatcher does not give: the name and size of a ProcessGroup object, the kind of a ReduceOp,
// and a Work to return. They come from the c10d headers torch ships with every build that has
// torch.distributed (ProcessGroup::getGroupName / getSize, ReduceOp::op_,
// Work::create_from_future); the symbols are in libtorch_cpu, which we link already. Built
// against a torch without them (__has_include fails), the c10d ops do not exist either, and
// has_c10d() says so.
// Rejected: (1) the Python layer supplying the name (a torch function mode or a lookup of
// ProcessGroup.unbox(obj).group_name called back from the kernel): the C++ API would not have
// it, and a Python callback inside a dispatcher kernel needs the GIL on every collective;
// (2) calling the ops through the dispatcher only: the ProcessGroup script class exposes no
// method but __init__, so its name cannot be read that way (ReduceOp's `op` method could be);
// (3) passing the ProcessGroup object itself to the functional op (its group_name argument is
// `Any` in torch 2.13 and accepts one): the graph would hold a baked script object again, and
// could not be saved, exported or replayed in another process.

bool has_c10d() {
  return TFZ_HAS_C10D == 1;
}

namespace {

bool is_script_object_of(const c10::IValue& v, std::string_view class_name) {
  if (!v.isObject()) return false;
  const auto& type = v.toObjectRef().type();
  return type->name().has_value() && type->name()->qualifiedName() == class_name;
}

std::string describe(const c10::IValue& v) {
  if (v.isObject() && v.toObjectRef().type()->name().has_value()) {
    return v.toObjectRef().type()->name()->qualifiedName();
  }
  return v.tagKind();
}

}  // namespace

GroupRef group_ref(std::string_view op_name, const c10::IValue& v) {
  TORCH_CHECK(is_script_object_of(v, "__torch__.torch.classes.c10d.ProcessGroup"),
              "functionalize: ", op_name, ": expected a c10d ProcessGroup as the group; got ",
              describe(v), ".");
#if TFZ_HAS_C10D
  auto group = v.toCustomClass<c10d::ProcessGroup>();
  GroupRef ref{group->getGroupName(), group->getSize()};
  TORCH_CHECK(!ref.name.empty(), "functionalize: ", op_name,
              ": the process group has no registered name, so the functional collective cannot "
              "refer to it. Create groups with torch.distributed.init_process_group / new_group.");
  return ref;
#else
  TORCH_CHECK(false, "functionalize: ", op_name, ": this build has no c10d support.");
#endif
}

std::string reduce_op_name(std::string_view op_name, const c10::IValue& v) {
  TORCH_CHECK(is_script_object_of(v, "__torch__.torch.classes.c10d.ReduceOp"),
              "functionalize: ", op_name, ": expected a c10d ReduceOp; got ", describe(v), ".");
#if TFZ_HAS_C10D
  using Op = c10d::ReduceOp::RedOpType;
  const auto op = v.toCustomClass<c10d::ReduceOp>()->op_;
  switch (op) {
    case Op::SUM:
      return "sum";
    case Op::AVG:
      return "avg";
    case Op::PRODUCT:
      return "product";
    case Op::MIN:
      return "min";
    case Op::MAX:
      return "max";
    case Op::BAND:
      return "band";
    case Op::BOR:
      return "bor";
    case Op::BXOR:
      return "bxor";
    default:
      break;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "functionalize: ", op_name, ": reduce op ", static_cast<int>(op),
      " (PREMUL_SUM or another op with extra data) has no _c10d_functional form. Scale the "
      "tensor first and reduce with ReduceOp.SUM.");
#else
  TORCH_CHECK(false, "functionalize: ", op_name, ": this build has no c10d support.");
#endif
}

c10::IValue completed_work(const std::vector<at::Tensor>& outputs) {
#if TFZ_HAS_C10D
  c10::List<at::Tensor> values;
  values.reserve(outputs.size());
  for (const auto& t : outputs) values.push_back(t);
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  future->markCompleted(c10::IValue(std::move(values)));
  return c10::IValue(c10d::Work::create_from_future(future));
#else
  (void)outputs;
  TORCH_CHECK(false, "functionalize: completed_work: this build has no c10d support.");
#endif
}

}  // namespace tfz::detail
