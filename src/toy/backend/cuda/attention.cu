// Fused attention on the GPU, the general form: one warp per query row (forward, dq) or per key
// row (dk, dv), an online softmax over the visible keys, scores never stored. Lane l holds the
// head elements l, l + 32, ... (E of them, E = ceil(head / 32), a template parameter). Simple
// and exact (expf/logf, f32 throughout, the CPU's visibility rules). Heads of at most 64
// elements take the tiled kernels of attention_tiled.cu instead (faster: a warp reduction per
// score is what this form pays).
#include <cuda_runtime.h>

#include <cmath>

#include "toy/backend/cuda/attention_launch.h"
#include "toy/backend/cuda/attention_rules.cuh"
#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ const float* qrow(const AttentionGeometry& g, int64_t b, int64_t t, int64_t h) {
  return g.q + b * g.qs[0] + t * g.qs[1] + h * g.qs[2];
}
__device__ __forceinline__ const float* krow(const AttentionGeometry& g, int64_t b, int64_t s, int64_t hk) {
  return g.k + b * g.ks[0] + s * g.ks[1] + hk * g.ks[2];
}
__device__ __forceinline__ const float* vrow(const AttentionGeometry& g, int64_t b, int64_t s, int64_t hk) {
  return g.v + b * g.vs[0] + s * g.vs[1] + hk * g.vs[2];
}

template <int E>
__device__ __forceinline__ void load_row(const float* p, int64_t n, int lane, float (&r)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = int64_t(e) * 32 + lane;
    r[e] = d < n ? p[d] : 0.0f;
  }
}
template <int E>
__device__ __forceinline__ float dot_row(const float (&a)[E], const float* p, int64_t n, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = int64_t(e) * 32 + lane;
    if (d < n) s += a[e] * p[d];
  }
  return warp_sum(s);
}

template <int E>
__global__ void attention_forward(AttentionGeometry g, float* out, float* lse) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (b, h, i)
  if (row >= g.B * g.H * g.T) return;
  const int64_t i = row % g.T, h = (row / g.T) % g.H, b = row / (g.T * g.H);
  const int64_t hk = h / (g.H / g.Hkv);
  float q[E], acc[E];
  load_row<E>(qrow(g, b, i, h), g.D, lane, q);
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  int64_t first, end;
  key_range(g, i, &first, &end);
  const int32_t my_seg = g.seg ? g.seg[b * g.T + i] : 0;
  for (int64_t j = first; j < end; ++j) {
    if (g.seg && g.seg[b * g.T + j] != my_seg) continue;
    const float s = dot_row<E>(q, krow(g, b, j, hk), g.D, lane) * g.scale;
    const float m_new = fmaxf(m, s);
    const float alpha = expf(m - m_new);  // (0 for the first visible key: m = -inf)
    const float p = expf(s - m_new);
    l = l * alpha + p;
    m = m_new;
    const float* vr = vrow(g, b, j, hk);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t d = int64_t(e) * 32 + lane;
      acc[e] = acc[e] * alpha + (d < g.Dv ? p * vr[d] : 0.0f);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* o = out + ((b * g.T + i) * g.H + h) * g.Dv;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = int64_t(e) * 32 + lane;
    if (d < g.Dv) o[d] = acc[e] * inv;
  }
  if (lane == 0) lse[(b * g.H + h) * g.T + i] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// delta[b, h, i] = dout_i . out_i (the softmax backward's row term).
template <int E>
__global__ void attention_delta(AttentionGeometry g, const float* out, const float* dout, float* delta) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= g.B * g.H * g.T) return;
  const int64_t i = row % g.T, h = (row / g.T) % g.H, b = row / (g.T * g.H);
  const int64_t at = ((b * g.T + i) * g.H + h) * g.Dv;
  float o[E];
  load_row<E>(out + at, g.Dv, lane, o);
  const float s = dot_row<E>(o, dout + at, g.Dv, lane);
  if (lane == 0) delta[(b * g.H + h) * g.T + i] = s;
}

// dq_i = scale * sum_j p_ij (dout_i . v_j - delta_i) k_j, p_ij = exp(scale q_i . k_j - lse_i).
template <int E>
__global__ void attention_dq(AttentionGeometry g, const float* lse, const float* dout, const float* delta, float* dq,
                             int64_t s0, int64_t s1, int64_t s2) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= g.B * g.H * g.T) return;
  const int64_t i = row % g.T, h = (row / g.T) % g.H, b = row / (g.T * g.H);
  const int64_t hk = h / (g.H / g.Hkv);
  const float L = lse[(b * g.H + h) * g.T + i], dl = delta[(b * g.H + h) * g.T + i];
  float q[E], go[E], acc[E];
  load_row<E>(qrow(g, b, i, h), g.D, lane, q);
  load_row<E>(dout + ((b * g.T + i) * g.H + h) * g.Dv, g.Dv, lane, go);
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.0f;
  if (L != -INFINITY) {  // (no visible key: dq = 0)
    int64_t first, end;
    key_range(g, i, &first, &end);
    const int32_t my_seg = g.seg ? g.seg[b * g.T + i] : 0;
    for (int64_t j = first; j < end; ++j) {
      if (g.seg && g.seg[b * g.T + j] != my_seg) continue;
      const float* kr = krow(g, b, j, hk);
      const float p = expf(dot_row<E>(q, kr, g.D, lane) * g.scale - L);
      const float ds = p * (dot_row<E>(go, vrow(g, b, j, hk), g.Dv, lane) - dl);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t d = int64_t(e) * 32 + lane;
        if (d < g.D) acc[e] += ds * kr[d];
      }
    }
  }
  float* o = dq + b * s0 + i * s1 + h * s2;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = int64_t(e) * 32 + lane;
    if (d < g.D) o[d] = acc[e] * g.scale;
  }
}

// dk_j = scale * sum_{h in group, i} ds_ij q_i and dv_j = sum p_ij dout_i: one warp per key row,
// so each row of dK/dV has one writer (deterministic, no atomics).
template <int E>
__global__ void attention_dkv(AttentionGeometry g, const float* lse, const float* dout, const float* delta, float* dk,
                              int64_t k0, int64_t k1, int64_t k2, float* dv, int64_t v0, int64_t v1, int64_t v2) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (b, hk, j)
  if (row >= g.B * g.Hkv * g.S) return;
  const int64_t j = row % g.S, hk = (row / g.S) % g.Hkv, b = row / (g.S * g.Hkv);
  const int64_t group = g.H / g.Hkv;
  float kk[E], vv[E], ak[E], av[E];
  load_row<E>(krow(g, b, j, hk), g.D, lane, kk);
  load_row<E>(vrow(g, b, j, hk), g.Dv, lane, vv);
#pragma unroll
  for (int e = 0; e < E; ++e) ak[e] = 0.0f, av[e] = 0.0f;
  int64_t first, end;
  query_range(g, j, &first, &end);
  const int32_t key_seg = g.seg ? g.seg[b * g.T + j] : 0;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i = first; i < end; ++i) {
      if (g.seg && g.seg[b * g.T + i] != key_seg) continue;
      const float L = lse[(b * g.H + h) * g.T + i];
      if (L == -INFINITY) continue;
      const float* qr = qrow(g, b, i, h);
      const float* gr = dout + ((b * g.T + i) * g.H + h) * g.Dv;
      const float p = expf(dot_row<E>(kk, qr, g.D, lane) * g.scale - L);
      const float ds = p * (dot_row<E>(vv, gr, g.Dv, lane) - delta[(b * g.H + h) * g.T + i]);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t d = int64_t(e) * 32 + lane;
        if (d < g.D) ak[e] += ds * qr[d];
        if (d < g.Dv) av[e] += p * gr[d];
      }
    }
  }
  float* ok = dk + b * k0 + j * k1 + hk * k2;
  float* ov = dv + b * v0 + j * v1 + hk * v2;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t d = int64_t(e) * 32 + lane;
    if (d < g.D) ok[d] = ak[e] * g.scale;
    if (d < g.Dv) ov[d] = av[e];
  }
}

cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }
unsigned blocks_for_rows(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// Calls f with the lanes' slot count E for a head of n elements.
template <class F>
void with_slots(int64_t n, F&& f) {
  if (n <= 32) f(std::integral_constant<int, 1>{});
  else if (n <= 64) f(std::integral_constant<int, 2>{});
  else if (n <= 128) f(std::integral_constant<int, 4>{});
  else if (n <= 256) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 16>{});
}

}  // namespace

void launch_attention(const AttentionGeometry& g, float* out, float* lse) {
  const int64_t rows = g.B * g.H * g.T;
  if (rows == 0) return;
  if (attention_tiled_fits(g)) return launch_attention_tiled(g, out, lse);
  with_slots(g.D > g.Dv ? g.D : g.Dv, [&](auto e) {
    attention_forward<decltype(e)::value><<<blocks_for_rows(rows), 32 * kWarpsPerBlock, 0, stream()>>>(g, out, lse);
  });
}

void launch_attention_backward(const AttentionGeometry& g, const float* out, const float* lse, const float* dout,
                               float* delta, float* dq, const int64_t dq_s[3], float* dk, const int64_t dk_s[3],
                               float* dv, const int64_t dv_s[3]) {
  const int64_t qrows = g.B * g.H * g.T, krows = g.B * g.Hkv * g.S;
  with_slots(g.D > g.Dv ? g.D : g.Dv, [&](auto e) {
    constexpr int E = decltype(e)::value;
    if (qrows > 0)
      attention_delta<E><<<blocks_for_rows(qrows), 32 * kWarpsPerBlock, 0, stream()>>>(g, out, dout, delta);
    if (attention_tiled_fits(g))
      return launch_attention_backward_tiled(g, lse, dout, delta, dq, dq_s, dk, dk_s, dv, dv_s);
    if (qrows > 0) {
      attention_dq<E><<<blocks_for_rows(qrows), 32 * kWarpsPerBlock, 0, stream()>>>(g, lse, dout, delta, dq, dq_s[0],
                                                                                    dq_s[1], dq_s[2]);
    }
    if (krows > 0)
      attention_dkv<E><<<blocks_for_rows(krows), 32 * kWarpsPerBlock, 0, stream()>>>(
          g, lse, dout, delta, dk, dk_s[0], dk_s[1], dk_s[2], dv, dv_s[0], dv_s[1], dv_s[2]);
  });
}

}  // namespace toy::cuda
