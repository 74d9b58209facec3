#include "toy/cli/stop_signals.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "toy/core/pending_files.h"
#include "toy/train/trainer.h"

namespace toy::cli {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;

// Only async-signal-safe calls: an atomic store and write(2) (errno is kept).
void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {  // the second: end at once, as the signal would, with no .tmp left
    remove_pending_files_and_die_by(sig);
    return;
  }
  g_stop_signal = sig;
  static const char msg[] = "\ntoy: stopping after this step to write a checkpoint (a second signal ends at once)\n";
  const int saved = errno;
  request_stop();
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  errno = saved;
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Blocking calls restart after it; the second signal ends the process (above).
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // A signal the caller ignores stays ignored (`nohup toy train ...` survives a closed terminal).
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sig, &sa, nullptr);
  }
}

int stop_signal_exit_code() { return g_stop_signal ? 128 + int(g_stop_signal) : 0; }

}  // namespace toy::cli
