#include "toy/cli/stop_signals.h"

#include <unistd.h>

#include <csignal>

#include "toy/train/trainer.h"

namespace toy::cli {

namespace {
// Only async-signal-safe calls: an atomic store and write(2).
void on_stop_signal(int) {
  static const char msg[] = "\ntoy: stopping after this step to write a checkpoint (a second signal ends at once)\n";
  request_stop();
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // the next one gets the default action
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

}  // namespace toy::cli
