#include "toy/nn/gated_delta_net.h"

#include <cmath>
#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/nn/short_conv.h"
#include "toy/ops/ops.h"

namespace toy::nn {

RecurrentShape GatedDeltaNet::state_shape() const {
  return {kernel() - 1, conv_channels(), Shape{v_heads, head_dim, head_dim}};
}

Tensor GatedDeltaNet::operator()(const Tensor& x, KVCache* cache, int64_t layer) const {
  if (!cache) return forward(x, nullptr, nullptr);
  return forward(x, &cache->conv_tail(layer), &cache->state(layer));
}

Tensor GatedDeltaNet::step(const Tensor& x, std::span<KVCache* const> caches, int64_t layer) const {
  const int64_t N = x.size(0);
  TOY_CHECK(int64_t(caches.size()) == N, "[gated delta net] {} caches for a batch of {}", caches.size(), N);
  if (N == 1) return (*this)(x, caches[0], layer);
  // The rows' conv tails and states side by side, one batched layer, then each row back.
  std::vector<Tensor> tails, states;
  for (KVCache* c : caches) tails.push_back(c->conv_tail(layer)), states.push_back(c->state(layer));
  Tensor tail = concat(tails, 0), state = concat(states, 0);
  Tensor y = forward(x, &tail, &state);
  NoGradGuard ng;
  for (int64_t i = 0; i < N; ++i) {
    copy_(caches[size_t(i)]->conv_tail(layer), slice(tail, 0, i, i + 1));
    copy_(caches[size_t(i)]->state(layer), slice(state, 0, i, i + 1));
  }
  return y;
}

Tensor GatedDeltaNet::forward(const Tensor& x, Tensor* tail_in, Tensor* state_in) const {
  const bool cache = tail_in != nullptr;
  const int64_t B = x.size(0), T = x.size(1), Hk = k_heads, Hv = v_heads, d = head_dim;
  Tensor mixed = qkv(x);                                                   // [B, T, C]
  Tensor z = reshape(gate(x), Shape{B, T, Hv, d});
  Tensor b = sigmoid(beta(x));                                             // [B, T, Hv]
  Tensor g = mul(softplus(add(alpha(x), dt_bias)), a);                     // [B, T, Hv], <= 0
  Tensor conv_out = causal_conv(mixed, conv, tail_in);  // (continuing the cache's tail)
  Tensor c = silu(conv_out);
  // q, k, v split from c, q and k L2-normalised (q / sqrt(d)), then the rule: one fused op.
  auto [o, s] = gated_delta_rule_qkv(c, g, b, Hk, Hv, d, eps, cache ? *state_in : Tensor());
  if (cache) {
    NoGradGuard ng;
    copy_(*state_in, s);
  }
  Tensor y = mul(norm(o), silu(z));                                        // [B, T, Hv, d]
  return out(reshape(y, Shape{B, T, Hv * d}));
}

}  // namespace toy::nn
