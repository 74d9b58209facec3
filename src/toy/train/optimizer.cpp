#include "toy/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "toy/autograd/grad_mode.h"
#include "toy/ops/ops.h"

namespace toy {

AdamW::AdamW(ParamStore& params, AdamWConfig cfg) : params_(params), cfg_(cfg) {
  for (Param& p : params.all()) {
    if (!p.trainable) continue;
    p.m = zeros(p.value.shape(), DType::F32, p.value.device());
    p.v = zeros(p.value.shape(), DType::F32, p.value.device());
  }
}

void AdamW::step(float lr) {
  NoGradGuard ng;
  ++steps_;
  // lr and step live on the parameters' device, filled there by a kernel each step.
  Device d = Device::CPU;
  for (const Param& p : params_.all())
    if (p.trainable) d = p.value.device();
  if (!lr_.defined() || lr_.device() != d) lr_ = zeros(Shape{}, DType::F32, d), step_ = zeros(Shape{}, DType::F32, d);
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

Tensor grad_square_norms(ParamStore& params) {
  NoGradGuard ng;
  std::vector<Tensor> parts;
  for (Param& p : params.all()) {
    Tensor g = p.value.grad();
    if (g.defined()) parts.push_back(reshape(sum(square(g)), Shape{1}));
  }
  if (parts.empty()) return Tensor();
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

double clip_grad_norm(ParamStore& params, double max_norm) {
  const Tensor parts = grad_square_norms(params);
  return clip_grad_norm_from(params, parts.defined() ? parts.to_f32_vector() : std::vector<float>{}, max_norm);
}

double clip_grad_norm_from(ParamStore& params, const std::vector<float>& square_norms, double max_norm) {
  NoGradGuard ng;
  double total = 0;
  for (float s : square_norms) total += s;
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
