#include "toy/train/step.h"

#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"

namespace toy {

Tensor WindowTask::micro_loss(const MicroBatch& mb, int64_t& units) {
  // The step's windows are one sequence drawn from micro-batch 0's generator: micro-batch m
  // takes windows m*batch .. m*batch + batch-1 of it, so how a global batch is split into
  // micro-batches (accum, processes, or one big micro-batch) does not change what it holds.
  Generator data = data_gen_.for_micro_batch(mb.step, 0);
  data.set_offset(data.offset() + uint64_t(mb.index) * uint64_t(batches_.batch()));
  Generator dropout = mb.draws_from(dropout_gen_);
  Tensor x, y;
  batches_.sample(data, x, y);
  units += x.numel();
  return model_.loss(x, y, true, &dropout);
}

StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, const Generator& data_gen,
                      const Generator& dropout_gen, int64_t step, int64_t accum, double clip, float lr) {
  WindowTask task(model, batches, data_gen, dropout_gen);
  StepSettings s;
  s.step = step;
  s.accum = accum;
  s.clip = clip;
  DynamicLossScale unscaled(1.0f);
  return take_step(task, model.params(), opt, unscaled, s, lr);
}

}  // namespace toy
