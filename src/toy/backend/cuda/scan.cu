// The recurrent kernels on the GPU, first form: the Mamba-2 selective scan and the gated delta
// rule, forward and backward, walking tokens in order as the CPU's token-by-token algorithms do
// (backend/cpu/ssm.cpp, gated_delta.cpp), f32 throughout, expf/log1pf as the CPU.
//
// Mamba-2 scan. Each state row (b, h, p) evolves alone: s <- a s + dtp x_p B. The forward gives
// a warp to a row (lane l holds n = l, l + 32, ... in registers) and sums y = s.C across the
// warp. The backward runs one block per (b, h): each warp walks rows of that head. It first
// records the state every kSsmSpan tokens, then per span in reverse recomputes the span's
// states (into scratch, each lane its own elements) and walks the tokens back, the row terms
// summed across the block per token in a fixed order; dB/dC leave as per-head partials that a
// second kernel folds over the heads of a group (in head order, as the CPU), dA per (b, h).
//
// Gated delta rule. The state's columns evolve alone in the forward (p_j, u_j, S[:, j] and o_j
// read only column j), so the forward gives a warp to a column (b, hv, j): lane l holds rows
// i = l, l + 32, ... of it; two warp sums a token. Any chunk size gives this algorithm (exact
// in exact arithmetic, so it agrees with the CPU's chunked WY form to rounding). The backward
// runs one block per (b, hv) with the whole state in registers (warp w holds columns w,
// w + nw, ...; lane l rows l, l + 32, ...): per 64-token span in reverse it recomputes the states
// from the recorded starts into scratch, then differentiates the recurrence token by token as
// the CPU does, the row gradients (dq, dk) summed across warps in a fixed order. dq/dk leave as
// per-V-head partials that a second kernel folds over the V heads of each K head (in head
// order, as the CPU), so nothing is added atomically and results do not depend on timing.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/scan_launch.h"

namespace toy::cuda {

namespace {

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__device__ __forceinline__ float softplus_grad(float v) { return v > 20.0f ? 1.0f : 1.0f / (1.0f + expf(-v)); }

// The smallest power of two >= n (n >= 1).
int pow2_at_least(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// ---- ssm scan ------------------------------------------------------------------------------------

constexpr int kScanWarps = 4;       // warps per block of the forward
constexpr int kSsmBwdWarps = 8;     // warps per (b, h) block of the backward
constexpr int64_t kSsmSpan = 64;    // tokens between the backward's recorded states

// Row p of a [.., N] state: lane's elements n = lane + 32 e (0 past N or when src is null).
template <int E>
__device__ __forceinline__ void load_row(const float* src, int64_t N, int lane, float (&s)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t n = int64_t(e) * 32 + lane;
    s[e] = src && n < N ? src[n] : 0.0f;
  }
}
template <int E>
__device__ __forceinline__ void store_row(float* dst, int64_t N, int lane, const float (&s)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t n = int64_t(e) * 32 + lane;
    if (n < N) dst[n] = s[e];
  }
}

// One token of one state row: s = a s + dtp x_p B_t. Returns y_p's lane part s.C_t when C is given.
template <int E>
__device__ __forceinline__ float ssm_step(const SsmScanGeometry& g, int64_t b, int64_t h, int64_t gi, int64_t p,
                                          int64_t t, float A, int lane, float (&s)[E], bool with_y) {
  const int64_t bt = b * g.T + t;
  const float dtp = softplus(g.dt[bt * g.H + h]);
  const float a = expf(dtp * A);
  const float xd = g.x[(bt * g.H + h) * g.P + p] * dtp;
  const float* Bt = g.Bm + (bt * g.G + gi) * g.N;
  const float* Ct = g.C + (bt * g.G + gi) * g.N;
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t n = int64_t(e) * 32 + lane;
    if (n < g.N) {
      s[e] = s[e] * a + xd * Bt[n];
      if (with_y) acc += s[e] * Ct[n];
    }
  }
  return acc;
}

template <int E>
__global__ void ssm_scan_kernel(SsmScanGeometry g, float* y, float* s_final) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kScanWarps + threadIdx.x / 32;  // (b, h, p)
  if (row >= g.B * g.H * g.P) return;
  const int64_t p = row % g.P, h = (row / g.P) % g.H, b = row / (g.P * g.H);
  const int64_t gi = h / (g.H / g.G);
  float s[E];
  load_row<E>(g.s0 ? g.s0 + row * g.N : nullptr, g.N, lane, s);
  const float A = g.A[h];
  for (int64_t t = 0; t < g.T; ++t) {
    const float acc = warp_sum(ssm_step<E>(g, b, h, gi, p, t, A, lane, s, true));
    if (lane == 0) y[((b * g.T + t) * g.H + h) * g.P + p] = acc;
  }
  store_row<E>(s_final + row * g.N, g.N, lane, s);
}

// The backward's scratch, carved from one buffer (ssm_scan_backward_scratch floats).
struct SsmScratch {
  float* starts;  // [B*H, spans, P, N]: the state before each span's first token
  float* span;    // [B*H, kSsmSpan + 1, P, N]: span[i] = the state before the span's token i
  float* ds;      // [B*H, P, N]: the state's gradient as the walk goes back
  float* pdB;     // [B, T, H, N]: per-head parts of dB and dC
  float* pdC;
  float* pdA;  // [B, H]
};
__host__ __device__ __forceinline__ int64_t ssm_spans(const SsmScanGeometry& g) {
  return (g.T + kSsmSpan - 1) / kSsmSpan;
}
SsmScratch ssm_scratch(const SsmScanGeometry& g, float* base) {
  const int64_t BH = g.B * g.H, PN = g.P * g.N;
  SsmScratch s;
  s.starts = base;
  s.span = s.starts + BH * ssm_spans(g) * PN;
  s.ds = s.span + BH * (kSsmSpan + 1) * PN;
  s.pdB = s.ds + BH * PN;
  s.pdC = s.pdB + g.B * g.T * g.H * g.N;
  s.pdA = s.pdC + g.B * g.T * g.H * g.N;
  return s;
}

template <int E>
__global__ void __launch_bounds__(kSsmBwdWarps * 32)
    ssm_scan_backward_kernel(SsmScanGeometry g, const float* gy, const float* gs, float* dx, float* ddt, float* ds0,
                             SsmScratch w) {
  __shared__ float red[2][kSsmBwdWarps][kSsmScanMaxN];  // per warp: its rows' dB and dC parts
  __shared__ float scal[kSsmBwdWarps][2];               // per warp: its rows' da and d(dtp) parts
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.x, b = bh / g.H, h = bh % g.H, gi = h / (g.H / g.G);
  const int64_t P = g.P, N = g.N, PN = P * N, T = g.T, spans = ssm_spans(g);
  const float A = g.A[h];
  float* starts = w.starts + bh * spans * PN;
  float* span = w.span + bh * (kSsmSpan + 1) * PN;
  float* ds = w.ds + bh * PN;
  // The state before every span (rows are independent: each warp walks its own), and ds = gs.
  for (int64_t p = warp; p < P; p += kSsmBwdWarps) {
    float s[E];
    load_row<E>(g.s0 ? g.s0 + (bh * P + p) * N : nullptr, N, lane, s);
    for (int64_t t = 0; t < T; ++t) {
      if (t % kSsmSpan == 0) store_row<E>(starts + ((t / kSsmSpan) * P + p) * N, N, lane, s);
      (void)ssm_step<E>(g, b, h, gi, p, t, A, lane, s, false);
    }
    float d[E];
    load_row<E>(gs ? gs + (bh * P + p) * N : nullptr, N, lane, d);
    store_row<E>(ds + p * N, N, lane, d);
  }
  double dA_acc = 0.0;  // (thread 0's)
  for (int64_t c = spans - 1; c >= 0; --c) {
    const int64_t t0 = c * kSsmSpan, n_tok = imin64(kSsmSpan, T - t0);
    // The span's states again (each lane rereads only what it wrote: no barrier needed).
    for (int64_t p = warp; p < P; p += kSsmBwdWarps) {
      float s[E];
      load_row<E>(starts + (c * P + p) * N, N, lane, s);
      store_row<E>(span + p * N, N, lane, s);
      for (int64_t i = 0; i < n_tok; ++i) {
        (void)ssm_step<E>(g, b, h, gi, p, t0 + i, A, lane, s, false);
        store_row<E>(span + ((i + 1) * P + p) * N, N, lane, s);
      }
    }
    for (int64_t i = n_tok - 1; i >= 0; --i) {
      const int64_t t = t0 + i, bt = b * T + t;
      const float dtv = g.dt[bt * g.H + h], dtp = softplus(dtv), a = expf(dtp * A);
      float Bv[E], Cv[E], dBl[E], dCl[E];
      load_row<E>(g.Bm + (bt * g.G + gi) * N, N, lane, Bv);
      load_row<E>(g.C + (bt * g.G + gi) * N, N, lane, Cv);
#pragma unroll
      for (int e = 0; e < E; ++e) dBl[e] = dCl[e] = 0.0f;
      float da = 0.0f, dtpg = 0.0f;
      for (int64_t p = warp; p < P; p += kSsmBwdWarps) {
        const int64_t at = (bt * g.H + h) * P + p;
        const float xp = g.x[at], gyp = gy[at];
        const float* cur = span + ((i + 1) * P + p) * N;
        const float* prev = span + (i * P + p) * N;
        float* dsp = ds + p * N;
        float dxp = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int64_t n = int64_t(e) * 32 + lane;
          if (n >= N) continue;
          // ds_t += gy_t C_t^T; dC_t += s_t^T gy_t; then the uses of ds_t, and ds_{t-1} = a ds_t.
          const float d = dsp[n] + gyp * Cv[e];
          dCl[e] += gyp * cur[n];
          da += d * prev[n];
          dxp += d * Bv[e];
          dBl[e] += d * xp * dtp;
          dtpg += d * xp * Bv[e];
          dsp[n] = d * a;
        }
        dxp = warp_sum(dxp);
        if (lane == 0) dx[at] = dxp * dtp;
      }
      // The block's sums over its rows, warps in order.
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t n = int64_t(e) * 32 + lane;
        if (n < N) red[0][warp][n] = dBl[e], red[1][warp][n] = dCl[e];
      }
      da = warp_sum(da);
      dtpg = warp_sum(dtpg);
      if (lane == 0) scal[warp][0] = da, scal[warp][1] = dtpg;
      __syncthreads();
      for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        float sb = 0.0f, sc = 0.0f;
        for (int v = 0; v < kSsmBwdWarps; ++v) sb += red[0][v][n], sc += red[1][v][n];
        w.pdB[(bt * g.H + h) * N + n] = sb;
        w.pdC[(bt * g.H + h) * N + n] = sc;
      }
      if (threadIdx.x == 0) {
        float da_t = 0.0f, dtpg_t = 0.0f;
        for (int v = 0; v < kSsmBwdWarps; ++v) da_t += scal[v][0], dtpg_t += scal[v][1];
        // a = exp(dtp * A): da/ddtp = a A, da/dA = a dtp.
        ddt[bt * g.H + h] = (dtpg_t + da_t * a * A) * softplus_grad(dtv);
        dA_acc += double(da_t) * a * dtp;
      }
      __syncthreads();
    }
  }
  if (ds0)
    for (int64_t p = warp; p < P; p += kSsmBwdWarps) {
      float d[E];
      load_row<E>(ds + p * N, N, lane, d);
      store_row<E>(ds0 + (bh * P + p) * N, N, lane, d);
    }
  if (threadIdx.x == 0) w.pdA[bh] = float(dA_acc);
}

// dB and dC [B, T, G, N]: the per-head parts summed over the group's heads in order.
__global__ void ssm_group_sum_kernel(SsmScanGeometry g, const float* pdB, const float* pdC, float* dB, float* dC) {
  const int64_t n_all = g.B * g.T * g.G * g.N, hpg = g.H / g.G;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n_all;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = idx % g.N, gi = (idx / g.N) % g.G, bt = idx / (g.N * g.G);
    float sb = 0.0f, sc = 0.0f;
    for (int64_t h = gi * hpg; h < (gi + 1) * hpg; ++h) {
      sb += pdB[(bt * g.H + h) * g.N + n];
      sc += pdC[(bt * g.H + h) * g.N + n];
    }
    dB[idx] = sb;
    dC[idx] = sc;
  }
}

// dA[h] = the (b, h) parts summed over b in order, in double.
__global__ void ssm_dA_kernel(SsmScanGeometry g, const float* pdA, float* dA) {
  const int64_t h = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (h >= g.H) return;
  double s = 0.0;
  for (int64_t b = 0; b < g.B; ++b) s += pdA[b * g.H + h];
  dA[h] = float(s);
}

// Calls f with std::integral_constant<int, E>, E = the lane's share of a width-n row (a power of two).
template <class F>
void with_lanes(int64_t n, F&& f) {
  switch (pow2_at_least((n + 31) / 32)) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: f(std::integral_constant<int, 16>{}); break;
  }
}

// ---- gated delta rule ----------------------------------------------------------------------------

constexpr int kGdnWarps = 4;             // warps (columns) per block of the forward
constexpr int64_t kEvery = kGatedDeltaEvery;
constexpr int kGdnRedFloats = 4096;      // the backward's per-token row sums: warps x padded Dk

__host__ __device__ __forceinline__ int64_t gdn_spans(const GatedDeltaGeometry& g) {
  return (g.T + kEvery - 1) / kEvery;
}

// Forward: one warp per column (b, hv, j) of the state.
template <int E>
__global__ void gated_delta_kernel(GatedDeltaGeometry g, float* o, float* s_final, float* starts) {
  const int lane = threadIdx.x % 32;
  const int64_t col = int64_t(blockIdx.x) * kGdnWarps + threadIdx.x / 32;  // (b, hv, j)
  if (col >= g.B * g.Hv * g.Dv) return;
  const int64_t Dk = g.Dk, Dv = g.Dv, SS = Dk * Dv, T = g.T, spans = gdn_spans(g);
  const int64_t j = col % Dv, bh = col / Dv, hv = bh % g.Hv, b = bh / g.Hv, hk = hv % g.Hk;
  float S[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t i = int64_t(e) * 32 + lane;
    S[e] = g.s0 && i < Dk ? g.s0[bh * SS + i * Dv + j] : 0.0f;
  }
  for (int64_t t = 0; t < T; ++t) {
    if (starts && t % kEvery == 0) {
      float* st = starts + (bh * spans + t / kEvery) * SS;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t i = int64_t(e) * 32 + lane;
        if (i < Dk) st[i * Dv + j] = S[e];
      }
    }
    const int64_t bt = b * T + t;
    const float a = expf(g.g[bt * g.Hv + hv]), beta = g.beta[bt * g.Hv + hv];
    const float* kt = g.k + (bt * g.Hk + hk) * Dk;
    float kv[E], p = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = int64_t(e) * 32 + lane;
      kv[e] = i < Dk ? kt[i] : 0.0f;
      p += S[e] * kv[e];
    }
    // u = beta (v - a S^T k); S = a S + k u^T; o = S^T q.
    p = warp_sum(p) * a;
    const float u = beta * (g.v[(bt * g.Hv + hv) * Dv + j] - p);
#pragma unroll
    for (int e = 0; e < E; ++e) S[e] = a * S[e] + kv[e] * u;
    if (o) {
      const float* qt = g.q + (bt * g.Hk + hk) * Dk;
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int64_t i = int64_t(e) * 32 + lane;
        if (i < Dk) acc += S[e] * qt[i];
      }
      acc = warp_sum(acc);
      if (lane == 0) o[(bt * g.Hv + hv) * Dv + j] = acc;
    }
  }
  if (s_final)
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = int64_t(e) * 32 + lane;
      if (i < Dk) s_final[bh * SS + i * Dv + j] = S[e];
    }
}

// The backward's scratch, carved from one buffer (gated_delta_rule_backward_scratch floats).
struct GdnScratch {
  float* span;  // [B*Hv, kEvery, E*C, threads]: each thread's state elements before each token of a span
  float* pu;    // [B*Hv, 2, kEvery, Dv]: p and u of each token of a span
  float* dqp;   // [B, T, Hv, Dk]: per-V-head parts of dq and dk
  float* dkp;
};
// The backward's largest block for E rows a lane: 1024 threads (64 registers each) while a
// thread's share of the state is small, 512 from Dk > 64 on so that a thread may keep more of
// it in registers (128 each); never more warps than the row sums' shared buffer takes.
__host__ __device__ constexpr int gdn_max_threads(int E) { return E >= 4 ? kGdnRedFloats / 8 : 1024; }
static_assert(gdn_max_threads(8) / 32 * 32 * 8 <= kGdnRedFloats && gdn_max_threads(2) / 32 * 32 * 2 <= kGdnRedFloats,
              "the backward's row sums fit its shared buffer");

// The backward's block shape: lanes hold E rows each, warps C columns each.
struct GdnShape {
  int E = 1, C = 1, warps = 1;
};
GdnShape gdn_shape(const GatedDeltaGeometry& g) {
  GdnShape s;
  s.E = pow2_at_least((g.Dk + 31) / 32);
  const int64_t max_warps = gdn_max_threads(s.E) / 32;
  s.C = pow2_at_least((g.Dv + max_warps - 1) / max_warps);
  s.warps = int((g.Dv + s.C - 1) / s.C);
  return s;
}
GdnScratch gdn_scratch(const GatedDeltaGeometry& g, float* base) {
  const GdnShape s = gdn_shape(g);
  const int64_t BH = g.B * g.Hv;
  GdnScratch w;
  w.span = base;
  w.pu = w.span + BH * kEvery * int64_t(s.E * s.C) * s.warps * 32;
  w.dqp = w.pu + BH * 2 * kEvery * g.Dv;
  w.dkp = w.dqp + g.B * g.T * g.Hv * g.Dk;
  return w;
}

// Backward: one block per (b, hv); thread (warp w, lane l) holds S[i][j] for rows i = l + 32 e
// (e < E) and columns j = w + warps * c (c < C).
template <int E, int C>
__global__ void __launch_bounds__(gdn_max_threads(E))
    gated_delta_backward_kernel(GatedDeltaGeometry g, const float* starts, const float* go, const float* gs,
                                float* dv, float* dg, float* dbeta, float* ds0, GdnScratch w) {
  __shared__ float red[2][kGdnRedFloats];  // per warp: its columns' parts of dq and dk (padded rows)
  __shared__ float scal[32][3];            // per warp: dbeta, u.go and dg parts
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, threads = blockDim.x;
  const int64_t Dk = g.Dk, Dv = g.Dv, SS = Dk * Dv, T = g.T, spans = gdn_spans(g);
  const int64_t bh = blockIdx.x, b = bh / g.Hv, hv = bh % g.Hv, hk = hv % g.Hk;
  float* span = w.span + bh * kEvery * (E * C) * int64_t(threads);
  float* P = w.pu + bh * 2 * kEvery * Dv;
  float* U = P + kEvery * Dv;
  auto row = [&](int e) { return int64_t(e) * 32 + lane; };
  auto colj = [&](int c) { return int64_t(warp) + int64_t(warps) * c; };
  auto slot = [&](int64_t tok, int e, int c) { return (tok * (E * C) + e * C + c) * threads + threadIdx.x; };

  float dS[E][C];
#pragma unroll
  for (int e = 0; e < E; ++e)
#pragma unroll
    for (int c = 0; c < C; ++c)
      dS[e][c] = gs && row(e) < Dk && colj(c) < Dv ? gs[bh * SS + row(e) * Dv + colj(c)] : 0.0f;

  for (int64_t sp = spans - 1; sp >= 0; --sp) {
    const int64_t t0 = sp * kEvery, n_tok = imin64(kEvery, T - t0);
    // The span's states from its recorded start; p and u of each token.
    {
      float S[E][C];
      const float* st = starts + (bh * spans + sp) * SS;
#pragma unroll
      for (int e = 0; e < E; ++e)
#pragma unroll
        for (int c = 0; c < C; ++c) S[e][c] = row(e) < Dk && colj(c) < Dv ? st[row(e) * Dv + colj(c)] : 0.0f;
      for (int64_t it = 0; it < n_tok; ++it) {
        const int64_t bt = b * T + t0 + it;
        const float a = expf(g.g[bt * g.Hv + hv]), beta = g.beta[bt * g.Hv + hv];
        const float* kt = g.k + (bt * g.Hk + hk) * Dk;
        float kv[E];
#pragma unroll
        for (int e = 0; e < E; ++e) kv[e] = row(e) < Dk ? kt[row(e)] : 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          float p = 0.0f;
#pragma unroll
          for (int e = 0; e < E; ++e) {
            span[slot(it, e, c)] = S[e][c];
            p += S[e][c] * kv[e];
          }
          p = warp_sum(p) * a;
          const int64_t j = colj(c);
          const float u = j < Dv ? beta * (g.v[(bt * g.Hv + hv) * Dv + j] - p) : 0.0f;
          if (lane == 0 && j < Dv) P[it * Dv + j] = p, U[it * Dv + j] = u;
#pragma unroll
          for (int e = 0; e < E; ++e) S[e][c] = a * S[e][c] + kv[e] * u;
        }
      }
    }
    __syncthreads();  // (lane 0's p and u are read by the whole warp)
    for (int64_t it = n_tok - 1; it >= 0; --it) {
      const int64_t t = t0 + it, bt = b * T + t;
      const float a = expf(g.g[bt * g.Hv + hv]), beta = g.beta[bt * g.Hv + hv];
      const float* qt = g.q + (bt * g.Hk + hk) * Dk;
      const float* kt = g.k + (bt * g.Hk + hk) * Dk;
      const float* got = go + (bt * g.Hv + hv) * Dv;
      const float* vt = g.v + (bt * g.Hv + hv) * Dv;
      float qv[E], kv[E], qpart[E], kpart[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        qv[e] = row(e) < Dk ? qt[row(e)] : 0.0f;
        kv[e] = row(e) < Dk ? kt[row(e)] : 0.0f;
        qpart[e] = kpart[e] = 0.0f;
      }
      float dbeta_w = 0.0f, ugo_w = 0.0f, dg_l = 0.0f;
      // Column by column (each column's dS is its own), with S_new = a S_prev + k u^T:
      //   o = S_new^T q: dq = a S_prev dO + k (u.dO); dS_new += q dO^T
      //   du = dS_new^T k; dk += dS_new u; u = beta (v - p): dv = beta du, dp = -beta du
      //   p = a S_prev^T k: dk += a S_prev dp; dS' = dS_new + k dp^T; dg = a <dS', S_prev>;
      //   dS_prev = a dS'.
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t j = colj(c);
        const bool in = j < Dv;
        const float goj = in ? got[j] : 0.0f, uj = in ? U[it * Dv + j] : 0.0f;
        float du = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          dS[e][c] += qv[e] * goj;
          du += kv[e] * dS[e][c];
        }
        du = warp_sum(du);
        const float dp = -beta * du;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const float s_prev = span[slot(it, e, c)];
          qpart[e] += s_prev * goj;
          kpart[e] += dS[e][c] * uj + a * (s_prev * dp);
          const float d = dS[e][c] + kv[e] * dp;
          dg_l += d * s_prev;
          dS[e][c] = a * d;
        }
        if (in) {
          dbeta_w += du * (vt[j] - P[it * Dv + j]);
          ugo_w += uj * goj;
          if (lane == 0) dv[(bt * g.Hv + hv) * Dv + j] = beta * du;
        }
      }
      // The block's sums over its columns, warps in order.
#pragma unroll
      for (int e = 0; e < E; ++e) {
        red[0][warp * (32 * E) + row(e)] = a * qpart[e];
        red[1][warp * (32 * E) + row(e)] = kpart[e];
      }
      dg_l = warp_sum(dg_l);
      if (lane == 0) scal[warp][0] = dbeta_w, scal[warp][1] = ugo_w, scal[warp][2] = dg_l;
      __syncthreads();
      float ugo = 0.0f;
      for (int v = 0; v < warps; ++v) ugo += scal[v][1];
      for (int64_t i = threadIdx.x; i < Dk; i += threads) {
        float sq = 0.0f, sk = 0.0f;
        for (int v = 0; v < warps; ++v) sq += red[0][v * (32 * E) + i], sk += red[1][v * (32 * E) + i];
        w.dqp[(bt * g.Hv + hv) * Dk + i] = sq + kt[i] * ugo;
        w.dkp[(bt * g.Hv + hv) * Dk + i] = sk;
      }
      if (threadIdx.x == 0) {
        float db = 0.0f, dgs = 0.0f;
        for (int v = 0; v < warps; ++v) db += scal[v][0], dgs += scal[v][2];
        dbeta[bt * g.Hv + hv] = db;
        dg[bt * g.Hv + hv] = a * dgs;
      }
      __syncthreads();
    }
  }
  if (ds0)
#pragma unroll
    for (int e = 0; e < E; ++e)
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (row(e) < Dk && colj(c) < Dv) ds0[bh * SS + row(e) * Dv + colj(c)] = dS[e][c];
}

// dq and dk [B, T, Hk, Dk]: the per-V-head parts summed over the V heads reading each K head, in order.
__global__ void gdn_head_sum_kernel(GatedDeltaGeometry g, const float* dqp, const float* dkp, float* dq, float* dk) {
  const int64_t n_all = g.B * g.T * g.Hk * g.Dk;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n_all;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % g.Dk, hk = (idx / g.Dk) % g.Hk, bt = idx / (g.Dk * g.Hk);
    float sq = 0.0f, sk = 0.0f;
    for (int64_t hv = hk; hv < g.Hv; hv += g.Hk) {
      sq += dqp[(bt * g.Hv + hv) * g.Dk + i];
      sk += dkp[(bt * g.Hv + hv) * g.Dk + i];
    }
    dq[idx] = sq;
    dk[idx] = sk;
  }
}

template <int E, int C>
void launch_gdn_backward_ec(const GdnShape& s, const GatedDeltaGeometry& g, const float* starts, const float* go,
                            const float* gs, float* dv, float* dg, float* dbeta, float* ds0, const GdnScratch& w) {
  gated_delta_backward_kernel<E, C><<<unsigned(g.B * g.Hv), unsigned(s.warps * 32), 0, stream()>>>(
      g, starts, go, gs, dv, dg, dbeta, ds0, w);
}
// The instantiation of the shape's E and C (C = 16 only with E = 8: gdn_shape never asks more).
template <int E>
void launch_gdn_backward_e(const GdnShape& s, const GatedDeltaGeometry& g, const float* starts, const float* go,
                           const float* gs, float* dv, float* dg, float* dbeta, float* ds0, const GdnScratch& w) {
  switch (s.C) {
    case 1: launch_gdn_backward_ec<E, 1>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    case 2: launch_gdn_backward_ec<E, 2>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    case 4: launch_gdn_backward_ec<E, 4>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    case 8: launch_gdn_backward_ec<E, 8>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    default:
      if constexpr (E == 8) launch_gdn_backward_ec<E, 16>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w);
      break;
  }
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------------

void launch_ssm_scan(const SsmScanGeometry& g, float* y, float* s_final) {
  const int64_t rows = g.B * g.H * g.P;
  if (rows == 0) return;
  const unsigned blocks = unsigned((rows + kScanWarps - 1) / kScanWarps);
  with_lanes(g.N, [&](auto e) {
    ssm_scan_kernel<decltype(e)::value><<<blocks, kScanWarps * 32, 0, stream()>>>(g, y, s_final);
  });
}

int64_t ssm_scan_backward_scratch(const SsmScanGeometry& g) {
  const int64_t BH = g.B * g.H, PN = g.P * g.N;
  return BH * PN * (ssm_spans(g) + kSsmSpan + 2) + 2 * g.B * g.T * g.H * g.N + BH;
}

void launch_ssm_scan_backward(const SsmScanGeometry& g, const float* gy, const float* gs, float* dx, float* ddt,
                              float* dA, float* dB, float* dC, float* ds0, float* scratch) {
  if (g.H == 0) return;
  const SsmScratch w = ssm_scratch(g, scratch);
  if (g.B > 0)
    with_lanes(g.N, [&](auto e) {
      const unsigned blocks = unsigned(g.B * g.H);
      ssm_scan_backward_kernel<decltype(e)::value><<<blocks, kSsmBwdWarps * 32, 0, stream()>>>(g, gy, gs, dx, ddt, ds0,
                                                                                               w);
    });
  const int64_t n_bc = g.B * g.T * g.G * g.N;
  if (n_bc > 0) ssm_group_sum_kernel<<<blocks_for(n_bc), kThreads, 0, stream()>>>(g, w.pdB, w.pdC, dB, dC);
  ssm_dA_kernel<<<unsigned((g.H + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(g, w.pdA, dA);
}

void launch_gated_delta_rule(const GatedDeltaGeometry& g, float* o, float* s_final, float* starts) {
  const int64_t cols = g.B * g.Hv * g.Dv;
  if (cols == 0) return;
  const unsigned blocks = unsigned((cols + kGdnWarps - 1) / kGdnWarps);
  with_lanes(g.Dk, [&](auto e) {
    if constexpr (decltype(e)::value <= 8)
      gated_delta_kernel<decltype(e)::value><<<blocks, kGdnWarps * 32, 0, stream()>>>(g, o, s_final, starts);
  });
}

int64_t gated_delta_rule_backward_scratch(const GatedDeltaGeometry& g) {
  const GdnShape s = gdn_shape(g);
  const int64_t BH = g.B * g.Hv;
  return BH * kEvery * int64_t(s.E * s.C) * s.warps * 32 + BH * 2 * kEvery * g.Dv + 2 * g.B * g.T * g.Hv * g.Dk;
}

void launch_gated_delta_rule_backward(const GatedDeltaGeometry& g, const float* starts, const float* go,
                                      const float* gs, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                                      float* ds0, float* scratch) {
  if (g.B * g.Hv == 0 || g.Dv == 0) return;
  const GdnShape s = gdn_shape(g);
  const GdnScratch w = gdn_scratch(g, scratch);
  switch (s.E) {
    case 1: launch_gdn_backward_e<1>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    case 2: launch_gdn_backward_e<2>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    case 4: launch_gdn_backward_e<4>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
    default: launch_gdn_backward_e<8>(s, g, starts, go, gs, dv, dg, dbeta, ds0, w); break;
  }
  const int64_t n_qk = g.B * g.T * g.Hk * g.Dk;
  if (n_qk > 0) gdn_head_sum_kernel<<<blocks_for(n_qk), kThreads, 0, stream()>>>(g, w.dqp, w.dkp, dq, dk);
}

}  // namespace toy::cuda
