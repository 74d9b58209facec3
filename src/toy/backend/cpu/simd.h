// AVX2/FMA helpers shared by the CPU kernels (include only from AVX2 translation units).
// exp and log are Cephes-style range reduction + polynomial, within ~2 ulp of libm over
// the float range, saturating like expf (exp(-inf) = 0, exp(+large) = inf).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "toy/core/dtype.h"

namespace toy::cpu {

// e^r for |r| <= ln(2)/2: 1 + r + r^2 q(r) with q a degree-4 minimax fit (relative error
// 3e-9, far below a float ulp). Coefficients from a Remez fit in 40-digit arithmetic; the
// constant and linear terms are exactly 1. Estrin's scheme: four dependent FMAs instead of
// six, so more exps overlap in flight (the loops using this are latency-bound).
inline __m256 exp_reduced(__m256 r) {
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(1.66665206898e-1f), r, _mm256_set1_ps(4.99999934517e-1f));
  const __m256 b = _mm256_fmadd_ps(_mm256_set1_ps(8.36870982417e-3f), r, _mm256_set1_ps(4.16683873613e-2f));
  const __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(1.38146132608e-3f), r2, b);
  const __m256 d = _mm256_fmadd_ps(c, r2, a);
  return _mm256_fmadd_ps(d, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
}

inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228394f), lo = _mm256_set1_ps(-103.972639f);  // hi: ln(FLT_MAX)
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(hi, _mm256_max_ps(lo, x));  // operand order keeps NaN
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, c1, x);
  x = _mm256_fnmadd_ps(fx, c2, x);
  __m256 y = exp_reduced(x);
  // 2^fx in two steps so that fx down to -150 (subnormal results) stays exact enough.
  __m256i n = _mm256_cvtps_epi32(fx);
  __m256i n1 = _mm256_srai_epi32(n, 1);
  __m256i n2 = _mm256_sub_epi32(n, n1);
  __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
  __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
  y = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
  return _mm256_andnot_ps(under, y);
}

// exp for x <= 0 (the shifted scores of softmax, attention and cross-entropy): one range
// reduction, no overflow path; -inf and anything below -87.3 give exactly 0; NaN stays NaN.
// Within 1 ulp of the correctly rounded result on [-87.3, 0] (checked exhaustively).
// Rounding x log2(e) to an integer n by adding 1.5 * 2^23 + 127 leaves n + 127 in the low
// mantissa bits of z; shifted into the exponent field they are 2^n: no round or convert
// instruction. Scaling by a multiply (not an exponent add) keeps NaN a NaN.
inline __m256 exp256_nonpos(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365402f);
  const __m256 shift = _mm256_set1_ps(12583039.0f);  // 1.5 * 2^23 + 127
  // Below lo (and -inf) the scaling below is garbage, which the final mask turns into 0.
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
  __m256 n = _mm256_sub_ps(z, shift);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln 2 in two parts (Cody-Waite)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // For x >= lo, n >= -126, so 2^n is a normal float.
  __m256 y = _mm256_mul_ps(exp_reduced(r), _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(z), 23)));
  return _mm256_andnot_ps(under, y);
}

inline __m256 log256(__m256 x) {
  // log(x) = log(m * 2^e) for m in [sqrt(0.5), sqrt(2)).
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 invalid = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  __m256 nan_in = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 zero = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ);
  __m256 inf = _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
  // Scale subnormals up first.
  __m256 sub = _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  x = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), sub);
  __m256 ebias = _mm256_blendv_ps(_mm256_setzero_ps(), _mm256_set1_ps(23.0f), sub);
  __m256i xi = _mm256_castps_si256(x);
  __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(xi, 23), _mm256_set1_epi32(127));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(xi, _mm256_set1_epi32(0x007fffff)),
                                                 _mm256_set1_epi32(0x3f800000)));
  __m256 ef = _mm256_sub_ps(_mm256_cvtepi32_ps(e), ebias);
  __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GE_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), small);
  ef = _mm256_add_ps(ef, _mm256_and_ps(small, one));
  __m256 f = _mm256_sub_ps(m, one);
  __m256 z = _mm256_mul_ps(f, f);
  __m256 y = _mm256_set1_ps(7.0376836292E-2f);
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.1514610310E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.1676998740E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.2420140846E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.4249322787E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.6668057665E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.0000714765E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-2.4999993993E-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(3.3333331174E-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, f), z);
  y = _mm256_fmadd_ps(ef, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  __m256 r = _mm256_add_ps(f, y);
  r = _mm256_fmadd_ps(ef, _mm256_set1_ps(0.693359375f), r);
  r = _mm256_blendv_ps(r, _mm256_set1_ps(-INFINITY), zero);
  r = _mm256_blendv_ps(r, _mm256_set1_ps(INFINITY), inf);
  return _mm256_blendv_ps(r, _mm256_set1_ps(NAN), _mm256_or_ps(invalid, nan_in));
}

// sigmoid(x) and 1 - sigmoid(x) = sigmoid(-x), both without cancellation. With t = exp(-|x|)
// in (0, 1] and r = 1/(1+t): for x >= 0 they are (r, t r), below 0 (t r, r). Only the cheap exp
// of a non-positive argument is needed, and nothing can overflow.
inline void sigmoid_pair256(__m256 x, __m256* s, __m256* one_minus_s) {
  const __m256 t = exp256_nonpos(_mm256_or_ps(x, _mm256_set1_ps(-0.0f)));  // exp(-|x|)
  // 1 / (1 + t) for 1 + t in [1, 2], divided exactly: the reciprocal estimate (rcpps) differs
  // between CPU makers, so with it the bits of every sigmoid, silu and gelu did too (and its
  // Newton step gave 0.49999997 at 0 on AMD); these kernels are bound by memory, and the
  // division cost nothing measurable (toy bench ops silu/gelu on Zen 4).
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), t);
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), d);
  const __m256 tr = _mm256_mul_ps(t, r);
  *s = _mm256_blendv_ps(r, tr, x);  // the sign bit of x selects
  *one_minus_s = _mm256_blendv_ps(tr, r, x);
}

inline __m256 sigmoid256(__m256 x) {
  __m256 s, c;
  sigmoid_pair256(x, &s, &c);
  return s;
}

inline __m256 tanh256(__m256 x) {
  // tanh(x) = 2 sigmoid(2x) - 1; for small |x| use x - x^3/3 + 2x^5/15 to keep relative accuracy.
  __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  __m256 s = sigmoid256(_mm256_add_ps(x, x));
  __m256 big = _mm256_fmsub_ps(_mm256_set1_ps(2.0f), s, _mm256_set1_ps(1.0f));
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_fmadd_ps(x2, _mm256_set1_ps(-17.0f / 315.0f), _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
  __m256 smallv = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
  return _mm256_blendv_ps(big, smallv, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
}

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float hmax256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_max_ps(lo, hi);
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// max(init, p[0..n)) with vector lanes (a scalar std::max loop over a spilled accumulator
// is several times slower).
inline float max_row(const float* p, int64_t n, float init) {
  __m256 m0 = _mm256_set1_ps(init), m1 = m0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(p + i + 8));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + i));
  float m = hmax256(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  return m;
}

// Loads/stores 8 elements of T as f32 (F16 through F16C, BF16 by shifting).
template <class T>
inline __m256 load8(const T* p);
template <>
inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
inline __m256 load8<f16>(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <>
inline __m256 load8<bf16>(const bf16* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
template <class T>
inline void store8(T* p, __m256 v);
template <>
inline void store8<float>(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
template <>
inline void store8<f16>(f16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
template <>
inline void store8<bf16>(bf16* p, __m256 v) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  for (int i = 0; i < 8; ++i) p[i] = from_f32<bf16>(tmp[i]);
}

// Transposes 8 x 8 floats in registers: r[i] lane q <-> r[q] lane i.
inline void transpose8_ps(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Outputs larger than this bypass the caches (non-temporal stores): a write-once stream that
// will not be read back soon should not evict the working set or pay read-for-ownership.
inline constexpr size_t kStreamingStoreBytes = size_t(16) << 20;

// Whether f32 rows of `row_len` at `base` (`total_bytes` in all) take streaming stores: large
// enough, and every row 32-byte aligned as the stores require.
inline bool stream_rows(const float* base, int64_t row_len, size_t total_bytes) {
  return total_bytes >= kStreamingStoreBytes && row_len % 8 == 0 && (reinterpret_cast<uintptr_t>(base) & 31) == 0;
}

// Stores 8 floats, streaming when `stream` (p must then be 32-byte aligned).
inline void store8_f32(float* p, __m256 v, bool stream) {
  if (stream)
    _mm256_stream_ps(p, v);
  else
    _mm256_storeu_ps(p, v);
}

// sum a[i] * b[i] over n elements (any float type), two vector accumulators.
template <class T>
inline float dot_row(const T* a, const T* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_fmadd_ps(load8(a + j), load8(b + j), acc0);
    acc1 = _mm256_fmadd_ps(load8(a + j + 8), load8(b + j + 8), acc1);
  }
  for (; j + 8 <= n; j += 8) acc0 = _mm256_fmadd_ps(load8(a + j), load8(b + j), acc0);
  float s = hsum256(_mm256_add_ps(acc0, acc1));
  for (; j < n; ++j) s += to_f32(a[j]) * to_f32(b[j]);
  return s;
}

inline float exp_scalar(float x) {
  alignas(32) float t[8];
  _mm256_store_ps(t, exp256(_mm256_set1_ps(x)));
  return t[0];
}

inline float exp_nonpos_scalar(float x) {
  alignas(32) float t[8];
  _mm256_store_ps(t, exp256_nonpos(_mm256_set1_ps(x)));
  return t[0];
}

// p[c] = exp(p[c] - shift) for c < n (p[c] <= shift), in place; returns their sum, kept
// as 16-value blocks in two 8-lane accumulators, then one 8-lane step into the first, then
// the scalar rest (simd512.h's form keeps the same sums in one 16-lane register).
inline float exp_shifted_row_sum(float* p, int64_t n, float shift) {
  const __m256 vs = _mm256_set1_ps(shift);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m256 a = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + c), vs));
    const __m256 b = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + c + 8), vs));
    _mm256_storeu_ps(p + c, a);
    _mm256_storeu_ps(p + c + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  for (; c + 8 <= n; c += 8) {
    const __m256 a = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + c), vs));
    _mm256_storeu_ps(p + c, a);
    s0 = _mm256_add_ps(s0, a);
  }
  float sum = hsum256(_mm256_add_ps(s0, s1));
  for (; c < n; ++c) sum += (p[c] = exp_nonpos_scalar(p[c] - shift));
  return sum;
}

// p[c] = exp(p[c] - shift) for c < n, in place.
inline void exp_shifted_row(float* p, int64_t n, float shift) {
  const __m256 vs = _mm256_set1_ps(shift);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(p + c, exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + c), vs)));
  for (; c < n; ++c) p[c] = exp_nonpos_scalar(p[c] - shift);
}

}  // namespace toy::cpu
