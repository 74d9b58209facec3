// Fused scaled-dot-product attention, flash style: queries are processed in blocks of 16
// and keys in chunks of up to 256; scores exist only one 16 x 256 tile at a time (online
// softmax across key chunks in the forward, recomputed from the saved log-sum-exp in the
// backward), so T x S is never stored. Each task first transposes its K (and V) head into
// [D, S] so that every block GEMM is NN or TN (B's rows contiguous: block_gemm's loads);
// 16-row query blocks keep the causal waste on the diagonal small.
//
// Layout: q [B, T, H, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv] with unit last stride (other
// strides free: views of a fused qkv projection work without copies); head h reads K/V
// head h / (H / Hkv). out [B, T, H, Dv] and lse [B, H, T] contiguous.
// Visibility of key j to query i: causal -> j <= i + (S - T); a sliding window W -> also
// i + (S - T) - j < W; segments -> same segment id.
// Forward parallelizes over (b, h); backward over (b, kv head), which owns its dK/dV rows
// exclusively, so nothing is shared between threads and results are deterministic.
// Block GEMMs are block_gemm's register tiles (not BLAS: its bits and speed would follow the
// BLAS build and OPENBLAS_CORETYPE), so the results are the same bits in the AVX2 and
// AVX-512 forms and on every CPU (tested). Tolerance vs the composed reference: 1e-5.
#include <algorithm>
#include <cmath>
#include <vector>

#include "toy/backend/cpu/block_gemm.h"
#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

constexpr int64_t kBlock = 16;   // query rows per tile
constexpr int64_t kChunk = 256;  // key columns per tile

struct Geometry {
  int64_t B, T, H, D, S, Hkv, Dv, group, off;
  const float *q, *k, *v;
  const f16 *k16, *v16;  // an F16 cache's keys and values (attention_decode; k, v null then)
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2;
  const int32_t* seg;  // [B, T] or null
  float scale;
  bool causal;
  int64_t window;  // 0: none


  const float* qrow(int64_t b, int64_t t, int64_t h) const { return q + b * qs0 + t * qs1 + h * qs2; }
  const float* krow(int64_t b, int64_t s, int64_t hk) const { return k + b * ks0 + s * ks1 + hk * ks2; }
  const float* vrow(int64_t b, int64_t s, int64_t hk) const { return v + b * vs0 + s * vs1 + hk * vs2; }
  // The same rows with keys and values of element type KV (float, or f16 for an F16 cache).
  template <class KV>
  const KV* krow_as(int64_t b, int64_t s, int64_t hk) const {
    const KV* base;
    if constexpr (std::is_same_v<KV, float>) base = k; else base = k16;
    return base + b * ks0 + s * ks1 + hk * ks2;
  }
  template <class KV>
  const KV* vrow_as(int64_t b, int64_t s, int64_t hk) const {
    const KV* base;
    if constexpr (std::is_same_v<KV, float>) base = v; else base = v16;
    return base + b * vs0 + s * vs1 + hk * vs2;
  }
  // Last key (exclusive) any query of [i0, i1) can see.
  int64_t key_end(int64_t i1) const { return causal ? std::min(S, i1 + off) : S; }
  // First key any query of [i0, ...) can see.
  int64_t key_begin(int64_t i0) const { return window > 0 ? std::max<int64_t>(0, i0 + off - window + 1) : 0; }
};

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg, const kern::AttentionArgs& a) {
  Geometry g{};
  g.B = q.size(0), g.T = q.size(1), g.H = q.size(2), g.D = q.size(3);
  g.S = k.size(1), g.Hkv = k.size(2), g.Dv = v.size(3);
  g.group = g.H / g.Hkv;
  g.off = g.S - g.T;
  g.q = q.data<float>();
  if (k.dtype() == DType::F16) {
    g.k16 = k.data<f16>(), g.v16 = v.data<f16>();
  } else {
    g.k = k.data<float>(), g.v = v.data<float>();
  }
  g.qs0 = q.stride(0), g.qs1 = q.stride(1), g.qs2 = q.stride(2);
  g.ks0 = k.stride(0), g.ks1 = k.stride(1), g.ks2 = k.stride(2);
  g.vs0 = v.stride(0), g.vs1 = v.stride(1), g.vs2 = v.stride(2);
  g.seg = seg.defined() ? seg.data<int32_t>() : nullptr;
  g.scale = a.scale;
  g.causal = a.causal;
  g.window = a.causal ? a.window : 0;
  return g;
}

// Masks the score tile s (rows x cols, leading dim ld) for queries i0.. and keys j0..:
// causal columns past each row's diagonal are filled with -inf in one run per row; segment
// ids (when given) are compared per element.
void mask_block(const Geometry& g, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s,
                int64_t ld) {
  const bool diag = g.causal && j0 + cols - 1 > i0 + g.off;
  // A key of this tile falls out of the last row's window.
  const bool far = g.window > 0 && i0 + rows - 1 + g.off - j0 >= g.window;
  if (!diag && !far && !g.seg) return;
  const int32_t* sg = g.seg ? g.seg + b * g.T : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* sr = s + r * ld;
    int64_t visible = cols;  // columns [0, visible) pass the causal test
    if (g.causal) visible = std::clamp<int64_t>(i + g.off + 1 - j0, 0, cols);
    std::fill(sr + visible, sr + cols, -INFINITY);
    int64_t first = 0;  // columns [0, first) are out of the window
    if (g.window > 0) first = std::clamp<int64_t>(i + g.off - g.window + 1 - j0, 0, visible);
    std::fill(sr, sr + first, -INFINITY);
    if (sg) {
      const int32_t si = sg[i];
      for (int64_t c = first; c < visible; ++c)
        if (sg[j0 + c] != si) sr[c] = -INFINITY;
    }
  }
}

// Leading dimension of a transposed head [D, S]: S rounded up to 16 plus 16, so that its rows
// are not a power of two apart. At S = 256 (1 KiB rows) the rows a register tile reads down k
// all fell in 16 of the L1's 64 sets and evicted each other between the tiles of one block.
int64_t transposed_ld(int64_t S) { return (S + 15) / 16 * 16 + 16; }

// dst [D, ld] = the (b, hk) head of x [B, S, Hkv, D] transposed (x rows have stride xs1,
// dst rows ld = transposed_ld(S)): 8x8 tiles transposed in registers, scalar edges.
void transpose_head(const float* x, int64_t xs1, int64_t S, int64_t D, float* dst) {
  const int64_t ld = transposed_ld(S);
  int64_t s0 = 0;
  for (; s0 + 8 <= S; s0 += 8) {
    int64_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8) {
      __m256 o[8];
      for (int i = 0; i < 8; ++i) o[i] = _mm256_loadu_ps(x + (s0 + i) * xs1 + d0);
      transpose8_ps(o);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (d0 + i) * ld + s0, o[i]);
    }
    for (; d0 < D; ++d0)
      for (int64_t s = s0; s < s0 + 8; ++s) dst[d0 * ld + s] = x[s * xs1 + d0];
  }
  for (; s0 < S; ++s0)
    for (int64_t d = 0; d < D; ++d) dst[d * ld + s0] = x[s0 * xs1 + d];
}

// With non-decreasing segment ids, a key block entirely before the query block's first
// segment is invisible and can be skipped.
bool block_invisible(const Geometry& g, int64_t b, int64_t i0, int64_t j0, int64_t cols, bool monotone) {
  if (!g.seg || !monotone) return false;
  const int32_t* sg = g.seg + b * g.T;
  return sg[j0 + cols - 1] < sg[i0];
}

std::vector<char> monotone_segments(const Geometry& g) {
  std::vector<char> mono(size_t(g.B), 0);
  if (!g.seg) return mono;
  for (int64_t b = 0; b < g.B; ++b) {
    bool ok = true;
    for (int64_t t = 1; t < g.T && ok; ++t) ok = g.seg[b * g.T + t] >= g.seg[b * g.T + t - 1];
    mono[size_t(b)] = ok;
  }
  return mono;
}

// One query row per sequence (decoding with a cache): the tiles, K transposes and GEMMs of
// the general path cost more than the work, so each head's scores are dot products over the
// keys' contiguous rows, a softmax, and a weighted sum of value rows. The same numbers as the
// tiled path (same exp, max-subtracted sums), computed in one pass per head.
// Head h of sequence b for one query row: its output row orow [Dv] and log-sum-exp *lse.
// KV: the keys' and values' element type (f16 rows are widened in registers: exactly the
// numbers of the f32 rows they convert to).
template <class KV>
void one_query_head(const Geometry& g, int64_t b, int64_t h, float* orow, float* lse) {
  const int64_t hk = h / g.group;
  // Keys [j_first, j_first + S) are visible (a sliding window starts past 0).
  const int64_t j_first = g.key_begin(0), S = g.key_end(1) - j_first;
  float* s = scratch_floats(size_t(S + 8), 0);
  const float* q = g.qrow(b, 0, h);
  if (S == 0) {
    std::fill_n(orow, g.Dv, 0.0f);
    *lse = -INFINITY;
    return;
  }
  // Scores, four keys at a time: four independent FMA chains instead of one waiting on
  // itself (the dot products are short, so latency, not arithmetic, is the limit).
  const int64_t D8 = g.D / 8 * 8;
  auto dot_tail = [&](const KV* kr) {
    float t = 0;
    // Explicit FMAs: whether the compiler contracts q * k + t could differ between the f32
    // and f16 instantiations (it did), and then an F16 cache's bits would not be its widening's.
    for (int64_t d = D8; d < g.D; ++d) t = std::fma(q[d], to_f32(kr[d]), t);
    return t;
  };
  int64_t j = 0;
  for (; j + 4 <= S; j += 4) {
    const KV* k0 = g.krow_as<KV>(b, j_first + j, hk);
    const KV* k1 = g.krow_as<KV>(b, j_first + j + 1, hk);
    const KV* k2 = g.krow_as<KV>(b, j_first + j + 2, hk);
    const KV* k3 = g.krow_as<KV>(b, j_first + j + 3, hk);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < D8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, load8(k1 + d), a1);
      a2 = _mm256_fmadd_ps(qv, load8(k2 + d), a2);
      a3 = _mm256_fmadd_ps(qv, load8(k3 + d), a3);
    }
    s[j] = (hsum256(a0) + dot_tail(k0)) * g.scale;
    s[j + 1] = (hsum256(a1) + dot_tail(k1)) * g.scale;
    s[j + 2] = (hsum256(a2) + dot_tail(k2)) * g.scale;
    s[j + 3] = (hsum256(a3) + dot_tail(k3)) * g.scale;
  }
  for (; j < S; ++j) {
    const KV* kr = g.krow_as<KV>(b, j_first + j, hk);
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kr + d), a);
    s[j] = (hsum256(a) + dot_tail(kr)) * g.scale;
  }
  float mx = -INFINITY;
  for (int64_t i = 0; i < S; ++i) mx = std::max(mx, s[i]);
  // p = exp(s - max) in place, and their sum (the same bits in both forms).
  const float sum = avx512_forms() ? exp_shifted_row_sum512(s, S, mx) : exp_shifted_row_sum(s, S, mx);
  // o = sum_j p_j v_j / sum, 64 output dims at a time held in registers across the keys.
  const float inv = 1.0f / sum;
  for (int64_t d0 = 0; d0 < g.Dv; d0 += 64) {
    const int64_t width = std::min<int64_t>(64, g.Dv - d0);
    if (width == 64) {
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (int64_t jj = 0; jj < S; ++jj) {
        const KV* vr = g.vrow_as<KV>(b, j_first + jj, hk) + d0;
        const __m256 p = _mm256_set1_ps(s[jj]);
        for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(p, load8(vr + 8 * c), acc[c]);
      }
      for (int c = 0; c < 8; ++c) _mm256_storeu_ps(orow + d0 + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
    } else {
      float acc[64] = {};
      for (int64_t jj = 0; jj < S; ++jj) {
        const KV* vr = g.vrow_as<KV>(b, j_first + jj, hk) + d0;
        for (int64_t d = 0; d < width; ++d) acc[d] = std::fma(s[jj], to_f32(vr[d]), acc[d]);
      }
      for (int64_t d = 0; d < width; ++d) orow[d0 + d] = acc[d] * inv;
    }
  }
  *lse = mx + std::log(sum);
}

void attention_one_query(const Geometry& g, float* po, float* pl) {
  parallel_tasks(g.B * g.H, [&](int64_t task) {
    const int64_t b = task / g.H, h = task % g.H;
    one_query_head<float>(g, b, h, po + (b * g.H + h) * g.Dv, pl + b * g.H + h);
  });
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg, const kern::AttentionArgs& a,
               Tensor& out, Tensor& lse) {
  const Geometry g = geometry(q, k, v, seg, a);
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  if (g.T == 1 && !g.seg) return attention_one_query(g, po, pl);
  const auto mono = monotone_segments(g);
  const bool wide = avx512_forms();
  parallel_tasks(g.B * g.H, [&](int64_t task) {
    const int64_t b = task / g.H, h = task % g.H, hk = h / g.group;
    float* s = scratch_floats(size_t(kBlock * kChunk), 0);
    float* acc = scratch_floats(size_t(kBlock * g.Dv), 1);
    float* m = scratch_floats(size_t(kBlock), 2);
    float* l = scratch_floats(size_t(kBlock), 3);
    float* kt = scratch_floats(size_t(g.D * transposed_ld(g.S)), 4);  // K^T of this head: [D, S]
    transpose_head(g.krow(b, 0, hk), g.ks1, g.S, g.D, kt);
    const int64_t ldt = transposed_ld(g.S);
    for (int64_t i0 = 0; i0 < g.T; i0 += kBlock) {
      const int64_t rows = std::min(kBlock, g.T - i0);
      std::fill_n(m, kBlock, -INFINITY);
      std::fill_n(l, kBlock, 0.0f);
      std::fill_n(acc, rows * g.Dv, 0.0f);
      const int64_t jend = g.key_end(i0 + rows);
      for (int64_t j0 = g.key_begin(i0); j0 < jend; j0 += kChunk) {
        const int64_t cols = std::min(kChunk, jend - j0);
        if (block_invisible(g, b, i0, j0, cols, mono[size_t(b)])) continue;
        // s = scale * Q_i K_j^T
        block_gemm(false, rows, cols, g.D, g.scale, g.qrow(b, i0, h), g.qs1, kt + j0, ldt, 0.0f, s, kChunk);
        mask_block(g, b, i0, rows, j0, cols, s, kChunk);
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = s + r * kChunk;
          const float mx = wide ? max_row512(sr, cols, m[size_t(r)]) : max_row(sr, cols, m[size_t(r)]);
          if (mx == -INFINITY) {  // nothing visible yet in this row
            std::fill(sr, sr + cols, 0.0f);
            continue;
          }
          const float alpha = exp_nonpos_scalar(m[size_t(r)] - mx);
          const float sum = wide ? exp_shifted_row_sum512(sr, cols, mx) : exp_shifted_row_sum(sr, cols, mx);
          const float l_prev = l[size_t(r)];
          l[size_t(r)] = l_prev * alpha + sum;
          m[size_t(r)] = mx;
          if (alpha != 1.0f && l_prev > 0.0f) {  // nothing accumulated yet: nothing to rescale
            float* ar = acc + r * g.Dv;
            for (int64_t d = 0; d < g.Dv; ++d) ar[d] *= alpha;
          }
        }
        // acc += P V_j
        block_gemm(false, rows, g.Dv, cols, 1.0f, s, kChunk, g.vrow(b, j0, hk), g.vs1, 1.0f, acc, g.Dv);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = i0 + r;
        float* orow = po + ((b * g.T + t) * g.H + h) * g.Dv;
        const float li = l[size_t(r)];
        const float inv = li > 0 ? 1.0f / li : 0.0f;
        for (int64_t d = 0; d < g.Dv; ++d) orow[d] = acc[size_t(r * g.Dv + d)] * inv;
        pl[(b * g.H + h) * g.T + t] = li > 0 ? m[size_t(r)] + std::log(li) : -INFINITY;
      }
    }
  });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seg, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, const kern::AttentionArgs& a, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  const Geometry g = geometry(q, k, v, seg, a);
  const float* po = out.data<float>();
  const float* pl = lse.data<float>();
  const float* pdo = dout.data<float>();  // contiguous [B, T, H, Dv]
  float* pdq = dq.data<float>();          // [B, T, H, D]    (row stride ldq)
  float* pdk = dk.data<float>();          // [B, S, Hkv, D]  (row stride ldk)
  float* pdv = dv.data<float>();          // [B, S, Hkv, Dv] (row stride ldv)
  const auto mono = monotone_segments(g);
  const bool wide = avx512_forms();
  // dq/dk/dv may be views into one packed [B, T, H + 2Hkv, D] gradient (attention_qkv):
  // rows have their own strides, heads are D apart, batches T rows apart.
  const int64_t ldq = dq.stride(1), ldk = dk.stride(1), ldv = dv.stride(1), ldo = g.H * g.Dv;

  parallel_tasks(g.B * g.Hkv, [&](int64_t task) {
    const int64_t b = task / g.Hkv, hk = task % g.Hkv;
    // dK/dV rows are initialized by their first GEMM (beta = 0) instead of zero-filled first:
    // `written` is the prefix of key rows that hold values. Query blocks run last to first, so
    // with causal masking the first block already covers every key it will ever see.
    int64_t written = 0;
    auto zero_rows = [&](int64_t r0, int64_t r1) {
      for (int64_t s = r0; s < r1; ++s) {
        std::fill_n(pdk + (b * g.S + s) * ldk + hk * g.D, g.D, 0.0f);
        std::fill_n(pdv + (b * g.S + s) * ldv + hk * g.Dv, g.Dv, 0.0f);
      }
    };
    // Beta for a GEMM that adds into key rows [j0, j1).
    auto kv_beta = [&](int64_t j0, int64_t j1) {
      if (j1 <= written) return 1.0f;
      if (written < j0) zero_rows(written, j0);
      if (written <= j0) {
        written = j1;
        return 0.0f;
      }
      zero_rows(written, j1);
      written = j1;
      return 1.0f;
    };
    // A sliding window's query blocks see bands of keys, not prefixes: every row zeroed first.
    if (g.window > 0) zero_rows(0, g.S), written = g.S;
    float* p = scratch_floats(size_t(kBlock * kChunk), 0);
    float* dp = scratch_floats(size_t(kBlock * kChunk), 1);
    float* delta = scratch_floats(size_t(g.T), 2);
    float* kt = scratch_floats(size_t(g.D * transposed_ld(g.S)), 3);  // K^T, V^T of this kv head
    float* vt = scratch_floats(size_t(g.Dv * transposed_ld(g.S)), 4);
    const int64_t ldt = transposed_ld(g.S);
    transpose_head(g.krow(b, 0, hk), g.ks1, g.S, g.D, kt);
    transpose_head(g.vrow(b, 0, hk), g.vs1, g.S, g.Dv, vt);
    for (int64_t h = hk * g.group; h < (hk + 1) * g.group; ++h) {
      // delta_i = sum_d dO_i * O_i (the softmax backward's row term). dQ rows are not zeroed:
      // the first key chunk of each query block writes them (beta = 0), later ones add.
      for (int64_t t = 0; t < g.T; ++t) {
        const float* o = po + ((b * g.T + t) * g.H + h) * g.Dv;
        const float* d_o = pdo + ((b * g.T + t) * g.H + h) * g.Dv;
        delta[t] = dot_row(o, d_o, g.Dv);
      }
      const float* lrow = pl + (b * g.H + h) * g.T;
      for (int64_t i0 = (g.T - 1) / kBlock * kBlock; i0 >= 0; i0 -= kBlock) {
        const int64_t rows = std::min(kBlock, g.T - i0);
        const int64_t jend = g.key_end(i0 + rows);
        const float* dO_i = pdo + ((b * g.T + i0) * g.H + h) * g.Dv;
        int64_t first_chunk = -1;  // the first key chunk that contributes to this query block
        for (int64_t j0 = g.key_begin(i0); j0 < jend; j0 += kChunk) {
          const int64_t cols = std::min(kChunk, jend - j0);
          if (block_invisible(g, b, i0, j0, cols, mono[size_t(b)])) continue;
          if (first_chunk < 0) first_chunk = j0;
          // P = exp(scale * Q_i K_j^T - lse_i)
          block_gemm(false, rows, cols, g.D, g.scale, g.qrow(b, i0, h), g.qs1, kt + j0, ldt, 0.0f, p, kChunk);
          mask_block(g, b, i0, rows, j0, cols, p, kChunk);
          for (int64_t r = 0; r < rows; ++r) {
            float* pr = p + r * kChunk;
            const float li = lrow[i0 + r];
            if (li == -INFINITY) {
              std::fill(pr, pr + cols, 0.0f);
              continue;
            }
            if (wide)
              exp_shifted_row512(pr, cols, li);
            else
              exp_shifted_row(pr, cols, li);
          }
          // dV_j += P^T dO_i (and dK_j below, with the same beta)
          const float kvb = kv_beta(j0, j0 + cols);
          block_gemm(true, cols, g.Dv, rows, 1.0f, p, kChunk, dO_i, ldo, kvb, pdv + (b * g.S + j0) * ldv + hk * g.Dv,
                     ldv);
          // dP = dO_i V_j^T
          block_gemm(false, rows, cols, g.Dv, 1.0f, dO_i, ldo, vt + j0, ldt, 0.0f, dp, kChunk);
          // dS = P * (dP - delta_i), kept in dp
          for (int64_t r = 0; r < rows; ++r) {
            const __m256 dl = _mm256_set1_ps(delta[i0 + r]);
            float* dr = dp + r * kChunk;
            const float* pr = p + r * kChunk;
            int64_t c = 0;
            for (; c + 8 <= cols; c += 8)
              _mm256_storeu_ps(dr + c, _mm256_mul_ps(_mm256_loadu_ps(pr + c), _mm256_sub_ps(_mm256_loadu_ps(dr + c), dl)));
            for (; c < cols; ++c) dr[c] = pr[c] * (dr[c] - delta[i0 + r]);
          }
          // dQ_i += scale * dS K_j ; dK_j += scale * dS^T Q_i
          block_gemm(false, rows, g.D, cols, g.scale, dp, kChunk, g.krow(b, j0, hk), g.ks1,
                     j0 == first_chunk ? 0.0f : 1.0f, pdq + (b * g.T + i0) * ldq + h * g.D, ldq);
          block_gemm(true, cols, g.D, rows, g.scale, dp, kChunk, g.qrow(b, i0, h), g.qs1, kvb,
                     pdk + (b * g.S + j0) * ldk + hk * g.D, ldk);
        }
        if (first_chunk < 0)  // nothing visible (e.g. every key in another segment): dq = 0
          for (int64_t r = 0; r < rows; ++r) std::fill_n(pdq + (b * g.T + i0 + r) * ldq + h * g.D, g.D, 0.0f);
      }
    }
    zero_rows(written, g.S);  // keys no query can see
  });
}

void attention_decode(const Tensor& q, std::span<const Tensor> ks, std::span<const Tensor> vs,
                      const kern::AttentionArgs& a, Tensor& out) {
  const int64_t N = q.size(0), H = q.size(2), Dv = out.size(3);
  std::vector<Geometry> gs;
  gs.reserve(size_t(N));
  for (int64_t i = 0; i < N; ++i) {
    Geometry g = geometry(q, ks[size_t(i)], vs[size_t(i)], Tensor(), a);
    g.B = 1;
    g.q += i * g.qs0;  // sequence i's query row, as batch 0 of its own geometry
    gs.push_back(g);
  }
  float* po = out.data<float>();
  // Every (sequence, head) is a task of one parallel region: the heads of all the sequences
  // share the threads (one region per sequence left threads idle and paid its start N times).
  const bool half = ks[0].dtype() == DType::F16;
  parallel_tasks(N * H, [&](int64_t task) {
    const int64_t i = task / H, h = task % H;
    float lse;
    if (half)
      one_query_head<f16>(gs[size_t(i)], 0, h, po + (i * H + h) * Dv, &lse);
    else
      one_query_head<float>(gs[size_t(i)], 0, h, po + (i * H + h) * Dv, &lse);
  });
}

}  // namespace toy::cpu
