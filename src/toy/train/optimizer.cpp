#include "toy/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "toy/autograd/grad_mode.h"
#include "toy/ops/ops.h"

namespace toy {

AdamW::AdamW(ParamStore& params, AdamWConfig cfg) : params_(params), cfg_(cfg) {
  for (Param& p : params.all()) {
    if (!p.trainable) continue;
    p.m = zeros(p.value.shape());
    p.v = zeros(p.value.shape());
  }
  lr_ = scalar(0.0);
  step_ = scalar(1.0);
}

void AdamW::step(float lr) {
  NoGradGuard ng;
  ++steps_;
  fill_(lr_, lr);
  fill_(step_, double(steps_));
  for (Param& p : params_.all()) {
    if (!p.trainable) continue;
    Tensor g = p.value.grad();
    if (!g.defined()) continue;
    AdamWOptions o{cfg_.beta1, cfg_.beta2, cfg_.eps, p.decay ? cfg_.weight_decay : 0.0f};
    adamw_step(p.value, g, p.m, p.v, lr_, step_, o);
  }
}

bool DynamicLossScale::update(bool finite) {
  if (!finite) {
    scale_ = std::max(1.0f, scale_ / 2);
    good_ = 0;
    return false;
  }
  if (++good_ == interval_) scale_ = std::min(scale_ * 2, 16777216.0f), good_ = 0;
  return true;
}

double clip_grad_norm(ParamStore& params, double max_norm) {
  NoGradGuard ng;
  double total = 0;
  for (Param& p : params.all()) {
    Tensor g = p.value.grad();
    if (!g.defined()) continue;
    total += sum(square(g)).item();
  }
  const double norm = std::sqrt(total);
  if (max_norm > 0 && norm > max_norm) {
    const float s = float(max_norm / (norm + 1e-6));
    for (Param& p : params.all())
      if (p.value.grad().defined()) p.value.set_grad(scale(p.value.grad(), s));
  }
  return norm;
}

float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr) {
  if (step < warmup) return lr * float(step + 1) / float(warmup + 1);
  if (step >= total) return min_lr;
  const double ratio = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return float(min_lr + coeff * (lr - min_lr));
}

}  // namespace toy
