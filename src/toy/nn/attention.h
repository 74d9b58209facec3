// nn::Attention — multi-head attention with grouped K/V heads (GQA): the q/k/v projections
// (GPT-2's one fused attn_qkv, or three), optional biases, optional per-head RMSNorm of q and
// k (Qwen3), RoPE (llama's adjacent pairs or NEOX halves, partial rotation, scaling) or none,
// a causal mask or none (a ViT sees every patch), block-causal segments for packed
// sequences, an output gate (Qwen3.5: the q projection gives, per head, d query values then
// d gate values, and the output is multiplied by sigmoid(gate) before the projection), and
// the output projection. It reads and writes a cache it is handed.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "toy/nn/kv_cache.h"
#include "toy/nn/linear.h"
#include "toy/nn/norm.h"
#include "toy/ops/ops.h"

namespace toy::nn {

struct Attention {
  Linear qkv;      // fused [(H + 2 Hkv) d, D] (q rows, then k, then v), or undefined:
  Linear q, k, v;  // [H d, D] ([2 H d, D] when gated), [Hkv d, D], [Hkv d, D]
  Linear out;      // [D, H d]
  Norm q_norm, k_norm;  // over each head's d values (weights [d]), or undefined
  bool norm_whole = false;  // q_norm / k_norm over the whole projection (weights [H d], [Hkv d]; OLMoE)
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  std::optional<RopeOptions> rope;  // none: positions come from elsewhere (learned, or none)
  // LongRoPE (Phi-3): these options replace `rope` when the run's context (a cache's capacity,
  // else the sequence's length) exceeds long_after.
  std::optional<RopeOptions> rope_long;
  int64_t long_after = 0;
  int64_t window = 0;   // sliding window: a query sees only the `window` latest keys (0: all)
  float scale = 0.0f;   // the query scale (0: 1 / sqrt(head_dim))
  bool causal = true;
  bool gated = false;

  // x [B, T, D] at `positions` (I32 [T]). With a cache, the new keys and values are written
  // for `layer` at positions cache->size().. and attention covers everything cached; the
  // caller advances the cache once all layers ran. `segments` (I32 [B, T]) makes the mask
  // block-causal for packed sequences.
  Tensor operator()(const Tensor& x, const Tensor& positions, KVCache* cache = nullptr, int64_t layer = 0,
                    const Tensor& segments = Tensor()) const;
  // One decode step of several sequences, each with its own cache: x [N, T, D] (row i is
  // sequence i, at positions I32 [N, T]). The projections run once for all rows (a GEMM, not
  // N GEMVs); each row's keys and values go to caches[i] and it attends over that cache.
  Tensor step(const Tensor& x, const Tensor& positions, std::span<KVCache* const> caches, int64_t layer) const;
  // The prompts of several sequences at once: x [1, S, D] holds their tokens one after the
  // other (lengths[i] rows for caches[i], at positions I32 [1, S]). The projections run once
  // over all S rows; each sequence's keys and values go to its cache and its queries attend
  // over that cache (causally), as operator() does for one.
  Tensor prefill(const Tensor& x, const Tensor& positions, std::span<KVCache* const> caches,
                 std::span<const int64_t> lengths, int64_t layer) const;

 private:
  struct Heads {
    Tensor q, k, v, gate;  // [B, T, H, d], [B, T, Hkv, d] x 2, [B, T, H d] (gated only)
  };
  // q, k and v heads of x (from `packed` when given), normed and rotated for a run of `context` positions.
  Heads heads_of(const Tensor& x, const Tensor& positions, int64_t context, Tensor packed = Tensor()) const;
  const std::optional<RopeOptions>& rope_for(int64_t context) const {
    return rope_long && context > long_after ? rope_long : rope;
  }
  AttentionOptions options() const;
  // The output projection of o [B, T, H, d] (gated by sigmoid(gate) when gated).
  Tensor output(const Tensor& o, const Tensor& gate) const;
};

}  // namespace toy::nn
