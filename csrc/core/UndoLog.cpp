// The undo log of a functionalized call and the thread's stack of active logs. See
// core/UndoLog.h and Note [Undo: writes into the caller's memory].
#include "core/UndoLog.h"

#include <c10/util/Exception.h>

#include <utility>

namespace tfz::detail {

namespace {
thread_local std::vector<std::pair<int64_t, UndoLog*>> active_logs;
}  // namespace

void UndoLog::rollback() noexcept {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    try {
      (*it)();
    } catch (...) {  // NOLINT(bugprone-empty-catch): restoring the rest matters more
    }
  }
  entries_.clear();
}

UndoScope::UndoScope(int64_t layer_id, UndoLog& log) : layer_id_(layer_id) {
  active_logs.emplace_back(layer_id, &log);
}

UndoScope::~UndoScope() {
  TORCH_INTERNAL_ASSERT(!active_logs.empty() && active_logs.back().first == layer_id_);
  active_logs.pop_back();
}

UndoLog* undo_log_of(int64_t layer_id) {
  for (auto it = active_logs.rbegin(); it != active_logs.rend(); ++it) {
    if (it->first == layer_id) return it->second;
  }
  return nullptr;
}

}  // namespace tfz::detail
