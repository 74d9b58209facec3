// SIGINT (Ctrl-C), SIGTERM (kill, timeout, job schedulers) and SIGHUP (a closed terminal) ask
// a trainer to stop after its current step and write a checkpoint. The handlers are one-shot:
// a second signal ends the process at once (the checkpoint on disk is then the previous one;
// writes are atomic, so it is never half-written).
#pragma once

namespace toy::cli {

void install_stop_signals();
// The exit status of a run a stop signal ended early: 128 + the signal's number (130 for
// Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a command the signal killed,
// so `toy finetune ... && deploy` does not ship a partly trained model. 0 when none arrived.
int stop_signal_exit_code();

}  // namespace toy::cli
