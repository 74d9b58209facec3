// Next-token sampling: temperature (0 = greedy argmax), then top-k, then top-p (nucleus), then
// a draw from a counter-based generator — the same seed gives the same text.
#pragma once
#include <cstdint>

#include "toy/core/rng.h"
#include "toy/core/tensor.h"

namespace toy {

struct SamplerConfig {
  float temperature = 0.8f;
  int top_k = 0;      // 0 = off
  float top_p = 1.0f; // 1 = off
};

class Sampler {
 public:
  Sampler(SamplerConfig cfg, uint64_t seed);  // throws on nonsense values
  // logits [V] (F32) -> token id.
  int32_t sample(const Tensor& logits);
  Generator& generator() { return gen_; }

 private:
  SamplerConfig cfg_;
  Generator gen_;
};

}  // namespace toy
