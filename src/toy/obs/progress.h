// The progress line of a training loop (toy train, toy finetune): on a terminal one line
// rewritten in place at every step; otherwise (a pipe, a log file) a line at step 1 and every
// `every` steps:  "step    120/2000  loss 2.3456  lr 3.00e-04  1234 tok/s  ETA 2m05s".
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace toy {

// "45s", "2m05s", "1h02m"; "?" for a time not known.
std::string format_duration(double seconds);

class ProgressLine {
 public:
  // quiet: nothing is printed (lines included).
  ProgressLine(std::FILE* out, bool quiet, int64_t every);
  bool tty() const { return tty_; }
  // After step `step` (1-based) of `total`; `rate` in `unit` per second.
  void step(int64_t step, int64_t total, double loss, float lr, double rate, double eta_seconds,
            const char* unit = "tok/s");
  // A line of its own (the in-place line is cleared first).
  void line(const std::string& s);

 private:
  std::FILE* out_;
  bool quiet_, tty_;
  int64_t every_;
};

}  // namespace toy
