// What the engine reads from, and makes for, torch.distributed's script objects: the registered
// name and size of a ProcessGroup, the _c10d_functional spelling of a ReduceOp, and an already
// completed Work. The only file that includes c10d headers; see Note [Collectives: c10d objects].
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <string_view>
#include <vector>

namespace tfz::detail {

/// True if this torch ships torch.distributed (the c10d ops and headers exist).
bool has_c10d();

/// A process group as _c10d_functional ops take it: its registered name and its size.
struct GroupRef {
  std::string name;
  int64_t size = 0;
};

/// The group passed to `op_name` as a c10d ProcessGroup script object. Raises (naming the op) if
/// `v` is something else.
GroupRef group_ref(std::string_view op_name, const c10::IValue& v);

/// The reduce_op string of _c10d_functional ("sum", "avg", "product", "min", "max", "band", "bor",
/// "bxor") for a c10d ReduceOp script object. PREMUL_SUM (a scale factor the functional ops cannot
/// carry) raises NotImplementedError naming `op_name`.
std::string reduce_op_name(std::string_view op_name, const c10::IValue& v);

/// A c10d Work whose wait() returns at once and whose result() is `outputs`: the collective's
/// value has already been waited for. See Note [Collectives: where wait_tensor sits].
c10::IValue completed_work(const std::vector<at::Tensor>& outputs);

}  // namespace tfz::detail
