#include "toy/train/step_clock.h"

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy {

const Tensor& StepClock::at(int64_t step, Device d) {
  TOY_CHECK(step >= 0 && step < (int64_t(1) << 31), "[train] step {} is outside the step clock's range [0, 2^31)",
            step);
  NoGradGuard ng;
  if (!step_.defined() || step_.device() != d) step_ = zeros(Shape{}, DType::I32, d), holds_ = 0;
  if (holds_ != step) fill_(step_, double(step)), holds_ = step;
  return step_;
}

void StepClock::advance() {
  TOY_CHECK(step_.defined(), "[train] the step clock advanced before it was set");
  NoGradGuard ng;
  advance_step_clock(step_);
  ++holds_;
}

}  // namespace toy
