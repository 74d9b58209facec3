// The attention kernels' launchers, in plain types (attention.cu; glue_attention.cpp fills
// the geometry from tensors). The layout is the CPU kernel's (backend/cpu/attention.cpp):
// q [B, T, H, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv] with unit last stride and free other
// strides; head h reads K/V head h / (H / Hkv). Key j is visible to query i when causal ->
// j <= i + (S - T), a window W -> also i + (S - T) - j < W, segments -> the same segment id.
#pragma once
#include <cstdint>

namespace toy::cuda {

struct AttentionGeometry {
  int64_t B = 0, T = 0, H = 0, D = 0, S = 0, Hkv = 0, Dv = 0;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t qs[3] = {}, ks[3] = {}, vs[3] = {};  // strides of dims 0..2 (the last is 1)
  const int32_t* seg = nullptr;                // [B, T] (T == S) or null
  float scale = 1.0f;
  bool causal = true;
  int64_t window = 0;  // 0: none (only with causal)
};

// The largest head size (D and Dv) the kernels take: a warp holds a row, 16 values a lane.
inline constexpr int64_t kAttentionMaxHead = 512;

// out [B, T, H, Dv] and lse [B, H, T] contiguous (lse = -inf and out = 0 where no key is visible).
void launch_attention(const AttentionGeometry& g, float* out, float* lse);

// dq [B, T, H, D], dk [B, S, Hkv, D], dv [B, S, Hkv, Dv] with unit last stride and the given
// strides of dims 0..2 ("=": every element written); out and dout contiguous [B, T, H, Dv];
// delta is scratch of B * H * T floats.
void launch_attention_backward(const AttentionGeometry& g, const float* out, const float* lse, const float* dout,
                               float* delta, float* dq, const int64_t dq_s[3], float* dk, const int64_t dk_s[3],
                               float* dv, const int64_t dv_s[3]);

// The tiled kernels (attention_tiled.cu), which the launchers above choose for heads of at
// most 64 elements (D and Dv); larger heads take the warp-per-row kernels (attention.cu).
bool attention_tiled_fits(const AttentionGeometry& g);
void launch_attention_tiled(const AttentionGeometry& g, float* out, float* lse);
// dq, dk, dv as launch_attention_backward's, delta already computed.
void launch_attention_backward_tiled(const AttentionGeometry& g, const float* lse, const float* dout,
                                     const float* delta, float* dq, const int64_t dq_s[3], float* dk,
                                     const int64_t dk_s[3], float* dv, const int64_t dv_s[3]);

}  // namespace toy::cuda
