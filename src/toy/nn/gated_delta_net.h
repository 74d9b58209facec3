// nn::GatedDeltaNet — the linear-attention mixer of Qwen3-Next / Qwen3.5, as llama.cpp's qwen35
// graph computes it (GGUF names in brackets):
//   qkv = W_qkv x [attn_qkv]  (q, k, v channels: K heads x Dk, K heads x Dk, V heads x Dv)
//   z = W_z x [attn_gate];  beta = sigmoid(W_beta x) [ssm_beta];
//   g = softplus(W_alpha x [ssm_alpha] + dt_bias [ssm_dt.bias]) * a [ssm_a = -exp(A_log)]
//   c = silu(causal depthwise conv1d(qkv) [ssm_conv1d, no bias]) -> q, k, v
//   q = l2norm(q) / sqrt(Dk), k = l2norm(k) (eps = the model's RMS eps, as llama.cpp)
//   o = gated_delta_rule(q, k, v, g, beta)  (V head h reads K head h % K heads)
//   y = W_out (rmsnorm(o) [ssm_norm, over Dv] * silu(z)) [ssm_out]
// With a cache the conv continues from the layer's last inputs and the rule from its state,
// and both are left where the new tokens end: a token costs the same at any position.
#pragma once
#include <cstdint>
#include <span>

#include "toy/nn/kv_cache.h"
#include "toy/nn/linear.h"
#include "toy/nn/norm.h"

namespace toy::nn {

struct GatedDeltaNet {
  Linear qkv, gate, beta, alpha, out;
  Tensor conv;     // [conv channels, kernel]
  Tensor dt_bias;  // [V heads]
  Tensor a;        // [V heads], negative
  Norm norm;       // RMSNorm over Dv
  int64_t k_heads = 1, v_heads = 1, head_dim = 1;
  float eps = 1e-6f;  // of the q/k L2 norms

  int64_t conv_channels() const { return 2 * k_heads * head_dim + v_heads * head_dim; }
  int64_t kernel() const { return conv.size(1); }
  // What a cache keeps for this layer.
  RecurrentShape state_shape() const;
  // x [B, T, D] -> [B, T, D].
  Tensor operator()(const Tensor& x, KVCache* cache = nullptr, int64_t layer = 0) const;
  // One step of several sequences, each with its own cache (row i of x [N, T, D] continues
  // caches[i]): the projections run once for all rows.
  Tensor step(const Tensor& x, std::span<KVCache* const> caches, int64_t layer) const;

 private:
  // With tail and state (batch rows matching x), continues them and leaves them updated.
  Tensor forward(const Tensor& x, Tensor* tail, Tensor* state) const;
};

}  // namespace toy::nn
