#include "toy/train/step.h"

#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"

namespace toy {

Tensor WindowTask::micro_loss(int64_t /*micro*/, int64_t& units) {
  Tensor x, y;
  batches_.sample(data_gen_, x, y);
  units += x.numel();
  return model_.loss(x, y, true, &dropout_gen_);
}

StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, Generator& data_gen,
                      Generator& dropout_gen, int64_t accum, double clip, float lr) {
  WindowTask task(model, batches, data_gen, dropout_gen);
  StepSettings s;
  s.accum = accum;
  s.clip = clip;
  DynamicLossScale unscaled(1.0f);
  return take_step(task, model.params(), opt, unscaled, s, lr);
}

}  // namespace toy
