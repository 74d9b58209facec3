#include "toy/nn/attention.h"

#include <tuple>
#include <utility>
#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"

namespace toy::nn {

namespace {
// RoPE on heads [h0, h1) of x [B, T, heads, d].
Tensor rotate(const Tensor& x, const Tensor& positions, RopeOptions o, int64_t h0, int64_t h1) {
  o.heads_begin = h0;
  o.heads_end = h1;
  return rope(x, positions, o);
}
}  // namespace

AttentionOptions Attention::options() const {
  AttentionOptions ao;
  ao.causal = causal;
  ao.window = window;
  ao.scale = scale;
  return ao;
}

Attention::Heads Attention::heads_of(const Tensor& x, const Tensor& positions, int64_t context, Tensor packed) const {
  const int64_t B = x.size(0), T = x.size(1), H = heads, Hkv = kv_heads, d = head_dim;
  Heads h;
  if (!packed.defined() && qkv.defined()) packed = reshape(qkv(x), Shape{B, T, H + 2 * Hkv, d});
  if (gated) {
    Tensor qg = reshape(q(x), Shape{B, T, H, 2 * d});
    h.q = slice(qg, 3, 0, d);
    h.gate = reshape(slice(qg, 3, d, 2 * d), Shape{B, T, H * d});
    h.k = reshape(k(x), Shape{B, T, Hkv, d});
    h.v = reshape(v(x), Shape{B, T, Hkv, d});
  } else if (packed.defined()) {
    h.q = slice(packed, 2, 0, H);
    h.k = slice(packed, 2, H, H + Hkv);
    h.v = slice(packed, 2, H + Hkv, H + 2 * Hkv);
  } else {
    h.q = reshape(q(x), Shape{B, T, H, d});
    h.k = reshape(k(x), Shape{B, T, Hkv, d});
    h.v = reshape(v(x), Shape{B, T, Hkv, d});
  }
  if (norm_whole) {
    h.q = reshape(q_norm(reshape(h.q, Shape{B, T, H * d})), Shape{B, T, H, d});
    h.k = reshape(k_norm(reshape(h.k, Shape{B, T, Hkv * d})), Shape{B, T, Hkv, d});
  } else {
    if (q_norm.defined()) h.q = q_norm(h.q);
    if (k_norm.defined()) h.k = k_norm(h.k);
  }
  if (const auto& r = rope_for(context)) {
    h.q = rotate(h.q, positions, *r, 0, H);
    h.k = rotate(h.k, positions, *r, 0, Hkv);
  }
  return h;
}

namespace {
// Writes the new keys and values k, v [1, T, Hkv, d] after what `cache` (one sequence) holds
// for `layer`; returns every cached key and value of that sequence, in `dtype` (q's).
std::pair<Tensor, Tensor> append_to_cache(KVCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                                          DType dtype) {
  const int64_t start = cache.size(), T = k.size(1);
  Tensor& kc = cache.keys(layer);
  Tensor& vc = cache.values(layer);
  {
    NoGradGuard ng;
    Tensor kdst = slice(kc, 1, start, start + T), vdst = slice(vc, 1, start, start + T);
    copy_(kdst, k);
    copy_(vdst, v);
  }
  Tensor kh = slice(kc, 1, 0, start + T), vh = slice(vc, 1, 0, start + T);
  if (kh.dtype() != dtype) kh = cast(kh, dtype), vh = cast(vh, dtype);
  return {kh, vh};
}
// Copies rows [0, n) of src [1, n, Hkv, d] to the ring dst [1, R, Hkv, d], row i to slot
// (first + i) % R (n <= R: at most two runs).
void write_ring(Tensor& dst, const Tensor& src, int64_t first) {
  NoGradGuard ng;
  const int64_t R = dst.size(1), n = src.size(1), s0 = first % R, head = std::min(n, R - s0);
  Tensor a = slice(dst, 1, s0, s0 + head);
  copy_(a, slice(src, 1, 0, head));
  if (head < n) {
    Tensor b = slice(dst, 1, 0, n - head);
    copy_(b, slice(src, 1, head, n));
  }
}

// Rows for positions [first, first + n) of a ring [1, R, Hkv, d] (n <= R), oldest first.
Tensor read_ring(const Tensor& ring, int64_t first, int64_t n) {
  const int64_t R = ring.size(1), s0 = first % R, head = std::min(n, R - s0);
  if (head == n) return slice(ring, 1, s0, s0 + n);
  return concat({slice(ring, 1, s0, R), slice(ring, 1, 0, n - head)}, 1);
}

// A sliding layer's ring (R = window slots, position p at slot p % R): writes the new keys and
// values k, v [1, T, Hkv, d] and returns those the new queries attend over, in an order the
// kernel's causal-and-window mask reads right. One new token: every slot that holds a
// position, in slot order (each is within its window, and a softmax does not depend on the
// keys' order). Several: the cached positions the first new query still sees (up to
// window - 1, oldest first), then the new ones.
std::pair<Tensor, Tensor> append_to_ring(KVCache& cache, int64_t layer, const Tensor& k, const Tensor& v,
                                         DType dtype) {
  const int64_t start = cache.size(), T = k.size(1), R = cache.slots(layer);
  Tensor& kc = cache.keys(layer);
  Tensor& vc = cache.values(layer);
  auto as = [&](const Tensor& t) { return t.dtype() == dtype ? t : cast(t, dtype); };
  if (T == 1) {
    write_ring(kc, k, start);
    write_ring(vc, v, start);
    const int64_t n = std::min(start + 1, R);
    return {as(slice(kc, 1, 0, n)), as(slice(vc, 1, 0, n))};
  }
  const int64_t m = std::min(start, R - 1);  // cached positions the first new query sees
  // The new keys and values as the cache holds them (an F16 cache rounds them), as every
  // other path reads them back from the cache.
  Tensor kh = kc.dtype() == k.dtype() ? k : as(cast(k, kc.dtype()));
  Tensor vh = vc.dtype() == v.dtype() ? v : as(cast(v, vc.dtype()));
  if (m > 0) {
    kh = concat({as(read_ring(kc, start - m, m)), kh}, 1);
    vh = concat({as(read_ring(vc, start - m, m)), vh}, 1);
  }
  const int64_t keep = std::min(T, R);  // (the new positions the ring keeps)
  write_ring(kc, slice(k, 1, T - keep, T), start + T - keep);
  write_ring(vc, slice(v, 1, T - keep, T), start + T - keep);
  return {kh, vh};
}

// The keys and values the new queries attend over, after writing the new ones to the cache.
std::pair<Tensor, Tensor> append(KVCache& cache, int64_t layer, const Tensor& k, const Tensor& v, DType dtype) {
  return cache.ring(layer) ? append_to_ring(cache, layer, k, v, dtype) : append_to_cache(cache, layer, k, v, dtype);
}
}  // namespace

Tensor Attention::output(const Tensor& o, const Tensor& gate) const {
  const int64_t B = o.size(0), T = o.size(1);
  Tensor flat = reshape(o, Shape{B, T, heads * head_dim});
  return out(gated ? mul(flat, sigmoid(gate)) : flat);
}

Tensor Attention::operator()(const Tensor& x, const Tensor& positions, KVCache* cache, int64_t layer,
                             const Tensor& segments) const {
  const int64_t B = x.size(0), T = x.size(1), H = heads, Hkv = kv_heads, d = head_dim;
  AttentionOptions ao = options();
  ao.segments = segments;
  const int64_t context = cache ? cache->capacity() : T;
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
  if (packed.defined() && !cache && !q_norm.defined()) {
    // The training path: RoPE on the q and k heads of the packed tensor, fused attention on it.
    if (const auto& r = rope_for(context)) packed = rotate(packed, positions, *r, 0, H + Hkv);
    return output(attention_qkv(packed, H, Hkv, ao), Tensor());
  }
  Heads h = heads_of(x, positions, context, packed);
  if (cache) std::tie(h.k, h.v) = append(*cache, layer, h.k, h.v, h.q.dtype());
  return output(attention(h.q, h.k, h.v, ao), h.gate);
}

Tensor Attention::step(const Tensor& x, const Tensor& positions, std::span<KVCache* const> caches,
                       int64_t layer) const {
  const int64_t N = x.size(0);
  TOY_CHECK(int64_t(caches.size()) == N, "[attention] {} caches for a batch of {}", caches.size(), N);
  const AttentionOptions ao = options();
  // One projection for every sequence (a GEMM), then each attends over its own cache (of one
  // capacity: the server makes them alike; the first decides LongRoPE's factors), all in one
  // attention_decode call.
  const Heads h = heads_of(x, positions, caches.empty() ? 0 : caches[0]->capacity());
  std::vector<Tensor> ks, vs;
  ks.reserve(size_t(N)), vs.reserve(size_t(N));
  for (int64_t i = 0; i < N; ++i) {
    KVCache& c = *caches[size_t(i)];
    // An F16 cache is handed over as it is (attention_decode reads F16 keys and values): no
    // F32 copy of the whole cache each step.
    const DType kv = c.keys(layer).dtype() == DType::F16 && h.q.dtype() == DType::F32 ? DType::F16 : h.q.dtype();
    auto [kh, vh] = append(c, layer, slice(h.k, 0, i, i + 1), slice(h.v, 0, i, i + 1), kv);
    ks.push_back(std::move(kh)), vs.push_back(std::move(vh));
  }
  return output(attention_decode(h.q, ks, vs, ao), h.gate);
}

Tensor Attention::prefill(const Tensor& x, const Tensor& positions, std::span<KVCache* const> caches,
                          std::span<const int64_t> lengths, int64_t layer) const {
  TOY_CHECK(x.size(0) == 1 && !caches.empty() && caches.size() == lengths.size(),
            "[attention] prefill takes one row of tokens and a length per cache, got {} rows, {} caches, {} lengths",
            x.size(0), caches.size(), lengths.size());
  const AttentionOptions ao = options();
  const Heads h = heads_of(x, positions, caches[0]->capacity());
  std::vector<Tensor> outs;
  outs.reserve(caches.size());
  int64_t at = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    const int64_t T = lengths[i];
    auto [kh, vh] = append(*caches[i], layer, slice(h.k, 1, at, at + T), slice(h.v, 1, at, at + T), h.q.dtype());
    outs.push_back(attention(slice(h.q, 1, at, at + T), kh, vh, ao));
    at += T;
  }
  TOY_CHECK(at == x.size(1), "[attention] prefill lengths add up to {}, the rows are {}", at, x.size(1));
  return output(outs.size() == 1 ? outs[0] : concat(outs, 1), h.gate);
}

}  // namespace toy::nn
