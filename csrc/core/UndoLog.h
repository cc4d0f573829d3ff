// The undo log of one functionalized call: how to restore the regions of the caller's tensors
// that the call wrote in place, replayed newest first if the call raises. Knows nothing of
// wrappers or kernels. See Note [Undo: writes into the caller's memory].
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace tfz::detail {

/// Restores, newest first, what a call wrote into its caller's tensors before it raised.
class UndoLog {
 public:
  /// Remembers how to put back a region the call is about to overwrite.
  void record(std::function<void()> restore) { entries_.push_back(std::move(restore)); }
  /// Forgets the newest entry (its write did not happen).
  void drop_last() { entries_.pop_back(); }
  /// Puts back every recorded region, newest first; the log is empty afterwards.
  void rollback() noexcept;

 private:
  std::vector<std::function<void()>> entries_;
};

/// Makes `log` the undo log of layer `layer_id` on this thread while alive.
class UndoScope {
 public:
  UndoScope(int64_t layer_id, UndoLog& log);
  ~UndoScope();
  UndoScope(const UndoScope&) = delete;
  UndoScope& operator=(const UndoScope&) = delete;

 private:
  int64_t layer_id_;
};

/// The undo log of layer `layer_id` on this thread, or nullptr when its caller keeps no log (a
/// FunctionalizeGuard, whose caller writes inputs back itself): then nothing may be written
/// into the caller's memory early.
UndoLog* undo_log_of(int64_t layer_id);

}  // namespace tfz::detail
