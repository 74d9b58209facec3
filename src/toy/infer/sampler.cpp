#include "toy/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy {

Sampler::Sampler(SamplerConfig cfg, uint64_t seed) : cfg_(cfg), gen_(seed, 0x5a3d1e) {
  TOY_CHECK(cfg.temperature >= 0 && std::isfinite(cfg.temperature), "[sample] temperature must be >= 0, got {}",
            cfg.temperature);
  TOY_CHECK(cfg.top_k >= 0, "[sample] top-k must be >= 0, got {}", cfg.top_k);
  TOY_CHECK(cfg.top_p > 0 && cfg.top_p <= 1, "[sample] top-p must be in (0, 1], got {}", cfg.top_p);
  TOY_CHECK(cfg.min_p >= 0 && cfg.min_p <= 1, "[sample] min-p must be in [0, 1], got {}", cfg.min_p);
  TOY_CHECK(std::isfinite(cfg.repeat_penalty) && cfg.repeat_penalty > 0, "[sample] repeat penalty must be > 0, got {}",
            cfg.repeat_penalty);
  TOY_CHECK(std::isfinite(cfg.presence_penalty) && std::isfinite(cfg.frequency_penalty),
            "[sample] presence and frequency penalties must be finite");
  TOY_CHECK(cfg.penalty_last_n >= 0, "[sample] penalty window must be >= 0, got {}", cfg.penalty_last_n);
  for (const auto& [id, bias] : cfg.logit_bias)
    TOY_CHECK(id >= 0 && std::isfinite(bias), "[sample] logit bias {} for token {}: needs a token id >= 0 and a finite bias",
              bias, id);
}

int32_t Sampler::sample(const Tensor& logits, std::span<const int32_t> recent) {
  // The chain runs as a kernel on the logits' device (ops sample_token): the penalized
  // tokens go up, the token comes back — one read, never the logits.
  TOY_CHECK(logits.numel() > 0, "[sample] empty logits");
  // (id, count) pairs of the recent tokens in the vocabulary, padded with count-0 pairs to the
  // window's length: one size of upload, so a warm decoder allocates nothing per token.
  std::vector<int32_t>& counts = counts_;
  counts.clear();
  const int64_t V = logits.numel();
  const bool penalize = cfg_.repeat_penalty != 1.0f || cfg_.presence_penalty != 0 || cfg_.frequency_penalty != 0;
  if (penalize && cfg_.penalty_last_n > 0 && !recent.empty()) {
    const size_t window = size_t(std::min<int64_t>(cfg_.penalty_last_n, V));
    counts.reserve(2 * window);
    const size_t n = std::min(recent.size(), size_t(cfg_.penalty_last_n));
    for (int32_t id : recent.subspan(recent.size() - n)) {
      if (id < 0 || id >= V) continue;
      size_t at = 0;
      while (at < counts.size() && counts[at] != id) at += 2;
      if (at == counts.size())
        counts.push_back(id), counts.push_back(1);
      else
        ++counts[at + 1];
    }
    while (counts.size() < 2 * window) counts.push_back(0), counts.push_back(0);
  }
  SampleDraw d;
  d.temperature = cfg_.temperature, d.top_k = cfg_.top_k, d.top_p = cfg_.top_p, d.min_p = cfg_.min_p;
  d.repeat_penalty = cfg_.repeat_penalty, d.presence_penalty = cfg_.presence_penalty;
  d.frequency_penalty = cfg_.frequency_penalty;
  if (cfg_.temperature > 0) {
    auto u = gen_.block(gen_.reserve(1));
    d.r = double((uint64_t(u[0]) << 21) ^ u[1]) / 9007199254740992.0;  // ~uniform [0, 1)
  }
  NoGradGuard ng;
  Tensor row = reshape(logits.detach(), Shape{-1});
  if (!cfg_.logit_bias.empty()) {
    if (!bias_.defined() || bias_.numel() != V || bias_.device() != row.device()) {
      std::vector<float> dense(size_t(V), 0.0f);
      for (const auto& [id, bias] : cfg_.logit_bias) {
        TOY_CHECK(id < V, "[sample] logit bias for token {}: outside the vocabulary of {}", id, V);
        dense[size_t(id)] += bias;
      }
      bias_ = to(from_vector(dense, Shape{V}), row.device());
    }
    row = add(cast(row, DType::F32), bias_);
  }
  const int32_t got = int32_t(sample_token(row, counts, d).item());
  TOY_CHECK(got >= 0, "[sample] logit {} is NaN (did the model diverge?)", -1 - int64_t(got));
  return got;
}

}  // namespace toy
