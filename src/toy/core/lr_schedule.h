// The learning-rate schedule (nanoGPT's): linear warmup over `warmup` steps,
// (step + 1) / (warmup + 1) * lr, then cosine decay to min_lr at `total`; step counts from 0.
// In core (not train/) because the optimizer_clock kernel computes it on the device, with the
// bits the host computes for the progress line.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace toy {

struct LrSchedule {
  int64_t warmup = 0, total = 1;
  float lr = 1e-3f, min_lr = 1e-4f;
};

inline float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr) {
  if (step < warmup) return lr * float(step + 1) / float(warmup + 1);
  if (step >= total) return min_lr;
  const double ratio = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return float(min_lr + coeff * (lr - min_lr));
}

inline float cosine_lr(int64_t step, const LrSchedule& s) { return cosine_lr(step, s.warmup, s.total, s.lr, s.min_lr); }

}  // namespace toy
