#include "toy/nn/short_conv.h"

#include <vector>

#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/ops/ops.h"

namespace toy::nn {

Tensor causal_conv(const Tensor& x, const Tensor& w, Tensor* tail) {
  if (!tail) return conv1d(x, w);
  const int64_t T = x.size(1), K = w.size(1);
  if (K == 1) return ssm_conv(x, w);
  // The conv reads the last K - 1 inputs first; they become the last K - 1 of these.
  Tensor in = concat({*tail, x}, 1);  // [B, K - 1 + T, C]
  Tensor y = ssm_conv(in, w);
  NoGradGuard ng;
  copy_(*tail, contiguous(slice(in, 1, T, T + K - 1)));
  return y;
}

RecurrentShape ShortConv::state_shape() const { return {kernel() - 1, conv.size(0), Shape{}}; }

Tensor ShortConv::operator()(const Tensor& h, KVCache* cache, int64_t layer) const {
  return forward(h, cache ? &cache->conv_tail(layer) : nullptr);
}

Tensor ShortConv::step(const Tensor& h, std::span<KVCache* const> caches, int64_t layer) const {
  const int64_t N = h.size(0);
  TOY_CHECK(int64_t(caches.size()) == N, "[short conv] {} caches for a batch of {}", caches.size(), N);
  if (N == 1) return (*this)(h, caches[0], layer);
  // The rows' conv tails side by side, one batched layer, then each row's back.
  std::vector<Tensor> tails;
  for (KVCache* c : caches) tails.push_back(c->conv_tail(layer));
  Tensor tail = concat(tails, 0);
  Tensor y = forward(h, &tail);
  NoGradGuard ng;
  for (int64_t i = 0; i < N; ++i) copy_(caches[size_t(i)]->conv_tail(layer), slice(tail, 0, i, i + 1));
  return y;
}

Tensor ShortConv::forward(const Tensor& h, Tensor* tail) const {
  const int64_t D = conv.size(0);
  Tensor bcx = in_proj(h);  // [B, T, 3D]: b, c, x
  Tensor bx = mul(slice(bcx, 2, 0, D), slice(bcx, 2, 2 * D, 3 * D));
  Tensor y = mul(slice(bcx, 2, D, 2 * D), causal_conv(bx, conv, tail));
  return out_proj(y);
}

}  // namespace toy::nn
