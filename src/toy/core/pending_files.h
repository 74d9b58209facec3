// Files being written under a temporary name (path.tmp, renamed over the final name when
// whole): a signal that ends the process removes them, so an interrupted `toy quantize` or
// save leaves neither a half-written final file nor a stray .tmp behind.
#pragma once
#include <string>

namespace toy {

// Registers `path` while it lives (at most kMaxPendingFiles at once; more are not tracked).
class PendingFile {
 public:
  explicit PendingFile(const std::string& path);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

 private:
  int slot_ = -1;
};

inline constexpr int kMaxPendingFiles = 16;

// SIGINT, SIGTERM and SIGHUP (those the process does not ignore) remove the pending files,
// then end the process as the signal would have.
void remove_pending_files_on_signals();
// Removes the pending files, then ends the process as `sig` would have (its default action);
// async-signal-safe, for a signal handler.
void remove_pending_files_and_die_by(int sig);

}  // namespace toy
