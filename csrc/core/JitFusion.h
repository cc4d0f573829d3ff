// TorchScript's tensor-expression fuser, switched off while any layer is active in the process.
// See Note [Layer: TorchScript fusion groups read data pointers].
#pragma once

namespace tfz::detail {

/// Counts an entered layer; the first one switches the fuser off (remembering its setting).
void enter_fusion_free_region();
/// Counts a layer's exit; the last one restores the fuser's setting from before the first entry.
void leave_fusion_free_region();

}  // namespace tfz::detail
