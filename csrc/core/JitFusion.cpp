// TorchScript's tensor-expression fuser, switched off while any layer is active in the process.
// See Note [Layer: TorchScript fusion groups read data pointers].
#include "core/JitFusion.h"

#include <torch/csrc/jit/passes/tensorexpr_fuser.h>

#include <mutex>

namespace tfz::detail {

// Note [Layer: TorchScript fusion groups read data pointers]
// A torch.jit.script function runs its first calls through the profiling executor, then an
// optimized graph in which the tensor-expression fuser (on by default for CUDA tensors) has
// replaced runs of pointwise ops by one generated kernel. That kernel takes its arguments'
// data_ptr() directly, outside the dispatcher. A wrapper's storage has no memory (its data pointer
// is null: torch's own code reads it, e.g. nn.RNN.flatten_parameters compares the data pointers of
// its weights, so it must not throw), and the kernel then read and wrote from address 0 on the
// GPU: an illegal memory access that poisons the process's CUDA context. So while any layer is
// active, the fuser is off: a script function profiled and optimized inside f gets a plan whose
// ops all dispatch (to our kernel), and keeps that plan afterwards (unfused, slower, same values).
// The setting is process-wide (torch keeps one flag), so a script function optimized on another
// thread meanwhile is unfused too. Not covered: a script function whose optimized plan was made
// outside f (fusion groups already compiled) and is then called on CUDA wrappers; the fix would
// be a storage that throws on data access, which the RNN check above rules out.
// Rejected: torch's "fallback allowed" switch for fused kernels, which is read when a kernel is
// built and with its default also makes every kernel built meanwhile run unfused, as here, but
// reaches kernels only through an exception from the data pointer, which a wrapper does not raise.
namespace {
std::mutex region_mutex;
int active = 0;
bool saved_setting = false;
}  // namespace

void enter_fusion_free_region() {
  std::lock_guard<std::mutex> lock(region_mutex);
  if (active++ == 0) {
    saved_setting = torch::jit::tensorExprFuserEnabled();
    torch::jit::setTensorExprFuserEnabled(false);
  }
}

void leave_fusion_free_region() {
  std::lock_guard<std::mutex> lock(region_mutex);
  if (--active == 0) torch::jit::setTensorExprFuserEnabled(saved_setting);
}

}  // namespace tfz::detail
