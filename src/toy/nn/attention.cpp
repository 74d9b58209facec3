#include "toy/nn/attention.h"

#include "toy/autograd/grad_mode.h"

namespace toy::nn {

namespace {
// RoPE on heads [h0, h1) of x [B, T, heads, d].
Tensor rotate(const Tensor& x, const Tensor& positions, RopeOptions o, int64_t h0, int64_t h1) {
  o.heads_begin = h0;
  o.heads_end = h1;
  return rope(x, positions, o);
}
}  // namespace

Tensor Attention::operator()(const Tensor& x, const Tensor& positions, KVCache* cache, int64_t layer,
                             const Tensor& segments) const {
  const int64_t B = x.size(0), T = x.size(1), H = heads, Hkv = kv_heads, d = head_dim;
  AttentionOptions ao;
  ao.causal = causal;
  ao.segments = segments;
  // The packed projection [B, T, H + 2 Hkv, d]: GPT-2's fused weight, or, while training, q/k/v
  // concatenated so one matmul projects all three and the backward returns one gradient.
  Tensor packed;
  if (qkv.defined()) {
    packed = reshape(qkv(x), Shape{B, T, H + 2 * Hkv, d});
  } else if (grad_enabled() && !gated && q.weight.requires_grad() && !q.lora.defined() && !k.lora.defined() &&
             !v.lora.defined()) {
    Linear fused{concat({q.weight, k.weight, v.weight}, 0),
                 q.bias.defined() ? concat({q.bias, k.bias, v.bias}, 0) : Tensor()};
    fused.compute = q.compute;
    packed = reshape(fused(x), Shape{B, T, H + 2 * Hkv, d});
  }
  Tensor o;
  if (packed.defined() && !cache && !q_norm.defined()) {
    // The training path: RoPE on the q and k heads of the packed tensor, fused attention on it.
    if (rope) packed = rotate(packed, positions, *rope, 0, H + Hkv);
    o = attention_qkv(packed, H, Hkv, ao);
  } else {
    Tensor qh, kh, vh, gate;
    if (gated) {
      Tensor qg = reshape(q(x), Shape{B, T, H, 2 * d});
      qh = slice(qg, 3, 0, d);
      gate = reshape(slice(qg, 3, d, 2 * d), Shape{B, T, H * d});
      kh = reshape(k(x), Shape{B, T, Hkv, d});
      vh = reshape(v(x), Shape{B, T, Hkv, d});
    } else if (packed.defined()) {
      qh = slice(packed, 2, 0, H);
      kh = slice(packed, 2, H, H + Hkv);
      vh = slice(packed, 2, H + Hkv, H + 2 * Hkv);
    } else {
      qh = reshape(q(x), Shape{B, T, H, d});
      kh = reshape(k(x), Shape{B, T, Hkv, d});
      vh = reshape(v(x), Shape{B, T, Hkv, d});
    }
    if (q_norm.defined()) qh = q_norm(qh);
    if (k_norm.defined()) kh = k_norm(kh);
    if (rope) {
      qh = rotate(qh, positions, *rope, 0, H);
      kh = rotate(kh, positions, *rope, 0, Hkv);
    }
    if (cache) {
      // Keys and values of the new tokens go to the cache; attention reads all of it.
      const int64_t start = cache->size();
      Tensor& kc = cache->keys(layer);
      Tensor& vc = cache->values(layer);
      {
        NoGradGuard ng;
        Tensor kdst = slice(kc, 1, start, start + T), vdst = slice(vc, 1, start, start + T);
        copy_(kdst, kh);
        copy_(vdst, vh);
      }
      kh = slice(kc, 1, 0, start + T);
      vh = slice(vc, 1, 0, start + T);
      if (kh.dtype() != qh.dtype()) {
        kh = cast(kh, qh.dtype());
        vh = cast(vh, qh.dtype());
      }
    }
    o = attention(qh, kh, vh, ao);
    if (gated) return out(mul(reshape(o, Shape{B, T, H * d}), sigmoid(gate)));
  }
  return out(reshape(o, Shape{B, T, H * d}));
}

}  // namespace toy::nn
