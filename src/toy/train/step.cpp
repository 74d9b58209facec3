#include "toy/train/step.h"

#include <cmath>

#include <fmt/core.h>

#include "toy/autograd/backward.h"
#include "toy/core/error.h"
#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"

namespace toy {

StepResult train_step(DecoderLM& model, AdamW& opt, const BatchSampler& batches, Generator& data_gen,
                      Generator& dropout_gen, int64_t accum, double clip, float lr) {
  // A non-finite loss or gradient stops the step before the update: the weights and the
  // optimizer state stay those of the last good step.
  auto refuse = [&](const std::string& what) {
    model.params().zero_grad();
    throw NonFiniteStep(fmt::format("[train] {}: the step was not applied (try a lower --lr or --clip)", what));
  };
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    Tensor x, y;
    batches.sample(data_gen, x, y);
    Tensor loss = model.loss(x, y, true, &dropout_gen);
    const double l = loss.item();
    if (!std::isfinite(l)) refuse(fmt::format("the loss became {}{}", l, accum > 1 ? fmt::format(" in micro-batch {}", micro + 1) : ""));
    loss_sum += l;
    backward(accum == 1 ? loss : scale(loss, 1.0f / float(accum)));
  }
  StepResult r;
  r.grad_norm = clip_grad_norm(model.params(), clip);
  if (!std::isfinite(r.grad_norm)) refuse(fmt::format("the gradient norm became {}", r.grad_norm));
  opt.step(lr);
  model.params().zero_grad();
  r.loss = loss_sum / double(accum);
  return r;
}

}  // namespace toy
