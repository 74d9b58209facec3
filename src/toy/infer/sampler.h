// Next-token sampling, a chain as llama.cpp's: logit biases (OpenAI's logit_bias), then
// repetition / presence / frequency penalties
// over the recent tokens, then temperature (0 = greedy argmax), top-k, top-p (nucleus) and
// min-p cuts, then a draw from a counter-based generator — the same seed gives the same text.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "toy/core/rng.h"
#include "toy/core/tensor.h"

namespace toy {

struct SamplerConfig {
  float temperature = 0.8f;
  int top_k = 0;               // 0 = off
  float top_p = 1.0f;          // 1 = off
  float min_p = 0.0f;          // keep tokens with p >= min_p * p(most likely); 0 = off
  float repeat_penalty = 1.0f; // recent tokens' logits divided (positive) or multiplied (negative) by it; 1 = off
  float presence_penalty = 0.0f;   // subtracted once from each recent token's logit
  float frequency_penalty = 0.0f;  // subtracted per occurrence in the recent tokens
  int penalty_last_n = 64;     // how many recent tokens the penalties look at
  // (token id, bias) added to those tokens' logits before anything else; -100 bans a token in
  // practice, +100 all but forces it (OpenAI's range).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

class Sampler {
 public:
  Sampler(SamplerConfig cfg, uint64_t seed);  // throws on nonsense values
  // logits [V] (any float type, on any device) -> token id; `recent` are the tokens so far
  // (for the penalties). The chain runs where the logits are; only the token is read back.
  int32_t sample(const Tensor& logits, std::span<const int32_t> recent = {});
  Generator& generator() { return gen_; }
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  Generator gen_;
  // The recent tokens' counts, reused from call to call (the kernel keeps its own scratch).
  std::vector<int32_t> counts_;  // (id, count) pairs
  Tensor bias_;                  // logit_bias as a dense [V] row on the logits' device (made once)
};

}  // namespace toy
