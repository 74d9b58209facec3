// The micro-batches of `toy train`, shared by the trainer and `toy bench train` so that the
// benchmark times exactly what training runs: `batch` random windows of the training tokens
// (drawn from data_gen, addressed by the step and the window's place in the step's global
// batch, so `--batch 8` holds the windows of `--batch 4 --accum 2` and of two processes with
// `--batch 4`), the DecoderLM's loss with dropout (from dropout_gen, addressed by the
// micro-batch: Generator::for_micro_batch).
#pragma once
#include <cstdint>

#include "toy/core/rng.h"
#include "toy/train/loop.h"

namespace toy {

class BatchSampler;
class DecoderLM;

class WindowTask : public TrainTask {
 public:
  WindowTask(DecoderLM& model, const BatchSampler& batches, const Generator& data_gen, const Generator& dropout_gen)
      : model_(model), batches_(batches), data_gen_(data_gen), dropout_gen_(dropout_gen) {}
  Tensor micro_loss(const MicroBatch& mb, int64_t& units) override;

 protected:
  DecoderLM& model_;
  const BatchSampler& batches_;
  const Generator& data_gen_;
  const Generator& dropout_gen_;
};

using StepResult = StepDone;

// Step `step` (0-based) of a WindowTask through take_step (loop.h): `accum` micro-batches,
// each loss scaled by 1/accum, clipping to global norm `clip` (0 = off), AdamW at `lr`,
// gradients zeroed. Throws NonFiniteStep, before anything is updated, when a loss or the
// gradient norm is not finite.
StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, const Generator& data_gen,
                      const Generator& dropout_gen, int64_t step, int64_t accum, double clip, float lr);

}  // namespace toy
