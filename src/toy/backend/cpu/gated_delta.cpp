// The gated delta rule (Gated DeltaNet, as Qwen3-Next / Qwen3.5 use it), forward and backward.
// Shapes: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv], states [B, Hv, Dk, Dv];
// V head h reads K head h % Hk. Per (b, V head) the state S [Dk, Dv] evolves as
//   S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t.
//
// Forward, two algorithms:
//   token by token (decoding, short prompts): the recurrence above, two passes over S a token.
//   chunked (training, prefill): per chunk of C tokens, with gamma_i the running sum of g
//   inside the chunk and S0 the state at its start,
//     u_i = beta_i (v_i - e^{gamma_i} S0^T k_i - sum_{j<i} e^{gamma_i - gamma_j} (k_j.k_i) u_j)
//   (the WY / UT form: a unit lower-triangular system, solved by forward substitution), then
//     o_i = e^{gamma_i} S0^T q_i + sum_{j<=i} e^{gamma_i - gamma_j} (k_j.q_i) u_j
//     S   = e^{gamma_last} S0 + sum_j e^{gamma_last - gamma_j} k_j u_j^T
//   — products of small matrices (K S0, Q S0, K K^T, Q K^T, K^T U; SGEMM) instead of C
//   dependent matrix-vector steps. Only differences gamma_i - gamma_j (i >= j) are
//   exponentiated, never -gamma, so nothing overflows however strong the decay.
// Backward: the state before every 64th token (kept by the forward, or recomputed), then
// chunks in reverse: each chunk's token states recomputed from its start, and the recurrence
// differentiated token by token (two fused passes over the state's rows). Tasks are (b, K
// head) — every V head reading that K head in turn — so dq and dk have a single writer and the
// result does not depend on the thread count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

constexpr int64_t kEvery = kern::kGatedDeltaStateEvery;
constexpr int64_t kSub = 64;  // tokens whose states the backward keeps at once

struct Dims {
  int64_t B, T, Hk, Hv, Dk, Dv;
  int64_t starts() const { return (T + kEvery - 1) / kEvery; }
};
Dims dims_of(const Tensor& q, const Tensor& v) {
  return {q.size(0), q.size(1), q.size(2), v.size(2), q.size(3), v.size(3)};
}

// y += a x over n floats.
inline void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
  for (; j < n; ++j) y[j] += a * x[j];
}

// One (b, V head)'s inputs: row t of q/k (its K head), of v, and g/beta.
struct Head {
  const float *q, *k, *v, *g, *beta;
  int64_t qk_stride, v_stride, gb_stride;  // elements between consecutive tokens
  const float* qt(int64_t t) const { return q + t * qk_stride; }
  const float* kt(int64_t t) const { return k + t * qk_stride; }
  const float* vt(int64_t t) const { return v + t * v_stride; }
  float gt(int64_t t) const { return g[t * gb_stride]; }
  float bt(int64_t t) const { return beta[t * gb_stride]; }
};
Head head_of(const Dims& d, const float* q, const float* k, const float* v, const float* g, const float* beta,
             int64_t b, int64_t hv) {
  const int64_t hk = hv % d.Hk;
  return {q + (b * d.T * d.Hk + hk) * d.Dk, k + (b * d.T * d.Hk + hk) * d.Dk, v + (b * d.T * d.Hv + hv) * d.Dv,
          g + b * d.T * d.Hv + hv, beta + b * d.T * d.Hv + hv, d.Hk * d.Dk, d.Hv * d.Dv, d.Hv};
}

// out[j] = sum_r c[r] S[r, j] (S: rows x n, row stride n): blocks of 32 columns kept in
// registers across the rows, so each row is read once and nothing is stored per row.
inline void combine_rows(const float* c, const float* S, int64_t rows, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* sr = S + r * n + j;
      const __m256 cr = _mm256_set1_ps(c[r]);
      a0 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(sr), a0);
      a1 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(sr + 8), a1);
      a2 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(sr + 16), a2);
      a3 = _mm256_fmadd_ps(cr, _mm256_loadu_ps(sr + 24), a3);
    }
    _mm256_storeu_ps(out + j, a0), _mm256_storeu_ps(out + j + 8, a1);
    _mm256_storeu_ps(out + j + 16, a2), _mm256_storeu_ps(out + j + 24, a3);
  }
  for (; j < n; ++j) {
    float acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += c[r] * S[r * n + j];
    out[j] = acc;
  }
}

// The lane sums of 8 vectors, in order (a transpose-and-add: one result vector).
inline __m256 lane_sums8(const float* partial) {
  const __m256 h1 = _mm256_hadd_ps(_mm256_loadu_ps(partial), _mm256_loadu_ps(partial + 8));
  const __m256 h2 = _mm256_hadd_ps(_mm256_loadu_ps(partial + 16), _mm256_loadu_ps(partial + 24));
  const __m256 h3 = _mm256_hadd_ps(_mm256_loadu_ps(partial + 32), _mm256_loadu_ps(partial + 40));
  const __m256 h4 = _mm256_hadd_ps(_mm256_loadu_ps(partial + 48), _mm256_loadu_ps(partial + 56));
  const __m256 h12 = _mm256_hadd_ps(h1, h2), h34 = _mm256_hadd_ps(h3, h4);
  return _mm256_add_ps(_mm256_permute2f128_ps(h12, h34, 0x20), _mm256_permute2f128_ps(h12, h34, 0x31));
}
// out[r] (+)= scale * (sum of the 8 lanes of partial[r]) for r < rows.
inline void add_lane_sums(const float* partial, int64_t rows, float scale, float* out) {
  int64_t r = 0;
  const __m256 vs = _mm256_set1_ps(scale);
  for (; r + 8 <= rows; r += 8)
    _mm256_storeu_ps(out + r, _mm256_fmadd_ps(vs, lane_sums8(partial + r * 8), _mm256_loadu_ps(out + r)));
  for (; r < rows; ++r) {
    float t = 0;
    for (int l = 0; l < 8; ++l) t += partial[r * 8 + l];
    out[r] += scale * t;
  }
}

// One token: S_out = a S_in + k u^T with u = beta (v - a S_in^T k) (S_out may be S_in).
// Writes u and p = a S_in^T k (Dv each) and, when o is not null, o = S_out^T q.
void step(const Dims& d, const Head& h, int64_t t, const float* S_in, float* S_out, float* p, float* u, float* o) {
  const float a = std::exp(h.gt(t)), beta = h.bt(t);
  const float *k = h.kt(t), *v = h.vt(t);
  const int64_t Dk = d.Dk, Dv = d.Dv;
  combine_rows(k, S_in, Dk, Dv, p);
  for (int64_t j = 0; j < Dv; ++j) p[j] *= a, u[j] = beta * (v[j] - p[j]);
  const __m256 va = _mm256_set1_ps(a);
  for (int64_t i = 0; i < Dk; ++i) {
    const float* src = S_in + i * Dv;
    float* dst = S_out + i * Dv;
    const __m256 vk = _mm256_set1_ps(k[i]);
    int64_t j = 0;
    for (; j + 8 <= Dv; j += 8)
      _mm256_storeu_ps(dst + j, _mm256_fmadd_ps(vk, _mm256_loadu_ps(u + j), _mm256_mul_ps(va, _mm256_loadu_ps(src + j))));
    for (; j < Dv; ++j) dst[j] = a * src[j] + k[i] * u[j];
  }
  if (o) combine_rows(h.qt(t), S_out, Dk, Dv, o);
}

// One chunk [t0, t0 + n) in the WY form; S holds the state at its start and gets the state
// at its end. Token t0 + i's output goes to o + i * ldo.
void chunk_forward(const Dims& d, const Head& h, int64_t t0, int64_t n, float* S, float* o, int64_t ldo) {
  const int64_t Dk = d.Dk, Dv = d.Dv, ldk = h.qk_stride;
  const float *K = h.kt(t0), *Q = h.qt(t0);
  float* gam = scratch_floats(size_t(n), 0);
  float* U = scratch_floats(size_t(n * Dv), 1);   // K S0, then the right-hand sides, then u
  float* KK = scratch_floats(size_t(n * n), 2);   // K K^T, then the system's coefficients
  float* QK = scratch_floats(size_t(n * n), 3);   // Q K^T, masked and decayed
  float* Kw = scratch_floats(size_t(n * Dk), 5);  // rows of K weighted for the state update
  for (int64_t i = 0; i < n; ++i) gam[i] = (i ? gam[i - 1] : 0.0f) + h.gt(t0 + i);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(Dk), 1.0f, K, int(ldk), K, int(ldk), 0.0f,
              KK, int(n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(Dk), 1.0f, Q, int(ldk), K, int(ldk), 0.0f,
              QK, int(n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(Dv), int(Dk), 1.0f, K, int(ldk), S, int(Dv), 0.0f,
              U, int(Dv));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(Dv), int(Dk), 1.0f, Q, int(ldk), S, int(Dv), 0.0f,
              o, int(ldo));
  // Decays: row i of QK holds e^{gamma_i - gamma_j} (q_i.k_j) for j <= i, zero above; row i
  // of KK the coefficients beta_i e^{gamma_i - gamma_j} (k_i.k_j) for j < i.
  for (int64_t i = 0; i < n; ++i) {
    float *qk = QK + i * n, *kk = KK + i * n;
    const float beta = h.bt(t0 + i);
    for (int64_t j = 0; j <= i; ++j) {
      const float e = std::exp(gam[i] - gam[j]);
      qk[j] *= e;
      kk[j] *= beta * e;
    }
    std::fill(qk + i + 1, qk + n, 0.0f);
  }
  // Right-hand sides beta_i (v_i - e^{gamma_i} S0^T k_i); o_i = e^{gamma_i} S0^T q_i.
  for (int64_t i = 0; i < n; ++i) {
    float* ui = U + i * Dv;
    float* oi = o + i * ldo;
    const float* vi = h.vt(t0 + i);
    const float e = std::exp(gam[i]), beta = h.bt(t0 + i);
    for (int64_t j = 0; j < Dv; ++j) ui[j] = beta * (vi[j] - e * ui[j]), oi[j] *= e;
  }
  // Forward substitution: u_i -= sum_{j<i} c_ij u_j.
  for (int64_t i = 1; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) axpy(-KK[i * n + j], U + j * Dv, U + i * Dv, Dv);
  // o += (decayed, masked Q K^T) U.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(Dv), int(n), 1.0f, QK, int(n), U, int(Dv), 1.0f,
              o, int(ldo));
  // S = e^{gamma_last} S0 + (w K)^T U with w_j = e^{gamma_last - gamma_j}.
  const float last = gam[n - 1];
  for (int64_t j = 0; j < n; ++j) {
    const float w = std::exp(last - gam[j]);
    const float* kj = h.kt(t0 + j);
    for (int64_t a = 0; a < Dk; ++a) Kw[j * Dk + a] = w * kj[a];
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(Dk), int(Dv), int(n), 1.0f, Kw, int(Dk), U, int(Dv),
              std::exp(last), S, int(Dv));
}

}  // namespace

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const Tensor& s0, int64_t chunk, Tensor& o, Tensor& s_final, Tensor& starts) {
  const Dims d = dims_of(q, v);
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pg = g.data<float>(), *pb = beta.data<float>();
  const float* ps0 = s0.defined() ? s0.data<float>() : nullptr;
  float* po = o.data<float>();
  float* ps = s_final.data<float>();
  float* pstarts = starts.defined() ? starts.data<float>() : nullptr;
  const int64_t SS = d.Dk * d.Dv;
  // The chunks must fall on the states' boundaries for the chunked form to record them.
  const int64_t C = chunk <= 1 ? 1 : std::min(chunk, kEvery);
  parallel_tasks(d.B * d.Hv, [&](int64_t task) {
    const int64_t b = task / d.Hv, hv = task % d.Hv;
    const Head h = head_of(d, pq, pk, pv, pg, pb, b, hv);
    float* S = ps + task * SS;
    if (ps0)
      std::copy_n(ps0 + task * SS, SS, S);
    else
      std::fill_n(S, SS, 0.0f);
    float* out = po + (b * d.T * d.Hv + hv) * d.Dv;
    const int64_t ostride = d.Hv * d.Dv;
    float* p = scratch_floats(size_t(d.Dv), 4);
    float* u = scratch_floats(size_t(d.Dv), 6);
    for (int64_t t0 = 0; t0 < d.T; t0 += C) {
      if (pstarts && t0 % kEvery == 0) std::copy_n(S, SS, pstarts + (task * d.starts() + t0 / kEvery) * SS);
      if (C == 1)
        step(d, h, t0, S, S, p, u, out + t0 * ostride);
      else
        chunk_forward(d, h, t0, std::min(C, d.T - t0), S, out + t0 * ostride, ostride);
    }
  });
}

void gated_delta_rule_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                               const Tensor& beta, const Tensor& s0, const Tensor& starts, const Tensor& go,
                               const Tensor& gs, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                               Tensor& ds0) {
  const Dims d = dims_of(q, v);
  const int64_t n_chunks = d.starts();
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pg = g.data<float>(), *pb = beta.data<float>();
  const float* ps0 = s0.defined() ? s0.data<float>() : nullptr;
  const float* pstarts = starts.defined() ? starts.data<float>() : nullptr;
  const float* pgo = go.data<float>();
  const float* pgs = gs.defined() ? gs.data<float>() : nullptr;
  float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
  float *pdg = dg.data<float>(), *pdb = dbeta.data<float>();
  float* pds0 = ds0.defined() ? ds0.data<float>() : nullptr;
  parallel_tasks(d.B * d.Hk, [&, d](int64_t task) {
    const int64_t T = d.T, Hk = d.Hk, Hv = d.Hv, Dk = d.Dk, Dv = d.Dv, SS = Dk * Dv;
    const int64_t b = task / Hk, hk = task % Hk;
    // This task's rows of dq and dk: every V head of the group adds to them.
    for (int64_t t = 0; t < d.T; ++t) {
      std::fill_n(pdq + ((b * d.T + t) * d.Hk + hk) * Dk, Dk, 0.0f);
      std::fill_n(pdk + ((b * d.T + t) * d.Hk + hk) * Dk, Dk, 0.0f);
    }
    // Per block: the state before each token, and each token's p and u; per chunk, the state
    // at each block start.
    float* states = scratch_floats(size_t((kSub + 1) * SS), 0);
    float* P = scratch_floats(size_t(kSub * Dv), 1);
    float* Uc = scratch_floats(size_t(kSub * Dv), 2);
    std::vector<float> block_starts_buf(static_cast<size_t>((kEvery / kSub) * SS));
    float* block_starts = block_starts_buf.data();
    float* dS = scratch_floats(size_t(SS), 3);
    float* du = scratch_floats(size_t(Dv), 4);
    float* dp = scratch_floats(size_t(Dv), 5);
    float* part_q = scratch_floats(size_t(Dk * 8), 6);  // per row: 8 lanes of a dot product
    std::vector<float> part_k_buf(static_cast<size_t>(Dk * 8));
    float* part_k = part_k_buf.data();
    std::vector<float> own_starts(pstarts ? 0 : size_t(n_chunks * SS));
    for (int64_t hv = hk; hv < d.Hv; hv += d.Hk) {
      const Head h = head_of(d, pq, pk, pv, pg, pb, b, hv);
      const int64_t sidx = (b * d.Hv + hv) * SS;
      const float* chunk_starts = pstarts ? pstarts + (b * d.Hv + hv) * n_chunks * SS : own_starts.data();
      if (!pstarts) {  // the state at every chunk start
        float* S = own_starts.data();
        if (ps0)
          std::copy_n(ps0 + sidx, SS, S);
        else
          std::fill_n(S, SS, 0.0f);
        for (int64_t c = 0; c + 1 < n_chunks; ++c) {
          float* next = S + SS;
          std::copy_n(S, SS, next);
          for (int64_t t = c * kEvery; t < (c + 1) * kEvery; ++t) step(d, h, t, next, next, P, Uc, nullptr);
          S = next;
        }
      }
      if (pgs)
        std::copy_n(pgs + sidx, SS, dS);
      else
        std::fill_n(dS, SS, 0.0f);
      // Chunks in reverse; inside a chunk, blocks of kSub tokens in reverse, each block's
      // states recomputed from its start (the block starts from one pass over the chunk), so
      // the states walked back over stay in L2.
      for (int64_t c = n_chunks - 1; c >= 0; --c) {
        const int64_t c0 = c * kEvery, cn = std::min(kEvery, T - c0), n_blocks = (cn + kSub - 1) / kSub;
        std::copy_n(chunk_starts + c * SS, SS, block_starts);
        for (int64_t blk = 1; blk < n_blocks; ++blk) {
          float* S = block_starts + blk * SS;
          std::copy_n(S - SS, SS, S);
          for (int64_t t = c0 + (blk - 1) * kSub; t < c0 + blk * kSub; ++t) step(d, h, t, S, S, P, Uc, nullptr);
        }
        for (int64_t blk = n_blocks - 1; blk >= 0; --blk) {
        const int64_t t0 = c0 + blk * kSub, n = std::min(kSub, c0 + cn - t0);
        std::copy_n(block_starts + blk * SS, SS, states);
        for (int64_t i = 0; i < n; ++i)
          step(d, h, t0 + i, states + i * SS, states + (i + 1) * SS, P + i * Dv, Uc + i * Dv, nullptr);
        for (int64_t i = n - 1; i >= 0; --i) {
          const int64_t t = t0 + i;
          const float* Sp = states + i * SS;  // the state before token t
          const float *p = P + i * Dv, *u = Uc + i * Dv;
          const float a = std::exp(h.gt(t)), bt = h.bt(t);
          const float *qt = h.qt(t), *kt = h.kt(t), *vt = h.vt(t);
          const float* got = pgo + ((b * T + t) * Hv + hv) * Dv;
          float* dqt = pdq + ((b * T + t) * Hk + hk) * Dk;
          float* dkt = pdk + ((b * T + t) * Hk + hk) * Dk;
          float* dvt = pdv + ((b * T + t) * Hv + hv) * Dv;
          // With S_new = a S_prev + k u^T:
          //   o = S_new^T q:  dq = S_new dO = a S_prev dO + k (u.dO);  dS_new += q dO^T
          //   S_new's k u^T:  du = dS_new^T k;  dk += dS_new u
          // Row dot products go to 8-lane partials, summed for all rows at once afterwards.
          std::fill_n(du, Dv, 0.0f);
          for (int64_t r = 0; r < Dk; ++r) {
            const float* sp = Sp + r * Dv;
            float* ds = dS + r * Dv;
            const __m256 vq = _mm256_set1_ps(qt[r]), vk = _mm256_set1_ps(kt[r]);
            __m256 acc_q = _mm256_setzero_ps(), acc_k = _mm256_setzero_ps();
            int64_t j = 0;
            for (; j + 8 <= Dv; j += 8) {
              const __m256 o8 = _mm256_loadu_ps(got + j);
              const __m256 ds8 = _mm256_fmadd_ps(vq, o8, _mm256_loadu_ps(ds + j));
              _mm256_storeu_ps(ds + j, ds8);
              _mm256_storeu_ps(du + j, _mm256_fmadd_ps(vk, ds8, _mm256_loadu_ps(du + j)));
              acc_q = _mm256_fmadd_ps(_mm256_loadu_ps(sp + j), o8, acc_q);
              acc_k = _mm256_fmadd_ps(ds8, _mm256_loadu_ps(u + j), acc_k);
            }
            _mm256_storeu_ps(part_q + r * 8, acc_q);
            _mm256_storeu_ps(part_k + r * 8, acc_k);
            for (; j < Dv; ++j) {  // (a tail: into lane 0)
              ds[j] += qt[r] * got[j];
              du[j] += kt[r] * ds[j];
              part_q[r * 8] += sp[j] * got[j];
              part_k[r * 8] += ds[j] * u[j];
            }
          }
          const float u_do = dot_row(u, got, Dv);
          for (int64_t r = 0; r < Dk; ++r) dqt[r] += kt[r] * u_do;
          add_lane_sums(part_q, Dk, a, dqt);
          add_lane_sums(part_k, Dk, 1.0f, dkt);
          // u = beta (v - p).
          float dbeta_t = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            dbeta_t += du[j] * (vt[j] - p[j]);
            dvt[j] = bt * du[j];
            dp[j] = -bt * du[j];
          }
          pdb[(b * T + t) * Hv + hv] = dbeta_t;
          // p = a S_prev^T k and S_new's a S_prev: dk += a S_prev dp; dS' = dS_new + k dp^T (the
          // gradient of a S_prev); dg = a <dS', S_prev>; dS_prev = a dS'.
          const __m256 va = _mm256_set1_ps(a);
          __m256 acc_g = _mm256_setzero_ps();
          float dg_tail = 0;
          for (int64_t r = 0; r < Dk; ++r) {
            const float* sp = Sp + r * Dv;
            float* ds = dS + r * Dv;
            const __m256 vk = _mm256_set1_ps(kt[r]);
            __m256 acc_p = _mm256_setzero_ps();
            int64_t j = 0;
            for (; j + 8 <= Dv; j += 8) {
              const __m256 s8 = _mm256_loadu_ps(sp + j), dp8 = _mm256_loadu_ps(dp + j);
              const __m256 ds8 = _mm256_fmadd_ps(vk, dp8, _mm256_loadu_ps(ds + j));
              acc_p = _mm256_fmadd_ps(s8, dp8, acc_p);
              acc_g = _mm256_fmadd_ps(ds8, s8, acc_g);
              _mm256_storeu_ps(ds + j, _mm256_mul_ps(va, ds8));
            }
            _mm256_storeu_ps(part_q + r * 8, acc_p);
            for (; j < Dv; ++j) {
              const float ds_j = ds[j] + kt[r] * dp[j];
              part_q[r * 8] += sp[j] * dp[j];
              dg_tail += ds_j * sp[j];
              ds[j] = a * ds_j;
            }
          }
          add_lane_sums(part_q, Dk, a, dkt);
          pdg[(b * T + t) * Hv + hv] = a * (hsum256(acc_g) + dg_tail);
        }
        }
      }
      if (pds0) std::copy_n(dS, SS, pds0 + sidx);
    }
  });
}

// ---- the layer's q/k/v split with the L2 norms -------------------------------------------

void gdn_split_norm(const Tensor& c, int64_t Hk, int64_t Hv, int64_t D, float eps, float q_scale, Tensor& q,
                    Tensor& k, Tensor& v, Tensor& q_inv, Tensor& k_inv) {
  const int64_t rows = c.size(0) * c.size(1), C = c.size(2);
  const float* pc = c.data<float>();
  float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  float *pqi = q_inv.data<float>(), *pki = k_inv.data<float>();
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* cr = pc + r * C;
      for (int64_t h = 0; h < Hk; ++h) {
        for (int part = 0; part < 2; ++part) {  // q then k
          const float* x = cr + (part * Hk + h) * D;
          float* y = (part ? pk : pq) + (r * Hk + h) * D;
          const float inv = 1.0f / std::max(std::sqrt(dot_row(x, x, D)), eps);
          (part ? pki : pqi)[r * Hk + h] = inv;
          const float m = part ? inv : inv * q_scale;
          for (int64_t j = 0; j < D; ++j) y[j] = x[j] * m;
        }
      }
      std::copy_n(cr + 2 * Hk * D, Hv * D, pv + r * Hv * D);
    }
  });
}

void gdn_split_norm_backward(const Tensor& q, const Tensor& k, const Tensor& q_inv, const Tensor& k_inv, float eps,
                             float q_scale, const Tensor& dq, const Tensor& dk, const Tensor& dv, Tensor& dc) {
  const int64_t Hk = q.size(2), D = q.size(3), Hv = dv.size(2), rows = q.size(0) * q.size(1), C = dc.size(2);
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pqi = q_inv.data<float>(), *pki = k_inv.data<float>();
  const float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
  float* pdc = dc.data<float>();
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* dr = pdc + r * C;
      for (int64_t h = 0; h < Hk; ++h) {
        for (int part = 0; part < 2; ++part) {
          // y = s x inv (s = q_scale for q, 1 for k), with n = y / s the unit vector:
          // dx = s inv (dy - n (n.dy)), or s inv dy where the norm was clamped at eps.
          const int64_t at = (r * Hk + h) * D;
          const float* y = (part ? pk : pq) + at;
          const float* dy = (part ? pdk : pdq) + at;
          const float inv = (part ? pki : pqi)[r * Hk + h], s = part ? 1.0f : q_scale;
          const bool clamped = inv >= 1.0f / eps;
          const float proj = clamped ? 0.0f : dot_row(y, dy, D) / (s * s);
          float* dx = dr + (part * Hk + h) * D;
          for (int64_t j = 0; j < D; ++j) dx[j] = s * inv * (dy[j] - y[j] * proj);
        }
      }
      std::copy_n(pdv + r * Hv * D, Hv * D, dr + 2 * Hk * D);
    }
  });
}

}  // namespace toy::cpu
