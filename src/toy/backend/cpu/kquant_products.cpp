// Products with the K-quant weights (Q2_K to Q6_K) and activations rounded to Q8_K (llama.cpp's
// quantize_row_q8_K: gemv_blocks.h), in llama.cpp's AVX2 arithmetic (ggml's
// vec_dot_q{2,3,4,5,6}_K_q8_K order), so a K-quant model computes llama.cpp's
// numbers from the same activations: per super-block of 256, each sub-block's scale is
// applied in integers (maddubs of weight and activation bytes, then madd with the scale as
// 16 bits) into 8 int32 lanes — lane k holds bytes 4k..4k+3 of every 32-value run — and one
// fma by d = d_x * d_w folds them into an 8-lane float accumulator, summed at the end by
// hsum256. Every integer is exact (no lane can overflow), so only the fma order is the
// contract.
//
// One template computes a weight row against RX activation rows: the weight's values and
// scales are unpacked once per super-block and each activation row then runs exactly the
// one-row arithmetic, so decoding (RX = 1) and prompts (tiles of RX = 4) give a row the same
// bits. Threads split the weight rows (row_blocks.h).
#include "toy/backend/cpu/kquant_products.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstring>
#include <vector>

#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/row_blocks.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/error.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The 16-bit value at index i of a register of eight, in every 16-bit lane (pshufb pattern).
inline __m256i broadcast16(__m256i eight_twice, int i) {
  return _mm256_shuffle_epi8(eight_twice, _mm256_set1_epi16(int16_t((2 * i) | ((2 * i + 1) << 8))));
}

// Q4_K's and Q5_K's 12 packed bytes -> scales 0..7 then mins 0..7, as 16-bit values (6 bits
// each: the low 6 of bytes 0..3 / 4..7 for sub-blocks 0..3; for 4..7 a nibble of bytes 8..11
// plus the top two bits of bytes 0..3 / 4..7).
inline __m256i k4_scales_mins(const uint8_t* packed) {
  uint32_t p[3], u[4];
  std::memcpy(p, packed, 12);
  u[0] = p[0] & 0x3f3f3f3f;
  u[1] = (p[2] & 0x0f0f0f0f) | (((p[0] >> 6) & 0x03030303) << 4);
  u[2] = p[1] & 0x3f3f3f3f;
  u[3] = ((p[2] >> 4) & 0x0f0f0f0f) | (((p[1] >> 6) & 0x03030303) << 4);
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
}

// Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins for the 8 sub-blocks of 32, 128
// bytes of nibbles (32 bytes per 64 values: low nibbles the first 32, high the next). The
// mins enter as -d_x * dmin times, in 4 int32 lanes, min_2t * sum_2t + min_2t+1 * sum_2t+1
// (sum_j: the activation sub-block's sum), their own fma accumulator, added last as
// (lanes 0 + 2) + (lanes 1 + 3). res[i] = w . x[i].
template <int RX>
__attribute__((always_inline)) inline void q4_k_rows(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  __m256 acc[RX];
  __m128 acc_m[RX];
  for (int i = 0; i < RX; ++i) acc[i] = _mm256_setzero_ps(), acc_m[i] = _mm_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 144) {
    prefetch_ahead(w, 3);
    const float dw = half_at(w), dmw = half_at(w + 2);
    const __m256i scales_mins = k4_scales_mins(w + 4);
    const __m256i scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
    const __m128i mins = _mm256_extracti128_si256(scales_mins, 1);
    __m256i v[8], s[8];  // sub-block j's values (0..15) and its scale in every 16-bit lane
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * j));
      v[2 * j] = _mm256_and_si256(q, low);
      v[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
    for (int j = 0; j < 8; ++j) s[j] = broadcast16(scales, j);
    for (int i = 0; i < RX; ++i) {
      const int8_t* xq = x[i].q + sb * 256;
      __m256i sumi = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        const __m256i lo = _mm256_madd_epi16(s[2 * j], _mm256_maddubs_epi16(v[2 * j], load32(xq + 64 * j)));
        const __m256i hi = _mm256_madd_epi16(s[2 * j + 1], _mm256_maddubs_epi16(v[2 * j + 1], load32(xq + 64 * j + 32)));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(lo, hi));
      }
      const float xd = x[i].d[sb * 8];
      const float d = xd * dw, dmin = -xd * dmw;
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].sum16 + sb * 16));
      const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(sums16), _mm256_extracti128_si256(sums16, 1));
      acc_m[i] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, sums32)), acc_m[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[i]);
    }
  }
  for (int i = 0; i < RX; ++i) {
    __m128 m = _mm_add_ps(acc_m[i], _mm_movehl_ps(acc_m[i], acc_m[i]));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    res[i] = hsum256(acc[i]) + _mm_cvtss_f32(m);
  }
}

// Q5_K: d, dmin (f16), the 12 bytes of scales and mins as Q4_K, 32 bytes of fifth bits (bit
// j of byte i: element i of sub-block j), 128 bytes of nibbles as Q4_K. Values 0..31. The
// mins: the 4 lanes of min * activation sum added up in integers, then one scalar fma per
// super-block by -d_x * dmin into a running sum, added to the lanes' total last.
template <int RX>
__attribute__((always_inline)) inline void q5_k_rows(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  __m256 acc[RX];
  float summs[RX];
  for (int i = 0; i < RX; ++i) acc[i] = _mm256_setzero_ps(), summs[i] = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 176) {
    prefetch_ahead(w, 3);
    const float dw = half_at(w), dmw = half_at(w + 2);
    const __m256i scales_mins = k4_scales_mins(w + 4);
    const __m256i scales = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
    const __m128i mins = _mm256_extracti128_si256(scales_mins, 1);
    const __m256i hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
    __m256i v[8], s[8];  // sub-block j's values (0..31) and its scale in every 16-bit lane
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 48 + 32 * j));
      const __m256i fifth0 = _mm256_and_si256(hbits, _mm256_set1_epi8(char(1 << (2 * j))));
      const __m256i fifth1 = _mm256_and_si256(hbits, _mm256_set1_epi8(char(2 << (2 * j))));
      v[2 * j] = _mm256_add_epi8(_mm256_and_si256(q, low), _mm256_slli_epi16(_mm256_srli_epi16(fifth0, 2 * j), 4));
      v[2 * j + 1] = _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                                     _mm256_slli_epi16(_mm256_srli_epi16(fifth1, 2 * j + 1), 4));
    }
    for (int j = 0; j < 8; ++j) s[j] = broadcast16(scales, j);
    for (int i = 0; i < RX; ++i) {
      const int8_t* xq = x[i].q + sb * 256;
      __m256i sumi = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        const __m256i lo = _mm256_madd_epi16(s[2 * j], _mm256_maddubs_epi16(v[2 * j], load32(xq + 64 * j)));
        const __m256i hi = _mm256_madd_epi16(s[2 * j + 1], _mm256_maddubs_epi16(v[2 * j + 1], load32(xq + 64 * j + 32)));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(lo, hi));
      }
      const float xd = x[i].d[sb * 8];
      const float d = xd * dw, dmin = -xd * dmw;
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].sum16 + sb * 16));
      const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(sums16), _mm256_extracti128_si256(sums16, 1));
      const __m128i prod = _mm_madd_epi16(mins, sums32);
      const __m128i total = _mm_hadd_epi32(_mm_hadd_epi32(prod, _mm_setzero_si128()), _mm_setzero_si128());
      summs[i] = std::fma(dmin, float(_mm_cvtsi128_si32(total)), summs[i]);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[i]);
    }
  }
  for (int i = 0; i < RX; ++i) res[i] = hsum256(acc[i]) + summs[i];
}

// Q2_K: 16 bytes of scales (low nibble) and mins (high nibble) per 16 values, 64 bytes of
// 2-bit values (byte 32j + i, bits 2r: element 128j + 32r + i), d and dmin (f16). As
// llama.cpp: each super-block first adds -d_x * dmin times the 8 lanes of min * activation
// sum (pairs of 16), then d_x * d_w times the integer sums, both into the one accumulator.
template <int RX>
__attribute__((always_inline)) inline void q2_k_rows(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  __m256 acc[RX];
  for (int i = 0; i < RX; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 84) {
    prefetch_ahead(w, 2);
    const float dw = half_at(w + 80), dmw = half_at(w + 82);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m128i sc8 = _mm_and_si128(packed, _mm_set1_epi8(0x0f));
    const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f)));
    __m256i v[8], s[8];  // run 4j + r: its values (0..3), its two 16-value scales
    for (int j = 0; j < 2; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * j));
      for (int r = 0; r < 4; ++r) {
        const int run = 4 * j + r;
        v[run] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * r), three);
        const char is = char(2 * run), is1 = char(2 * run + 1);
        s[run] = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc8, _mm_setr_epi8(is, is, is, is, is, is, is, is, is1, is1, is1, is1, is1, is1, is1, is1)));
      }
    }
    for (int i = 0; i < RX; ++i) {
      const int8_t* xq = x[i].q + sb * 256;
      const float xd = x[i].d[sb * 8];
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].sum16 + sb * 16));
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(-xd * dmw), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, sums16)), acc[i]);
      __m256i sumi = _mm256_setzero_si256();
      for (int j = 0; j < 2; ++j) {
        __m256i p[4];
        for (int r = 0; r < 4; ++r)
          p[r] = _mm256_madd_epi16(s[4 * j + r], _mm256_maddubs_epi16(v[4 * j + r], load32(xq + 32 * (4 * j + r))));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])));
      }
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(xd * dw), _mm256_cvtepi32_ps(sumi), acc[i]);
    }
  }
  for (int i = 0; i < RX; ++i) res[i] = hsum256(acc[i]);
}

// Q3_K: hmask[32] (bit 4j + r of byte i: element 128j + 32r + i keeps its value; clear:
// minus 4), 64 bytes of 2-bit values (byte 32j + i, bits 2r), 12 bytes of 16 six-bit scales
// (minus 32), d (f16). As llama.cpp: the 2-bit part and the 4s (unsigned, maddubs each)
// subtracted in 16 bits, then madd with the run's two 16-value scales.
template <int RX>
__attribute__((always_inline)) inline void q3_k_rows(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  __m256 acc[RX];
  for (int i = 0; i < RX; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 110) {
    prefetch_ahead(w, 2);
    const float dw = half_at(w + 108);
    // Scales 0..15: low nibbles of packed bytes 0..7 (scales 0..7), their high nibbles
    // (8..15), the top two bits from bytes 8..11 (2 bits a scale, four per byte).
    uint32_t a[3], u[4];
    std::memcpy(a, w + 96, 12);
    u[0] = (a[0] & 0x0f0f0f0f) | ((a[2] & 0x03030303) << 4);
    u[1] = (a[1] & 0x0f0f0f0f) | (((a[2] >> 2) & 0x03030303) << 4);
    u[2] = ((a[0] >> 4) & 0x0f0f0f0f) | (((a[2] >> 4) & 0x03030303) << 4);
    u[3] = ((a[1] >> 4) & 0x0f0f0f0f) | (((a[2] >> 6) & 0x03030303) << 4);
    const __m128i sc8 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)), _mm_set1_epi8(32));
    const __m256i hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    __m256i lo[8], fours[8], s[8];  // run 4j + r: its 2-bit values, its 4s (hmask bit clear), scales
    for (int j = 0; j < 2; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 + 32 * j));
      for (int r = 0; r < 4; ++r) {
        const int bit = 4 * j + r;
        lo[bit] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * r), three);
        const __m256i clear = _mm256_andnot_si256(hbits, _mm256_set1_epi8(char(1 << bit)));
        fours[bit] = _mm256_slli_epi16(_mm256_srli_epi16(clear, bit), 2);
        const char is = char(2 * bit), is1 = char(2 * bit + 1);
        s[bit] = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc8, _mm_setr_epi8(is, is, is, is, is, is, is, is, is1, is1, is1, is1, is1, is1, is1, is1)));
      }
    }
    for (int i = 0; i < RX; ++i) {
      const int8_t* xq = x[i].q + sb * 256;
      __m256i sumi = _mm256_setzero_si256();
      for (int j = 0; j < 2; ++j) {
        __m256i p[4];
        for (int r = 0; r < 4; ++r) {
          const int run = 4 * j + r;
          const __m256i xr = load32(xq + 32 * run);
          p[r] = _mm256_madd_epi16(
              s[run], _mm256_sub_epi16(_mm256_maddubs_epi16(lo[run], xr), _mm256_maddubs_epi16(fours[run], xr)));
        }
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])));
      }
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d[sb * 8] * dw), _mm256_cvtepi32_ps(sumi), acc[i]);
    }
  }
  for (int i = 0; i < RX; ++i) res[i] = hsum256(acc[i]);
}

// Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per 16 values),
// d (f16). Values 0..63 stand for value - 32: the 32s come off in integers, as 32 times each
// 16-value scale times its activation sum (8 lanes: sub-block k's two scales and sums). NOTE:
// llama.cpp's AVX2 form subtracts the 32s inside each lane (maddubs of 32 and the activations),
// so its lanes hold other integers with the same total: after the per-lane fma the result may
// differ from llama.cpp's in the last bits (the other K types match it exactly).
template <int RX>
__attribute__((always_inline)) inline void q6_k_rows(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  __m256 acc[RX];
  for (int i = 0; i < RX; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 210) {
    prefetch_ahead(w, 4);
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc);
    const float dw = half_at(w + 208);
    // Run r of half h (elements 128h + 32r .. + 31): values 0..63, and its two scales
    // (values 0..15 and 16..31) each in eight 16-bit lanes.
    __m256i v[8], s[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i A = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
      const __m256i B = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
      const __m256i H = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
      v[4 * h] = _mm256_or_si256(_mm256_and_si256(A, low), _mm256_slli_epi16(_mm256_and_si256(H, two), 4));
      v[4 * h + 1] =
          _mm256_or_si256(_mm256_and_si256(B, low), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), two), 4));
      v[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), low),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), two), 4));
      v[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), low),
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), two), 4));
      for (int r = 0; r < 4; ++r) {
        const char is = char(8 * h + 2 * r), is1 = char(is + 1);
        s[4 * h + r] = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc, _mm_setr_epi8(is, is, is, is, is, is, is, is, is1, is1, is1, is1, is1, is1, is1, is1)));
      }
    }
    for (int i = 0; i < RX; ++i) {
      const int8_t* xq = x[i].q + sb * 256;
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].sum16 + sb * 16));
      const __m256i thirty_twos = _mm256_slli_epi32(_mm256_madd_epi16(sums16, sc16), 5);
      __m256i sumi = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        __m256i p[4];
        for (int r = 0; r < 4; ++r)
          p[r] = _mm256_madd_epi16(s[4 * h + r], _mm256_maddubs_epi16(v[4 * h + r], load32(xq + 128 * h + 32 * r)));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
      }
      sumi = _mm256_sub_epi32(sumi, thirty_twos);
      acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d[sb * 8] * dw), _mm256_cvtepi32_ps(sumi), acc[i]);
    }
  }
  for (int i = 0; i < RX; ++i) res[i] = hsum256(acc[i]);
}

// Each compiled twice: for AVX2 (16 registers) and, where the kernel variant is avx512, with
// AVX-512VL's 32 registers (the unpacked values and scales of a super-block then stay in
// registers across the activation rows). The same instructions on the same lanes: the same
// bits.
template <int RX>
void q4_k_avx2(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  q4_k_rows<RX>(w, x, K, res);
}
template <int RX>
void q2_k_avx2(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  q2_k_rows<RX>(w, x, K, res);
}
template <int RX>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void q2_k_evex(const uint8_t* w, const Q8Row* x, int64_t K,
                                                                     float* res) {
  q2_k_rows<RX>(w, x, K, res);
}
template <int RX>
void q3_k_avx2(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  q3_k_rows<RX>(w, x, K, res);
}
template <int RX>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void q3_k_evex(const uint8_t* w, const Q8Row* x, int64_t K,
                                                                     float* res) {
  q3_k_rows<RX>(w, x, K, res);
}
template <int RX>
void q5_k_avx2(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  q5_k_rows<RX>(w, x, K, res);
}
template <int RX>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void q5_k_evex(const uint8_t* w, const Q8Row* x, int64_t K,
                                                                     float* res) {
  q5_k_rows<RX>(w, x, K, res);
}
template <int RX>
void q6_k_avx2(const uint8_t* w, const Q8Row* x, int64_t K, float* res) {
  q6_k_rows<RX>(w, x, K, res);
}
template <int RX>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void q4_k_evex(const uint8_t* w, const Q8Row* x, int64_t K,
                                                                     float* res) {
  q4_k_rows<RX>(w, x, K, res);
}
template <int RX>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void q6_k_evex(const uint8_t* w, const Q8Row* x, int64_t K,
                                                                     float* res) {
  q6_k_rows<RX>(w, x, K, res);
}

using Rows = void (*)(const uint8_t*, const Q8Row*, int64_t, float*);
constexpr int kTileRows = 4;  // activation rows a tile takes

Rows rows_fn(DType t, int rx) {
  static constexpr Rows q4[2][kTileRows] = {{q4_k_avx2<1>, q4_k_avx2<2>, q4_k_avx2<3>, q4_k_avx2<4>},
                                            {q4_k_evex<1>, q4_k_evex<2>, q4_k_evex<3>, q4_k_evex<4>}};
  static constexpr Rows q6[2][kTileRows] = {{q6_k_avx2<1>, q6_k_avx2<2>, q6_k_avx2<3>, q6_k_avx2<4>},
                                            {q6_k_evex<1>, q6_k_evex<2>, q6_k_evex<3>, q6_k_evex<4>}};
  static constexpr Rows q5[2][kTileRows] = {{q5_k_avx2<1>, q5_k_avx2<2>, q5_k_avx2<3>, q5_k_avx2<4>},
                                            {q5_k_evex<1>, q5_k_evex<2>, q5_k_evex<3>, q5_k_evex<4>}};
  static constexpr Rows q3[2][kTileRows] = {{q3_k_avx2<1>, q3_k_avx2<2>, q3_k_avx2<3>, q3_k_avx2<4>},
                                            {q3_k_evex<1>, q3_k_evex<2>, q3_k_evex<3>, q3_k_evex<4>}};
  static constexpr Rows q2[2][kTileRows] = {{q2_k_avx2<1>, q2_k_avx2<2>, q2_k_avx2<3>, q2_k_avx2<4>},
                                            {q2_k_evex<1>, q2_k_evex<2>, q2_k_evex<3>, q2_k_evex<4>}};
  const auto& table = t == DType::Q2_K ? q2 : t == DType::Q3_K ? q3 : t == DType::Q4_K ? q4 : t == DType::Q5_K ? q5 : q6;
  return table[avx512_forms() ? 1 : 0][rx - 1];
}

}  // namespace

bool kquant_supports(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

namespace {
std::atomic<bool> g_kquant_prompts{true};
}
// AVX-512 forms only: measured on Zen 4, Qwen3-0.6B Q4_K_M prompts 191-194 tokens/s through
// these tiles against 180-181 through SGEMM; forced to the AVX2 form (16 registers: the
// unpacked super-block spills) 150 against 176-178 (SGEMM then; gemm_weight_rows now), so
// AVX2-only CPUs take the f32 tiles.
bool kquant_for_prompts() { return g_kquant_prompts.load(std::memory_order_relaxed) && avx512_forms(); }
void kquant_use_for_prompts(bool on) { g_kquant_prompts.store(on, std::memory_order_relaxed); }

float kquant_dot(DType t, const uint8_t* w, const Q8Row& x, int64_t K) {
  float r;
  rows_fn(t, 1)(w, &x, K, &r);
  return r;
}

void kquant_products(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), K = w.size(1), out = w.size(0);
  const DType t = w.dtype();
  TOY_CHECK(kquant_supports(t) && K % 256 == 0, "[kquant products] a {} weight with rows of {}", name(t), K);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const auto* wp = static_cast<const uint8_t*>(w.raw_data());
  const size_t rb = row_bytes(t, K);
  // The activations rounded once (scales, values, sums of 16 per row) in one scratch buffer.
  const int64_t row_floats = K / 32 + K / 4 + K / 32;
  float* buf = scratch_floats(size_t(N * row_floats), 6);
  // The calling thread's, reused (a warm decoder allocates nothing); the workers get the
  // pointer (a thread_local named in the lambda would be each worker's own).
  thread_local std::vector<Q8Row> row_list;
  row_list.resize(size_t(N));
  Q8Row* rows = row_list.data();
  for (int64_t n = 0; n < N; ++n) {
    float* d = buf + n * row_floats;
    rows[n] = {d, reinterpret_cast<const int8_t*>(d + K / 32), reinterpret_cast<const int16_t*>(d + K / 32 + K / 4)};
  }
  parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* d = buf + n * row_floats;
      quantize_activations(t, xp + n * K, K, d, reinterpret_cast<int8_t*>(d + K / 32),
                           reinterpret_cast<int16_t*>(d + K / 32 + K / 4));
    }
  });
  // Activation groups outside, weight rows inside: a group's rows stay in L1 while the task's
  // weight rows pass by.
  for_row_blocks(out, N <= kGemvMaxRows ? 16 : 32, [&](int64_t r0, int64_t r1) {
    float res[kTileRows];
    for (int64_t n0 = 0; n0 < N; n0 += kTileRows) {
      const int rx = int(std::min<int64_t>(kTileRows, N - n0));
      const Rows f = rows_fn(t, rx);
      for (int64_t r = r0; r < r1; ++r) {
        f(wp + size_t(r) * rb, rows + n0, K, res);
        for (int i = 0; i < rx; ++i) {
          float& o = yp[(n0 + i) * out + r];
          o = accumulate ? o + res[i] : res[i];
        }
      }
    }
  });
}

}  // namespace toy::cpu
