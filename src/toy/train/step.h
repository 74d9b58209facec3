// One optimizer step of a DecoderLM, shared by `toy train` and `toy bench train` so that the
// benchmark times exactly what training runs.
#pragma once
#include <cstdint>

#include "toy/core/error.h"
#include "toy/core/rng.h"

namespace toy {

class AdamW;
class BatchSampler;
class DecoderLM;

// A step whose loss or gradient norm is NaN or infinite (nothing was applied).
class NonFiniteStep : public Error {
 public:
  using Error::Error;
};

struct StepResult {
  double loss = 0;       // mean over the micro-batches
  double grad_norm = 0;  // global gradient norm before clipping
};

// `accum` micro-batches (windows drawn from data_gen; forward, loss, backward, each loss
// scaled by 1/accum), clipping to global norm `clip` (0 = off), AdamW at `lr`, gradients
// zeroed. Throws NonFiniteStep, before anything is updated, when a micro-batch's loss or the
// gradient norm is not finite.
StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, Generator& data_gen,
                      Generator& dropout_gen, int64_t accum, double clip, float lr);

}  // namespace toy
