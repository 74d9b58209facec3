// Fused attention on the GPU, tiled form (heads of at most 64 elements: GPT-2, SmolLM, Qwen2.5,
// Llama 3.2): a block takes 32 query rows (forward, dq) or 32 keys (dk, dv) of one head and
// walks the other side in tiles of 32 staged in shared memory, so each K/V (or Q/dO) row is
// read from global memory once per tile of 32 rows instead of once per row, and a score costs
// no warp reduction. 256 threads as 16 x 16: thread (ty, tx) owns rows 2ty, 2ty + 1 and
// columns 2tx, 2tx + 1 of a 32 x 32 score tile, and dims 4tx .. 4tx + 3 of its two output rows.
// The same visibility rules as attention.cu's warp kernels (causal with S - T offset, window,
// segments, GQA, non-causal), f32 throughout with expf/logf; only the summation order differs.
// The backward recomputes the probabilities from lse (FlashAttention-2): dq in one kernel and
// dk/dv in another, so every output row has one writer (deterministic, no atomics).
#include <cuda_runtime.h>

#include <cmath>

#include "toy/backend/cuda/attention_launch.h"
#include "toy/backend/cuda/attention_rules.cuh"
#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

namespace {

constexpr int kTile = 32;          // query rows and keys per tile
constexpr int kHead = 64;          // head elements a tile row holds (zero-padded past D / Dv)
constexpr int kRow = kHead + 1;    // shared row stride: column reads across tx hit distinct banks
constexpr int kPRow = kTile + 1;   // shared stride of a score tile's rows
constexpr int kThreads = 256;

// The sum and max over the 16 threads (tx) sharing a row: lanes 0-15 and 16-31 of a warp are
// two rows' groups, so the butterfly stays inside each half.
__device__ __forceinline__ float row_max(float x) {
  for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Rows [r0, r0 + kTile) of a [rows, n]-shaped operand into tile[kTile][kRow]: row r at
// base + r * row_stride, zeros past `rows` and past n.
__device__ __forceinline__ void load_tile(float* tile, const float* base, int64_t row_stride, int64_t r0,
                                          int64_t rows, int64_t n) {
  for (int e = threadIdx.x; e < kTile * kHead; e += kThreads) {
    const int r = e / kHead, d = e % kHead;
    const int64_t row = r0 + r;
    tile[r * kRow + d] = (row < rows && d < n) ? base[row * row_stride + d] : 0.0f;
  }
}

// s[r][c] += a[2ty + r] . b[2tx + c] over the padded head (tiles of kRow rows).
__device__ __forceinline__ void tile_dots(const float* a, const float* b, int ty, int tx, float (&s)[2][2]) {
#pragma unroll 16
  for (int d = 0; d < kHead; ++d) {
    const float a0 = a[(2 * ty) * kRow + d], a1 = a[(2 * ty + 1) * kRow + d];
    const float b0 = b[(2 * tx) * kRow + d], b1 = b[(2 * tx + 1) * kRow + d];
    s[0][0] += a0 * b0, s[0][1] += a0 * b1;
    s[1][0] += a1 * b0, s[1][1] += a1 * b1;
  }
}

// acc[r][e] += sum_c p[2ty + r][c] * m[c][4tx + e]: a score tile times a tile of rows.
__device__ __forceinline__ void tile_accumulate(const float* p, const float* m, int ty, int tx, float (&acc)[2][4]) {
#pragma unroll 8
  for (int c = 0; c < kTile; ++c) {
    const float p0 = p[(2 * ty) * kPRow + c], p1 = p[(2 * ty + 1) * kPRow + c];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float v = m[c * kRow + 4 * tx + e];
      acc[0][e] += p0 * v;
      acc[1][e] += p1 * v;
    }
  }
}

// A thread's two rows (2ty, 2ty + 1 of the tile at r0): which exist, the range of the other
// side each may see (keys of a query, or queries of a key in dk/dv), and each one's segment.
struct RowPair {
  bool valid[2];
  int64_t first[2], end[2];
  int32_t seg[2];
};
template <bool kKeyRows>
__device__ __forceinline__ RowPair row_pair(const AttentionGeometry& g, int64_t b, int64_t r0, int ty) {
  RowPair p;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = r0 + 2 * ty + r;
    p.valid[r] = i < (kKeyRows ? g.S : g.T);
    p.first[r] = p.end[r] = 0;
    if (p.valid[r]) {
      if constexpr (kKeyRows)
        query_range(g, i, &p.first[r], &p.end[r]);
      else
        key_range(g, i, &p.first[r], &p.end[r]);
    }
    p.seg[r] = g.seg && p.valid[r] ? g.seg[b * g.T + i] : 0;
  }
  return p;
}

// The keys a tile of queries at i0 may see: from its first row's first visible key to its
// last row's end (the bounds grow with the row); and the queries a tile of keys at j0 may
// be seen by.
__device__ __forceinline__ void tile_keys(const AttentionGeometry& g, int64_t i0, int64_t* first, int64_t* end) {
  int64_t unused;
  key_range(g, i0, first, &unused);
  key_range(g, imin(i0 + kTile, g.T) - 1, &unused, end);
}
__device__ __forceinline__ void tile_queries(const AttentionGeometry& g, int64_t j0, int64_t* first, int64_t* end) {
  int64_t unused;
  query_range(g, j0, first, &unused);
  query_range(g, imin(j0 + kTile, g.S) - 1, &unused, end);
}

// The keys [j0, j0 + kTile) of head hk into Ks and Vs (zeros from kend on), and their segments.
__device__ __forceinline__ void load_key_tile(const AttentionGeometry& g, int64_t b, int64_t hk, int64_t j0,
                                              int64_t kend, float* Ks, float* Vs, int32_t* seg_k) {
  load_tile(Ks, g.k + b * g.ks[0] + hk * g.ks[2], g.ks[1], j0, kend, g.D);
  load_tile(Vs, g.v + b * g.vs[0] + hk * g.vs[2], g.vs[1], j0, kend, g.Dv);
  if (threadIdx.x < kTile) seg_k[threadIdx.x] = g.seg && j0 + threadIdx.x < kend ? g.seg[b * g.T + j0 + threadIdx.x] : 0;
}

__global__ void __launch_bounds__(kThreads) attention_forward_tiled(AttentionGeometry g, float* out, float* lse) {
  __shared__ float Qs[kTile * kRow], Ks[kTile * kRow], Vs[kTile * kRow], Ps[kTile * kPRow];
  __shared__ int32_t seg_k[kTile];
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t tiles = (g.T + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bh / g.H, h = bh % g.H, hk = h / (g.H / g.Hkv);
  load_tile(Qs, g.q + b * g.qs[0] + h * g.qs[2], g.qs[1], i0, g.T, g.D);

  const RowPair rows = row_pair<false>(g, b, i0, ty);
  float m[2], l[2], acc[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;
  }
  int64_t kfirst, kend;
  tile_keys(g, i0, &kfirst, &kend);

  for (int64_t j0 = kfirst; j0 < kend; j0 += kTile) {
    __syncthreads();  // (the last tile's readers are done)
    load_key_tile(g, b, hk, j0, kend, Ks, Vs, seg_k);
    __syncthreads();
    float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    tile_dots(Qs, Ks, ty, tx, s);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t j = j0 + 2 * tx + c;
        const bool vis = rows.valid[r] && j >= rows.first[r] && j < rows.end[r] && (!g.seg || seg_k[2 * tx + c] == rows.seg[r]);
        s[r][c] = vis ? s[r][c] * g.scale : -INFINITY;
      }
      const float m_new = fmaxf(m[r], row_max(fmaxf(s[r][0], s[r][1])));
      // (nothing visible yet: m_new = -inf, every p 0 and the accumulators stay 0)
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      const float p0 = m_new == -INFINITY ? 0.0f : expf(s[r][0] - m_new);
      const float p1 = m_new == -INFINITY ? 0.0f : expf(s[r][1] - m_new);
      l[r] = l[r] * alpha + row_sum(p0 + p1);
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][e] *= alpha;
      Ps[(2 * ty + r) * kPRow + 2 * tx] = p0;
      Ps[(2 * ty + r) * kPRow + 2 * tx + 1] = p1;
    }
    __syncthreads();
    tile_accumulate(Ps, Vs, ty, tx, acc);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows.valid[r]) continue;
    const int64_t i = i0 + 2 * ty + r;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* o = out + ((b * g.T + i) * g.H + h) * g.Dv;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (4 * tx + e < g.Dv) o[4 * tx + e] = acc[r][e] * inv;
    if (tx == 0) lse[(b * g.H + h) * g.T + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// dq_i = scale * sum_j p_ij (dout_i . v_j - delta_i) k_j.
__global__ void __launch_bounds__(kThreads)
    attention_dq_tiled(AttentionGeometry g, const float* lse, const float* dout, const float* delta, float* dq,
                       int64_t s0, int64_t s1, int64_t s2) {
  __shared__ float Qs[kTile * kRow], Gs[kTile * kRow], Ks[kTile * kRow], Vs[kTile * kRow], Ds[kTile * kPRow];
  __shared__ int32_t seg_k[kTile];
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t tiles = (g.T + kTile - 1) / kTile;
  const int64_t bh = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bh / g.H, h = bh % g.H, hk = h / (g.H / g.Hkv);
  load_tile(Qs, g.q + b * g.qs[0] + h * g.qs[2], g.qs[1], i0, g.T, g.D);
  load_tile(Gs, dout + (b * g.T * g.H + h) * g.Dv, g.H * g.Dv, i0, g.T, g.Dv);

  const RowPair rows = row_pair<false>(g, b, i0, ty);
  float L[2], dl[2], acc[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + 2 * ty + r;
    L[r] = rows.valid[r] ? lse[(b * g.H + h) * g.T + i] : -INFINITY;
    dl[r] = rows.valid[r] ? delta[(b * g.H + h) * g.T + i] : 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[r][e] = 0.0f;
  }
  int64_t kfirst, kend;
  tile_keys(g, i0, &kfirst, &kend);

  for (int64_t j0 = kfirst; j0 < kend; j0 += kTile) {
    __syncthreads();
    load_key_tile(g, b, hk, j0, kend, Ks, Vs, seg_k);
    __syncthreads();
    float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, dp[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    tile_dots(Qs, Ks, ty, tx, s);
    tile_dots(Gs, Vs, ty, tx, dp);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t j = j0 + 2 * tx + c;
        const bool vis = rows.valid[r] && L[r] != -INFINITY && j >= rows.first[r] && j < rows.end[r] &&
                         (!g.seg || seg_k[2 * tx + c] == rows.seg[r]);
        const float p = vis ? expf(s[r][c] * g.scale - L[r]) : 0.0f;
        Ds[(2 * ty + r) * kPRow + 2 * tx + c] = p * (dp[r][c] - dl[r]);
      }
    __syncthreads();
    tile_accumulate(Ds, Ks, ty, tx, acc);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows.valid[r]) continue;
    float* o = dq + b * s0 + (i0 + 2 * ty + r) * s1 + h * s2;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (4 * tx + e < g.D) o[4 * tx + e] = acc[r][e] * g.scale;
  }
}

// dk_j = scale * sum_{h in group, i} ds_ij q_i and dv_j = sum p_ij dout_i, for 32 keys a block.
__global__ void __launch_bounds__(kThreads)
    attention_dkv_tiled(AttentionGeometry g, const float* lse, const float* dout, const float* delta, float* dk,
                        int64_t k0, int64_t k1, int64_t k2, float* dv, int64_t v0, int64_t v1, int64_t v2) {
  __shared__ float Ks[kTile * kRow], Vs[kTile * kRow], Qs[kTile * kRow], Gs[kTile * kRow];
  __shared__ float Ps[kTile * kPRow], Ds[kTile * kPRow];
  __shared__ float Lq[kTile], Dq[kTile];
  __shared__ int32_t seg_q[kTile];
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  const int64_t tiles = (g.S + kTile - 1) / kTile;
  const int64_t bk = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kTile;
  const int64_t b = bk / g.Hkv, hk = bk % g.Hkv, group = g.H / g.Hkv;
  load_tile(Ks, g.k + b * g.ks[0] + hk * g.ks[2], g.ks[1], j0, g.S, g.D);
  load_tile(Vs, g.v + b * g.vs[0] + hk * g.vs[2], g.vs[1], j0, g.S, g.Dv);

  const RowPair rows = row_pair<true>(g, b, j0, ty);
  float ak[2][4], av[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int e = 0; e < 4; ++e) ak[r][e] = av[r][e] = 0.0f;
  }
  int64_t qfirst, qend;
  tile_queries(g, j0, &qfirst, &qend);

  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = qfirst; i0 < qend; i0 += kTile) {
      __syncthreads();
      load_tile(Qs, g.q + b * g.qs[0] + h * g.qs[2], g.qs[1], i0, qend, g.D);
      load_tile(Gs, dout + (b * g.T * g.H + h) * g.Dv, g.H * g.Dv, i0, qend, g.Dv);
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        const bool in = i < qend;
        Lq[threadIdx.x] = in ? lse[(b * g.H + h) * g.T + i] : -INFINITY;
        Dq[threadIdx.x] = in ? delta[(b * g.H + h) * g.T + i] : 0.0f;
        seg_q[threadIdx.x] = g.seg && in ? g.seg[b * g.T + i] : 0;
      }
      __syncthreads();
      // Scores transposed: rows are this block's keys, columns the tile's queries.
      float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, dp[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      tile_dots(Ks, Qs, ty, tx, s);
      tile_dots(Vs, Gs, ty, tx, dp);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int q = 2 * tx + c;
          const int64_t i = i0 + q;
          const bool vis = rows.valid[r] && Lq[q] != -INFINITY && i >= rows.first[r] && i < rows.end[r] &&
                           (!g.seg || seg_q[q] == rows.seg[r]);
          const float p = vis ? expf(s[r][c] * g.scale - Lq[q]) : 0.0f;
          Ps[(2 * ty + r) * kPRow + q] = p;
          Ds[(2 * ty + r) * kPRow + q] = p * (dp[r][c] - Dq[q]);
        }
      __syncthreads();
      tile_accumulate(Ps, Gs, ty, tx, av);
      tile_accumulate(Ds, Qs, ty, tx, ak);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!rows.valid[r]) continue;
    const int64_t j = j0 + 2 * ty + r;
    float* ok = dk + b * k0 + j * k1 + hk * k2;
    float* ov = dv + b * v0 + j * v1 + hk * v2;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (4 * tx + e < g.D) ok[4 * tx + e] = ak[r][e] * g.scale;
      if (4 * tx + e < g.Dv) ov[4 * tx + e] = av[r][e];
    }
  }
}

cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

}  // namespace

bool attention_tiled_fits(const AttentionGeometry& g) { return g.D <= kHead && g.Dv <= kHead; }

void launch_attention_tiled(const AttentionGeometry& g, float* out, float* lse) {
  const int64_t blocks = g.B * g.H * ((g.T + kTile - 1) / kTile);
  if (blocks > 0) attention_forward_tiled<<<unsigned(blocks), kThreads, 0, stream()>>>(g, out, lse);
}

void launch_attention_backward_tiled(const AttentionGeometry& g, const float* lse, const float* dout,
                                     const float* delta, float* dq, const int64_t dq_s[3], float* dk,
                                     const int64_t dk_s[3], float* dv, const int64_t dv_s[3]) {
  const int64_t qblocks = g.B * g.H * ((g.T + kTile - 1) / kTile);
  const int64_t kblocks = g.B * g.Hkv * ((g.S + kTile - 1) / kTile);
  if (qblocks > 0)
    attention_dq_tiled<<<unsigned(qblocks), kThreads, 0, stream()>>>(g, lse, dout, delta, dq, dq_s[0], dq_s[1],
                                                                      dq_s[2]);
  if (kblocks > 0)
    attention_dkv_tiled<<<unsigned(kblocks), kThreads, 0, stream()>>>(g, lse, dout, delta, dk, dk_s[0], dk_s[1],
                                                                       dk_s[2], dv, dv_s[0], dv_s[1], dv_s[2]);
}

}  // namespace toy::cuda
