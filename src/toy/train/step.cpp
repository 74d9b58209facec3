#include "toy/train/step.h"

#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"

namespace toy {

Tensor WindowTask::micro_loss(const MicroBatch& mb, int64_t& units) {
  Generator data = data_gen_.for_micro_batch(mb.step, mb.index);
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
