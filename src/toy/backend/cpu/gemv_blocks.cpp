// Products of a few activation rows with a weight kept in its stored dtype, straight from
// the blocks: the decode-time path, which is bound by reading the weights, so each weight
// row is read once and dotted with every activation row while it is in L1.
//   - Q8_0, Q4_0, Q5_0: quant_products.cpp (the same arithmetic for any number of rows).
//   - The K types (Q4_K, Q6_K): the activations are first quantized to
//     8-bit values exactly as llama.cpp quantizes them for that weight type (Q8_0: blocks of
//     32, scale amax/127 rounded to f16; the K types: Q8_K, blocks of 256, scale from the
//     signed largest value), plus the sums of every 16 values, and each block product is an
//     integer dot product (maddubs: 32 multiply-adds per instruction) scaled once. Rounding
//     as llama.cpp does makes a quantized model compute the numbers it computes, not merely
//     numbers as close to the f32 product: the greedy tokens agree even at near-ties.
//   - F16 / BF16: the activations rounded to f16 / bf16 as llama.cpp rounds them (its dot
//     type for those weights), then weights widened 8 at a time in registers, products in f32.
// Rows are split across threads; each thread writes only its own outputs, so the result does
// not depend on the thread count.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/quant_products.h"
#include "toy/backend/cpu/row_blocks.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/core/cpu_features.h"
#include "toy/core/error.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

// Activations of one row as 8-bit blocks of 32.
struct Q8Row {
  const float* d;       // [K / 32] scales
  const int8_t* q;      // [K] values
  const int16_t* sum16; // [K / 16] sums of 16 values
};

}  // namespace

namespace {

inline float round_to_f16(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

// 32 floats times inv, rounded to nearest (even), saturated to int8, stored in order.
inline void round_block32(const float* xb, __m256 inv, int8_t* q) {
  __m256i qi[4];
  for (int i = 0; i < 4; ++i)
    qi[i] = _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  // int32 x 32 -> int8 x 32 in element order (packs interleave 128-bit lanes; permute back).
  __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
  __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
  __m256i p = _mm256_packs_epi16(p01, p23);
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p);
}

void sums_of_16(const int8_t* q, int64_t K, int16_t* sum16) {
  for (int64_t i = 0; i < K / 16; ++i) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += q[16 * i + j];
    sum16[i] = int16_t(s);
  }
}

// Q8_K (llama.cpp's quantize_row_q8_K): per 256 values, the one of largest magnitude (the
// first, with its sign) maps to -127; d = max / -127 (repeated for the block's eight 32s).
void quantize_q8_k(const float* x, int64_t K, float* d, int8_t* q, int16_t* sum16) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 256; ++b) {
    const float* xb = x + b * 256;
    __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int i = 0; i < 32; ++i) {
      const __m256 v = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v));
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float am = _mm_cvtss_f32(m);
    float scale = 0, iscale = 0;
    if (_mm256_movemask_ps(nan)) {
      scale = NAN;  // a NaN activation makes every product with the block NaN, as in f32
    } else if (am != 0.0f) {
      int j = 0;
      while (std::fabs(xb[j]) != am) ++j;
      iscale = -127.0f / xb[j];
      scale = 1.0f / iscale;
    }
    for (int i = 0; i < 8; ++i) {
      d[b * 8 + i] = scale;
      round_block32(xb + 32 * i, _mm256_set1_ps(iscale), q + b * 256 + 32 * i);
    }
  }
  sums_of_16(q, K, sum16);
}

void quantize_q8_0(const float* x, int64_t K, float* d, int8_t* q, int16_t* sum16) {
  for (int64_t b = 0; b < K / 32; ++b) d[b] = quantize_block_q8_0(x + b * 32, q + b * 32);
  sums_of_16(q, K, sum16);
}

}  // namespace

// Q8_0 (llama.cpp's quantize_row_q8_0): per 32 values, q = round(x * 127 / amax); the scale
// amax / 127 is stored as f16, so the products use the f16-rounded value.
float quantize_block_q8_0(const float* xb, int8_t* q) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xb + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[i]));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float am = _mm_cvtss_f32(m);
  // A NaN or infinite activation makes the block's scale NaN / inf, so every product with
  // it is NaN, as in f32, instead of vanishing.
  const float scale = _mm256_movemask_ps(nan) ? NAN : am / 127.0f;
  round_block32(xb, _mm256_set1_ps(scale != 0.0f && std::isfinite(scale) ? 127.0f / am : 0.0f), q);
  return std::isfinite(scale) ? round_to_f16(scale) : scale;
}

bool activations_in_256s(DType weight) {
  switch (weight) {
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

void quantize_activations(DType weight, const float* x, int64_t K, float* d, int8_t* q, int16_t* sum16) {
  if (activations_in_256s(weight))
    quantize_q8_k(x, K, d, q, sum16);
  else
    quantize_q8_0(x, K, d, q, sum16);
}

bool rounds_activations(DType weight) { return weight == DType::F16 || weight == DType::BF16 || is_block(weight); }

namespace {
// x rounded to f16 (to nearest even, as F16C converts) and back, 8 at a time.
void round_row_to_f16(const float* x, int64_t K, float* out) {
  int64_t i = 0;
  for (; i + 8 <= K; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
  for (; i < K; ++i) out[i] = round_to_f16(x[i]);
}
void round_row_to_bf16(const float* x, int64_t K, float* out) {
  for (int64_t i = 0; i < K; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
}
}  // namespace

void round_activations(DType weight, const float* x, int64_t K, float* out) {
  if (weight == DType::F16) return round_row_to_f16(x, K, out);
  if (weight == DType::BF16) return round_row_to_bf16(x, K, out);
  // Quantize 256 at a time into a small buffer, then write d * q back.
  alignas(32) int8_t q[256];
  float d[8];
  int16_t s16[16];
  for (int64_t k0 = 0; k0 < K; k0 += 256) {
    const int64_t n = std::min<int64_t>(256, K - k0);
    quantize_activations(weight, x + k0, n, d, q, s16);
    for (int64_t b = 0; b < n / 32; ++b) {
      const __m256 db = _mm256_set1_ps(d[b]);
      for (int64_t i = 32 * b; i < 32 * b + 32; i += 8) {
        const __m256i qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
        _mm256_storeu_ps(out + k0 + i, _mm256_mul_ps(db, _mm256_cvtepi32_ps(qi)));
      }
    }
  }
}

namespace {

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The K types times Q8_K activations in llama.cpp's AVX2 arithmetic (ggml's
// vec_dot_q4_K_q8_K / vec_dot_q6_K_q8_K order), so a K-quant model decodes to llama.cpp's
// bits when the activations are the same: per super-block of 256, each sub-block's scale is
// applied in integers (maddubs of weight and activation bytes, then madd with the scale as
// 16 bits) into 8 int32 lanes — lane k holds bytes 4k..4k+3 of every 32-value run — and one
// fma by d = d_x * d_w folds them into an 8-lane float accumulator, summed at the end by
// hsum256. Every integer is exact (no lane can overflow), so only the fma order is the
// contract.

// The 16-bit value at index i of a register of eight, in every 16-bit lane (pshufb pattern).
inline __m256i broadcast16(__m256i eight_twice, int i) {
  return _mm256_shuffle_epi8(eight_twice, _mm256_set1_epi16(int16_t((2 * i) | ((2 * i + 1) << 8))));
}

// Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins for the 8 sub-blocks of 32, 128
// bytes of nibbles (32 bytes per 64 values: low nibbles the first 32, high the next). The
// mins enter as -d_x * dmin times, in 4 int32 lanes, min_2t * sum_2t + min_2t+1 * sum_2t+1
// (sum_j: the activation sub-block's sum), their own fma accumulator, added last as
// (lanes 0 + 2) + (lanes 1 + 3).
float dot_q4_k(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 144) {
    prefetch_ahead(w, 3);
    const float xd = x.d[sb * 8];
    const float d = xd * half_at(w), dmin = -xd * half_at(w + 2);
    // The 12 packed bytes -> scales 0..7, then mins 0..7, a byte each (6 bits: the low 6 of
    // bytes 0..3 / 4..7 for sub-blocks 0..3; for 4..7 a nibble of bytes 8..11 plus the top
    // two bits of bytes 0..3 / 4..7).
    uint32_t p[3], u[4];
    std::memcpy(p, w + 4, 12);
    u[0] = p[0] & 0x3f3f3f3f;
    u[1] = (p[2] & 0x0f0f0f0f) | (((p[0] >> 6) & 0x03030303) << 4);
    u[2] = p[1] & 0x3f3f3f3f;
    u[3] = ((p[2] >> 4) & 0x0f0f0f0f) | (((p[1] >> 6) & 0x03030303) << 4);
    const __m256i scales_mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
    const __m256i scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
    const __m128i mins = _mm256_extracti128_si256(scales_mins, 1);
    const int8_t* xq = x.q + sb * 256;
    const uint8_t* qs = w + 16;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      const __m256i lo = _mm256_madd_epi16(broadcast16(scales, 2 * j),
                                           _mm256_maddubs_epi16(_mm256_and_si256(q, low), load32(xq + 64 * j)));
      const __m256i hi = _mm256_madd_epi16(
          broadcast16(scales, 2 * j + 1),
          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), load32(xq + 64 * j + 32)));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(lo, hi));
    }
    const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sum16 + sb * 16));
    const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(sums16), _mm256_extracti128_si256(sums16, 1));
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, sums32)), acc_m);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
  return hsum256(acc) + _mm_cvtss_f32(acc_m);
}

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 values),
// d (f16). Values 0..63 stand for value - 32: the 32s come off in integers, as 32 times each
// 16-value scale times its activation sum (8 lanes: sub-block k's two scales and sums).
float dot_q6_k(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 210) {
    prefetch_ahead(w, 4);
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
    const float d = x.d[sb * 8] * half_at(w + 208);
    const int8_t* xq = x.q + sb * 256;
    const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sum16 + sb * 16));
    const __m256i thirty_twos = _mm256_slli_epi32(_mm256_madd_epi16(sums16, _mm256_cvtepi8_epi16(sc)), 5);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      // The four 32-value runs of this half: elements 128h + 32r .. + 31, values 0..63.
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(A, low), _mm256_slli_epi16(_mm256_and_si256(H, two), 4)),
          _mm256_or_si256(_mm256_and_si256(B, low), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), low),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), low),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), two), 4)),
      };
      __m256i p[4];
      for (int r = 0; r < 4; ++r) {
        // Run r's two scales (values 0..15 and 16..31), each in eight 16-bit lanes.
        const int is = 8 * h + 2 * r;
        const __m256i s2 = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc, _mm_setr_epi8(char(is), char(is), char(is), char(is), char(is), char(is), char(is),
                                               char(is), char(is + 1), char(is + 1), char(is + 1), char(is + 1),
                                               char(is + 1), char(is + 1), char(is + 1), char(is + 1))));
        p[r] = _mm256_madd_epi16(s2, _mm256_maddubs_epi16(q[r], load32(xq + 128 * h + 32 * r)));
      }
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
    }
    sumi = _mm256_sub_epi32(sumi, thirty_twos);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum256(acc);
}

float dot_f16(const uint8_t* w, const float* x, int64_t K) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(w);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= K; i += 16) {
    if ((i & 31) == 0) prefetch_ahead(reinterpret_cast<const uint8_t*>(h + i));
    a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))),
                         _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i + 8))),
                         _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < K; ++i) s += _cvtsh_ss(h[i]) * x[i];
  return s;
}

inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float dot_bf16(const uint8_t* w, const float* x, int64_t K) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(w);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= K; i += 16) {
    if ((i & 31) == 0) prefetch_ahead(reinterpret_cast<const uint8_t*>(h + i));
    a0 = _mm256_fmadd_ps(bf16x8(h + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(bf16x8(h + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < K; ++i) {
    uint32_t u = uint32_t(h[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    s += f * x[i];
  }
  return s;
}

using BlockDot = float (*)(const uint8_t*, const Q8Row&, int64_t);
using FloatDot = float (*)(const uint8_t*, const float*, int64_t);

// The K types' dot products (the 32-value block types go to quant_products).
BlockDot block_dot(DType t) {
  switch (t) {
    case DType::Q4_K: return dot_q4_k;
    case DType::Q6_K: return dot_q6_k;
    default: return nullptr;
  }
}

}  // namespace

bool gemv_blocks_supports(DType t) {
  return t == DType::F16 || t == DType::BF16 || quant_products_supports(t) || block_dot(t) != nullptr;
}

void gemv_blocks(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), K = w.size(1), out = w.size(0);
  TOY_CHECK(N <= kGemvMaxRows && gemv_blocks_supports(w.dtype()), "[gemv] {} rows of a {} weight", N,
            name(w.dtype()));
  if (quant_products_supports(w.dtype())) return quant_products(x, w, y, accumulate);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const size_t rb = row_bytes(w.dtype(), K);
  const uint8_t* wp = static_cast<const uint8_t*>(w.raw_data());
  auto put = [&](int64_t n, int64_t r, float v) {
    float& o = yp[n * out + r];
    o = accumulate ? o + v : v;
  };
  if (w.dtype() == DType::F16 || w.dtype() == DType::BF16) {
    const FloatDot dot = w.dtype() == DType::F16 ? dot_f16 : dot_bf16;
    float* xr = scratch_floats(size_t(N * K), 5);  // slot of matmul_weight: never live at once
    round_activations(w.dtype(), xp, N * K, xr);
    for_row_blocks(out, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t n = 0; n < N; ++n) put(n, r, dot(wp + size_t(r) * rb, xr + n * K, K));
    });
    return;
  }
  const BlockDot dot = block_dot(w.dtype());
  // The activations, quantized once (K / 32 scales, K values, K / 16 sums per row), in one
  // scratch buffer of floats.
  const int64_t row_floats = K / 32 + K / 4 + K / 32;
  float* buf = scratch_floats(size_t(N * row_floats), 5);  // slot of matmul_weight: never live at once
  Q8Row rows[kGemvMaxRows];
  for (int64_t n = 0; n < N; ++n) {
    float* base = buf + n * row_floats;
    float* d = base;
    int8_t* q = reinterpret_cast<int8_t*>(base + K / 32);
    int16_t* s16 = reinterpret_cast<int16_t*>(base + K / 32 + K / 4);
    quantize_activations(w.dtype(), xp + n * K, K, d, q, s16);
    rows[n] = {d, q, s16};
  }
  for_row_blocks(out, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t n = 0; n < N; ++n) put(n, r, dot(wp + size_t(r) * rb, rows[n], K));
  });
}

// A prepared row: the 32-block types, quant_products' lone packed row; the K types, scales,
// values and sums of 16 as gemv_blocks quantizes them; F16/BF16, the rounded floats.
PreparedRows::PreparedRows(DType weight, const float* x, int64_t rows, int64_t K) : weight_(weight), K_(K) {
  TOY_CHECK(gemv_blocks_supports(weight), "[gemv] no products for {} weights", name(weight));
  if (quant_products_supports(weight))
    row_bytes_ = quant_lone_row_bytes(K);
  else if (weight == DType::F16 || weight == DType::BF16)
    row_bytes_ = size_t(K) * 4;
  else
    row_bytes_ = size_t(K / 32 + K / 4 + K / 32) * 4;
  buf_.resize(row_bytes_ * size_t(rows));
  for (int64_t n = 0; n < rows; ++n) {
    uint8_t* out = buf_.data() + size_t(n) * row_bytes_;
    if (quant_products_supports(weight)) {
      quant_pack_lone_row(x + n * K, K, out);
    } else if (weight == DType::F16 || weight == DType::BF16) {
      round_activations(weight, x + n * K, K, reinterpret_cast<float*>(out));
    } else {
      auto* d = reinterpret_cast<float*>(out);
      quantize_activations(weight, x + n * K, K, d, reinterpret_cast<int8_t*>(d + K / 32),
                           reinterpret_cast<int16_t*>(d + K / 32 + K / 4));
    }
  }
}

void PreparedRows::products(int64_t row, const uint8_t* w, int64_t r0, int64_t r1, float* y) const {
  const uint8_t* in = buf_.data() + size_t(row) * row_bytes_;
  if (quant_products_supports(weight_)) return quant_lone_row_products(weight_, in, w, K_, r0, r1, y);
  const size_t rb = row_bytes(weight_, K_);
  if (weight_ == DType::F16 || weight_ == DType::BF16) {
    const FloatDot dot = weight_ == DType::F16 ? dot_f16 : dot_bf16;
    for (int64_t r = r0; r < r1; ++r) y[r - r0] = dot(w + size_t(r) * rb, reinterpret_cast<const float*>(in), K_);
    return;
  }
  const auto* d = reinterpret_cast<const float*>(in);
  const Q8Row q{d, reinterpret_cast<const int8_t*>(d + K_ / 32), reinterpret_cast<const int16_t*>(d + K_ / 32 + K_ / 4)};
  const BlockDot dot = block_dot(weight_);
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = dot(w + size_t(r) * rb, q, K_);
}

extern std::atomic<bool> g_quant_vnni_on;  // quant_products.cpp
bool gemv_vnni_available() { return quant_dot() != QuantDot::Avx2; }
void gemv_use_vnni(bool on) { g_quant_vnni_on.store(on, std::memory_order_relaxed); }

}  // namespace toy::cpu
