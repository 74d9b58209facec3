// AdamW over a ParamStore: the moments (m, v) live in each trainable parameter's record
// (allocated here, for trainable parameters only), decoupled weight decay where the record
// says so (matrices: embeddings and projections; norms and biases are not decayed, as in
// nanoGPT), bias correction from the step count. lr and step live in scalar tensors that are
// filled in place each step (device scalars, no allocation per step).
#pragma once
#include "toy/nn/params.h"

namespace toy {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

class AdamW {
 public:
  AdamW(ParamStore& params, AdamWConfig cfg);
  // One update of every parameter that has a gradient, with learning rate lr.
  void step(float lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  ParamStore& params_;
  AdamWConfig cfg_;
  Tensor lr_, step_;
  int64_t steps_ = 0;
};

// Scales all gradients so that their global L2 norm is at most max_norm (when max_norm > 0);
// returns the norm before clipping.
double clip_grad_norm(ParamStore& params, double max_norm);

// Linear warmup over `warmup` steps (step + 1) / (warmup + 1) * lr, then cosine decay to
// min_lr at `total` steps (nanoGPT's schedule); step counts from 0.
float cosine_lr(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr);

}  // namespace toy
