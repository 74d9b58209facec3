#include "toy/nn/gated_delta_net.h"

#include <cmath>

#include "toy/autograd/grad_mode.h"
#include "toy/ops/ops.h"

namespace toy::nn {

RecurrentShape GatedDeltaNet::state_shape() const {
  return {kernel() - 1, conv_channels(), Shape{v_heads, head_dim, head_dim}};
}

Tensor GatedDeltaNet::operator()(const Tensor& x, KVCache* cache, int64_t layer) const {
  const int64_t B = x.size(0), T = x.size(1), Hk = k_heads, Hv = v_heads, d = head_dim;
  const int64_t C = conv_channels(), K = kernel();
  Tensor mixed = qkv(x);                                                   // [B, T, C]
  Tensor z = reshape(gate(x), Shape{B, T, Hv, d});
  Tensor b = sigmoid(beta(x));                                             // [B, T, Hv]
  Tensor g = mul(softplus(add(alpha(x), dt_bias)), a);                     // [B, T, Hv], <= 0
  Tensor conv_out;
  if (cache) {
    // The conv reads the layer's last K - 1 inputs first; they become the last K - 1 of these.
    Tensor& tail = cache->conv_tail(layer);
    Tensor in = K > 1 ? concat({tail, mixed}, 1) : mixed;                   // [B, K - 1 + T, C]
    conv_out = ssm_conv(in, conv);
    if (K > 1) {
      NoGradGuard ng;
      Tensor last = contiguous(slice(in, 1, T, T + K - 1));
      copy_(tail, last);
    }
  } else {
    conv_out = conv1d(mixed, conv);
  }
  Tensor c = silu(conv_out);
  // q, k, v split from c, q and k L2-normalised (q / sqrt(d)), then the rule: one fused op.
  auto [o, s] = gated_delta_rule_qkv(c, g, b, Hk, Hv, d, eps, cache ? cache->state(layer) : Tensor());
  if (cache) {
    NoGradGuard ng;
    copy_(cache->state(layer), s);
  }
  Tensor y = mul(norm(o), silu(z));                                        // [B, T, Hv, d]
  return out(reshape(y, Shape{B, T, Hv * d}));
}

}  // namespace toy::nn
