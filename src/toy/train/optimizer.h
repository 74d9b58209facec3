// AdamW over a ParamStore: it packs the store (ParamStore::pack: values, gradients and the
// moments m and v in one arena, for trainable parameters only) and updates the arena in one
// kernel call per step: the ranges of the parameters that have a gradient, decoupled weight
// decay where the record says so (matrices: embeddings and projections; norms and biases are
// not decayed, as in nanoGPT), bias correction from the step count. lr and step live in
// scalar tensors that are filled in place each step (device scalars, no allocation per step).
#pragma once
#include "toy/core/lr_schedule.h"  // cosine_lr, LrSchedule
#include "toy/nn/params.h"

namespace toy {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

class AdamW {
 public:
  AdamW(ParamStore& params, AdamWConfig cfg);
  // One update of every parameter that has a gradient, with learning rate lr (from the host:
  // filled into the device's lr scalar).
  void step(float lr);
  // The same with the step count and the learning rate advanced on the device by one kernel
  // (optimizer_clock: step + 1, lr = the schedule at `position`, the I32 scalar of the run's
  // StepClock): nothing of the step is baked into a launch, as a captured graph needs. The
  // bits of step(cosine_lr(position, s)); position runs ahead of steps() when F16 loss scaling
  // skipped a step.
  void step_on_schedule(const LrSchedule& s, const Tensor& position);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s, clock_synced_ = false; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  void clock_on(Device d);
  void update();
  ParamStore& params_;
  AdamWConfig cfg_;
  Tensor lr_, step_;      // device scalars: the learning rate and the steps taken
  int64_t steps_ = 0;
  bool clock_synced_ = false;  // step_ holds steps_
};

// F16 mixed precision's dynamic loss scale: the loss is multiplied by scale() before backward
// (the gradients divided by it after); a step whose gradient is not finite is skipped and the
// scale halved (never below 1); after `growth_interval` good steps in a row it doubles (at
// most 2^24).
class DynamicLossScale {
 public:
  explicit DynamicLossScale(float initial = 65536.0f, int64_t growth_interval = 200)
      : scale_(initial), interval_(growth_interval) {}
  float scale() const { return scale_; }
  int64_t good_steps() const { return good_; }  // finite steps since the last change
  // Records a step; returns whether it may be applied (its gradient was finite).
  bool update(bool finite);
  // A checkpoint's state (resume).
  void restore(float scale, int64_t good_steps) { scale_ = scale, good_ = good_steps; }

 private:
  float scale_;
  int64_t interval_, good_ = 0;
};

// Multiplies every gradient by s in place (one call over the gradient arena when the store is
// packed and the gradients are there).
void scale_grads(ParamStore& params, float s);
// Scales all gradients so that their global L2 norm is at most max_norm (when max_norm > 0);
// returns the norm before clipping.
double clip_grad_norm(ParamStore& params, double max_norm);
// The same in two halves, so that a step reads the device once: the squared norm of each
// gradient as one [n] tensor on the gradients' device (undefined when none has a gradient),
// then, once those are read, the norm (summed in double, in parameter order) and the clip.
Tensor grad_square_norms(ParamStore& params);
double clip_grad_norm_from(ParamStore& params, const std::vector<float>& square_norms, double max_norm);


}  // namespace toy
