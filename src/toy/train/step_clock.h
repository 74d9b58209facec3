// A training run's step on the device: an I32 scalar holding the 0-based step being taken.
// Kernels read it (dropout's counters through Generator::for_micro_batch(device_step, micro),
// the optimizer clock's schedule position) and one kernel advances it at the end of each
// step, so nothing of the step is baked into a launch (graph capture). The host writes it only
// when it does not hold the step the host expects (first use, a resume, another device): an
// upload, never a read.
#pragma once
#include <cstdint>

#include "toy/core/device.h"
#include "toy/core/tensor.h"

namespace toy {

class StepClock {
 public:
  // The clock, holding `step`, on device d.
  const Tensor& at(int64_t step, Device d);
  // After the step: + 1, on the device.
  void advance();
  const Tensor& tensor() const { return step_; }

 private:
  Tensor step_;
  int64_t holds_ = -1;  // the step step_ holds (-1: unset)
};

}  // namespace toy
