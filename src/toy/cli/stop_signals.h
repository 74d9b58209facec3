// SIGINT (Ctrl-C), SIGTERM (kill, timeout, job schedulers) and SIGHUP (a closed terminal) ask
// a trainer to stop after its current step and write a checkpoint. The handlers are one-shot:
// a second signal ends the process at once (the checkpoint on disk is then the previous one;
// writes are atomic, so it is never half-written).
#pragma once

namespace toy::cli {

void install_stop_signals();

}  // namespace toy::cli
