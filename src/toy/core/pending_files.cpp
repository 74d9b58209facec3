#include "toy/core/pending_files.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace toy {

namespace {

// Fixed storage: the signal handler may only read memory and call unlink(2).
constexpr size_t kMaxPath = 4096;
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<bool> ready{false};  // the path is written whole
  char path[kMaxPath];
};
Slot g_slots[kMaxPendingFiles];

void on_signal(int sig) { remove_pending_files_and_die_by(sig); }

}  // namespace

PendingFile::PendingFile(const std::string& path) {
  if (path.size() >= kMaxPath) return;
  for (int i = 0; i < kMaxPendingFiles; ++i) {
    bool expected = false;
    if (!g_slots[i].used.compare_exchange_strong(expected, true)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].ready.store(true, std::memory_order_release);
    slot_ = i;
    return;
  }
}

PendingFile::~PendingFile() {
  if (slot_ < 0) return;
  g_slots[slot_].ready.store(false, std::memory_order_release);
  g_slots[slot_].used.store(false, std::memory_order_release);
}

void remove_pending_files_and_die_by(int sig) {
  for (Slot& s : g_slots)
    if (s.ready.load(std::memory_order_acquire)) ::unlink(s.path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void remove_pending_files_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;  // ignored, or handled
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace toy
