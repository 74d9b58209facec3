#include "toy/infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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
}

int32_t Sampler::sample(const Tensor& logits_t, std::span<const int32_t> recent) {
  const bool penalties = cfg_.repeat_penalty != 1.0f || cfg_.presence_penalty != 0 || cfg_.frequency_penalty != 0;
  if (!is_host(logits_t.device()) && cfg_.temperature == 0.0f && !(penalties && cfg_.penalty_last_n > 0)) {
    // Greedy on a device: the argmax runs there and only the token id comes back.
    NoGradGuard ng;
    return int32_t(argmax(reshape(logits_t.detach(), Shape{-1}), 0).item());
  }
  std::vector<float>& z = z_;
  if (logits_t.dtype() == DType::F32 && logits_t.is_contiguous() && logits_t.device() == Device::CPU) {
    const float* src = logits_t.data<float>();
    z.assign(src, src + logits_t.numel());
  } else {
    z = logits_t.to_f32_vector();
  }
  TOY_CHECK(!z.empty(), "[sample] empty logits");
  const int32_t V = int32_t(z.size());
  // Room for every candidate and every distinct recent token from the first call on.
  idx_.reserve(size_t(V));
  p_.reserve(size_t(V));
  counts_.reserve(std::min(size_t(cfg_.penalty_last_n), size_t(V)));
  for (int32_t i = 0; i < V; ++i)
    TOY_CHECK(!std::isnan(z[size_t(i)]), "[sample] logit {} is NaN (did the model diverge?)", i);
  // Penalties over the last penalty_last_n tokens (as llama.cpp applies them, first).
  const bool penalize = cfg_.repeat_penalty != 1.0f || cfg_.presence_penalty != 0 || cfg_.frequency_penalty != 0;
  if (penalize && cfg_.penalty_last_n > 0 && !recent.empty()) {
    const size_t n = std::min(recent.size(), size_t(cfg_.penalty_last_n));
    std::vector<std::pair<int32_t, int>>& counts = counts_;  // small: the window is short
    counts.clear();
    for (int32_t id : recent.subspan(recent.size() - n)) {
      if (id < 0 || id >= V) continue;
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == id; });
      if (it == counts.end())
        counts.emplace_back(id, 1);
      else
        ++it->second;
    }
    for (const auto& [id, count] : counts) {
      float& l = z[size_t(id)];
      l = l > 0 ? l / cfg_.repeat_penalty : l * cfg_.repeat_penalty;
      l -= float(count) * cfg_.frequency_penalty + cfg_.presence_penalty;
    }
  }
  if (cfg_.temperature == 0.0f) return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
  // Candidates: every id, or when top-k / top-p cut them, sorted by logit (descending, ties
  // by id) and cut by top-k.
  std::vector<int32_t>& idx = idx_;
  idx.resize(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int32_t k = cfg_.top_k > 0 ? std::min(cfg_.top_k, V) : V;
  if (k < V || cfg_.top_p < 1.0f || cfg_.min_p > 0) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return z[size_t(a)] > z[size_t(b)] || (z[size_t(a)] == z[size_t(b)] && a < b);
    });
    idx.resize(size_t(k));
  }
  // Softmax over candidates at the temperature (in double).
  const double mx = *std::max_element(z.begin(), z.end());
  std::vector<double>& p = p_;
  p.resize(idx.size());
  double total = 0;
  for (size_t i = 0; i < idx.size(); ++i) total += p[i] = std::exp((z[size_t(idx[i])] - mx) / cfg_.temperature);
  for (double& v : p) v /= total;
  // Min-p: drop the tail below min_p times the most likely token's probability (p is sorted).
  if (cfg_.min_p > 0) {
    size_t keep = 1;
    while (keep < p.size() && p[keep] >= cfg_.min_p * p[0]) ++keep;
    if (keep < p.size()) {
      p.resize(keep);
      idx.resize(keep);
      double s = 0;
      for (double v : p) s += v;
      for (double& v : p) v /= s;
    }
  }
  // Top-p: the smallest prefix whose mass reaches top_p.
  if (cfg_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = p.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= cfg_.top_p) {
        keep = i + 1;
        break;
      }
    }
    p.resize(keep);
    idx.resize(keep);
    double s = 0;
    for (double v : p) s += v;
    for (double& v : p) v /= s;
  }
  auto u = gen_.block(gen_.reserve(1));
  const double r = (double((uint64_t(u[0]) << 21) ^ u[1]) / 9007199254740992.0);  // ~uniform [0, 1)
  double cum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cum += p[i];
    if (r < cum) return idx[i];
  }
  return idx.back();
}

}  // namespace toy
