// AVX-512 forms of simd.h's helpers, for the avx512 kernel variant (cpu_features.h). Every
// function carries TOY_AVX512 so that this header can be included from the AVX2 translation
// units: the code runs only behind a check of avx512_forms() (variant.h).
// Bit-identity with the AVX2 forms: each helper does the AVX2 form's operations lane for lane
// in the same order, and a 512-bit accumulator holds what the AVX2 loops keep in two 256-bit
// ones (lanes 0-7 the first, 8-15 the second), folded as hsum256(first + second). So a kernel
// gives the same bits on every CPU, whichever variant runs (tested per kernel).
#pragma once
#include <immintrin.h>

#include "toy/backend/cpu/simd.h"

// GCC 12 warns inside its own AVX-512 headers (intrinsics that start from a deliberately
// undefined register, e.g. the shifts and the 256-bit extract). The warnings are reported
// where the intrinsics are inlined, in the including file's functions, so the two warnings
// stay off for the rest of every file that includes this header (a push/pop here would not
// cover them).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define TOY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace toy::cpu {

TOY_AVX512 inline __m512 exp_reduced512(__m512 r) {
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 a = _mm512_fmadd_ps(_mm512_set1_ps(1.66665206898e-1f), r, _mm512_set1_ps(4.99999934517e-1f));
  const __m512 b = _mm512_fmadd_ps(_mm512_set1_ps(8.36870982417e-3f), r, _mm512_set1_ps(4.16683873613e-2f));
  const __m512 c = _mm512_fmadd_ps(_mm512_set1_ps(1.38146132608e-3f), r2, b);
  const __m512 d = _mm512_fmadd_ps(c, r2, a);
  return _mm512_fmadd_ps(d, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

// exp256_nonpos on 16 lanes: the lanes below -87.3 are zeroed by the compare's mask instead
// of an and-not (NaN compares "not less" and stays NaN, as there).
TOY_AVX512 inline __m512 exp512_nonpos(__m512 x) {
  const __m512 shift = _mm512_set1_ps(12583039.0f);  // 1.5 * 2^23 + 127
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365402f), _CMP_NLT_UQ);
  const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift);
  const __m512 n = _mm512_sub_ps(z, shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  return _mm512_maskz_mul_ps(keep, exp_reduced512(r), _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(z), 23)));
}

// The two 256-bit halves (the AVX2 forms' first and second accumulators).
TOY_AVX512 inline __m256 low256(__m512 v) { return _mm512_castps512_ps256(v); }
TOY_AVX512 inline __m256 high256(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// sigmoid_pair256 on 16 lanes (an exact division, as there: the same bits on any CPU).
TOY_AVX512 inline void sigmoid_pair512(__m512 x, __m512* s, __m512* one_minus_s) {
  const __m512 t = exp512_nonpos(_mm512_or_ps(x, _mm512_set1_ps(-0.0f)));  // exp(-|x|)
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), d);
  const __m512 tr = _mm512_mul_ps(t, r);
  const __mmask16 negative = _mm512_movepi32_mask(_mm512_castps_si512(x));  // the sign bit, as blendv reads it
  *s = _mm512_mask_blend_ps(negative, r, tr);
  *one_minus_s = _mm512_mask_blend_ps(negative, tr, r);
}

// max_row on 16 lanes (the AVX2 form's m0 | m1).
TOY_AVX512 inline float max_row512(const float* p, int64_t n, float init) {
  __m512 m = _mm512_set1_ps(init);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(p + i));
  __m256 m0 = low256(m);
  const __m256 m1 = high256(m);
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p + i));
  float r = hmax256(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) r = p[i] > r ? p[i] : r;
  return r;
}

// exp_shifted_row_sum on 16 lanes: lanes 0-7 of the sum are its first accumulator, 8-15 its
// second.
TOY_AVX512 inline float exp_shifted_row_sum512(float* p, int64_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 s = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    const __m512 a = exp512_nonpos(_mm512_sub_ps(_mm512_loadu_ps(p + c), vs));
    _mm512_storeu_ps(p + c, a);
    s = _mm512_add_ps(s, a);
  }
  __m256 s0 = low256(s);
  for (; c + 8 <= n; c += 8) {
    const __m256 a = exp256_nonpos(_mm256_sub_ps(_mm256_loadu_ps(p + c), low256(vs)));
    _mm256_storeu_ps(p + c, a);
    s0 = _mm256_add_ps(s0, a);
  }
  float sum = hsum256(_mm256_add_ps(s0, high256(s)));
  for (; c < n; ++c) sum += (p[c] = exp_nonpos_scalar(p[c] - shift));
  return sum;
}

TOY_AVX512 inline void exp_shifted_row512(float* p, int64_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) _mm512_storeu_ps(p + c, exp512_nonpos(_mm512_sub_ps(_mm512_loadu_ps(p + c), vs)));
  exp_shifted_row(p + c, n - c, shift);
}

}  // namespace toy::cpu
