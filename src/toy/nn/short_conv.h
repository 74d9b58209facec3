// nn::ShortConv — LFM2's gated short convolution, as llama.cpp's lfm2 graph computes it (GGUF
// names in brackets):
//   b, c, x = the three D-wide parts of W_in h [shortconv.in_proj, 3D x D]
//   y = W_out (c * causal depthwise conv(b * x)) [shortconv.conv, D x L; shortconv.out_proj]
// The conv has L taps (lfm2.shortconv.l_cache), the last multiplying the current token. With a
// cache it continues from the layer's last L - 1 inputs (b * x) and leaves them updated, so a
// token costs the same at any position; the cache keeps nothing else for the layer.
#pragma once
#include <cstdint>
#include <span>

#include "toy/nn/kv_cache.h"
#include "toy/nn/linear.h"

namespace toy::nn {

struct ShortConv {
  Linear in_proj, out_proj;
  Tensor conv;  // [D, L]

  int64_t kernel() const { return conv.size(1); }
  // What a cache keeps for this layer: the conv's last L - 1 inputs.
  RecurrentShape state_shape() const;
  // h [B, T, D] -> [B, T, D].
  Tensor operator()(const Tensor& h, KVCache* cache = nullptr, int64_t layer = 0) const;
  // One step of several sequences (row i of h [N, T, D] continues caches[i]): the projections
  // run once for all rows.
  Tensor step(const Tensor& h, std::span<KVCache* const> caches, int64_t layer) const;

 private:
  // With a tail (batch rows matching h), continues it and leaves it updated.
  Tensor forward(const Tensor& h, Tensor* tail) const;
};

// The causal depthwise conv of x [B, T, C] by w [C, K]: from zeros (tail null), or continuing
// tail [B, K - 1, C] (the inputs before x), which is left holding x's last K - 1 inputs.
// (Gated DeltaNet's and the short conv's shared step.)
Tensor causal_conv(const Tensor& x, const Tensor& w, Tensor* tail);

}  // namespace toy::nn
