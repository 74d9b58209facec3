#include "toy/obs/progress.h"

#include <unistd.h>

#include <cmath>

#include <fmt/core.h>

namespace toy {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, int(t % 3600 / 60));
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, int(t % 60));
  return fmt::format("{}s", t);
}

ProgressLine::ProgressLine(std::FILE* out, bool quiet, int64_t every)
    : out_(out), quiet_(quiet), tty_(!quiet && isatty(fileno(out))), every_(every < 1 ? 1 : every) {}

void ProgressLine::step(int64_t step, int64_t total, double loss, float lr, double rate, double eta_seconds,
                        const char* unit) {
  if (quiet_) return;
  if (tty_) {
    std::fputs(fmt::format("\r\033[Kstep {}/{}  loss {:.4f}  lr {:.2e}  {:.0f} {}  ETA {}", step, total, loss, lr,
                           rate, unit, format_duration(eta_seconds)).c_str(), out_);
    std::fflush(out_);
  } else if (step % every_ == 0 || step == 1) {
    line(fmt::format("step {:>6}/{}  loss {:.4f}  lr {:.2e}  {:.0f} {}  ETA {}", step, total, loss, lr, rate, unit,
                     format_duration(eta_seconds)));
  }
}

void ProgressLine::line(const std::string& s) {
  if (quiet_) return;
  if (tty_) std::fputs("\r\033[K", out_);
  std::fputs((s + "\n").c_str(), out_);
  std::fflush(out_);
}

}  // namespace toy
