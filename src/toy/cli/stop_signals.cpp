#include "toy/cli/stop_signals.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "toy/train/trainer.h"

namespace toy::cli {

namespace {
// Only async-signal-safe calls: an atomic store and write(2) (errno is kept).
void on_stop_signal(int) {
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
  // One-shot (the next one gets the default action); blocking calls restart after it.
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    // A signal the caller ignores stays ignored (`nohup toy train ...` survives a closed terminal).
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace toy::cli
