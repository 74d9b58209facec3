#include "toy/train/step.h"

#include <cmath>

#include "toy/autograd/backward.h"
#include "toy/core/error.h"
#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"

namespace toy {

StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, Generator& data_gen,
                      Generator& dropout_gen, int64_t accum, double clip, float lr) {
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    Tensor x, y;
    batches.sample(data_gen, x, y);
    Tensor loss = model.loss(x, y, true, &dropout_gen);
    loss_sum += loss.item();
    backward(accum == 1 ? loss : scale(loss, 1.0f / float(accum)));
  }
  StepResult r;
  r.grad_norm = clip_grad_norm(model.params(), clip);
  opt.step(lr);
  model.params().zero_grad();
  r.loss = loss_sum / double(accum);
  TOY_CHECK(std::isfinite(r.loss), "[train] loss became {} (try a lower --lr)", r.loss);
  return r;
}

}  // namespace toy
