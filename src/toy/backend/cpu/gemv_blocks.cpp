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
#include "toy/backend/cpu/kquant_products.h"
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

using FloatDot = float (*)(const uint8_t*, const float*, int64_t);

}  // namespace

bool gemv_blocks_supports(DType t) {
  return t == DType::F16 || t == DType::BF16 || quant_products_supports(t) || kquant_supports(t);
}

void gemv_blocks(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), K = w.size(1), out = w.size(0);
  TOY_CHECK(N <= kGemvMaxRows && gemv_blocks_supports(w.dtype()), "[gemv] {} rows of a {} weight", N,
            name(w.dtype()));
  if (quant_products_supports(w.dtype())) return quant_products(x, w, y, accumulate);
  if (kquant_supports(w.dtype())) return kquant_products(x, w, y, accumulate);
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
  TOY_CHECK(false, "[gemv] no products for {} weights", name(w.dtype()));
}

// A prepared row: the 32-block types, quant_products' lone packed row; the K types, scales,
// values and sums of 16 as gemv_blocks quantizes them; F16/BF16, the rounded floats.
PreparedRows::PreparedRows(DType weight, const float* x, int64_t rows, int64_t K, std::span<const uint8_t> needed)
    : weight_(weight), K_(K) {
  TOY_CHECK(gemv_blocks_supports(weight), "[gemv] no products for {} weights", name(weight));
  if (quant_products_supports(weight))
    row_bytes_ = quant_lone_row_bytes(K);
  else if (weight == DType::F16 || weight == DType::BF16)
    row_bytes_ = size_t(K) * 4;
  else
    row_bytes_ = size_t(K / 32 + K / 4 + K / 32) * 4;
  buf_ = reinterpret_cast<uint8_t*>(scratch_floats((row_bytes_ * size_t(rows) + 3) / 4, 5));
  TOY_CHECK(needed.empty() || int64_t(needed.size()) == rows, "[gemv] {} row marks for {} rows", needed.size(), rows);
  // A prompt's experts with few pairs read a small part of its rows: only those are prepared,
  // on every thread when there are many (a decoding token's few stay on this thread: waking
  // the pool would cost more).
  const int64_t count = needed.empty() ? rows : int64_t(std::count(needed.begin(), needed.end(), uint8_t(1)));
  auto prepare_rows = [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      if (needed.empty() || needed[size_t(n)]) prepare(x + n * K, buf_ + size_t(n) * row_bytes_);
  };
  if (count >= 16)
    parallel_for(0, rows, 4, prepare_rows);
  else
    prepare_rows(0, rows);
}

void PreparedRows::prepare(const float* x, uint8_t* out) const {
  if (quant_products_supports(weight_)) {
    quant_pack_lone_row(x, K_, out);
  } else if (weight_ == DType::F16 || weight_ == DType::BF16) {
    round_activations(weight_, x, K_, reinterpret_cast<float*>(out));
  } else {
    auto* d = reinterpret_cast<float*>(out);
    quantize_activations(weight_, x, K_, d, reinterpret_cast<int8_t*>(d + K_ / 32),
                         reinterpret_cast<int16_t*>(d + K_ / 32 + K_ / 4));
  }
}

void PreparedRows::products(int64_t row, const uint8_t* w, int64_t r0, int64_t r1, float* y) const {
  const uint8_t* in = buf_ + size_t(row) * row_bytes_;
  if (quant_products_supports(weight_)) return quant_lone_row_products(weight_, in, w, K_, r0, r1, y);
  const size_t rb = row_bytes(weight_, K_);
  if (weight_ == DType::F16 || weight_ == DType::BF16) {
    const FloatDot dot = weight_ == DType::F16 ? dot_f16 : dot_bf16;
    for (int64_t r = r0; r < r1; ++r) y[r - r0] = dot(w + size_t(r) * rb, reinterpret_cast<const float*>(in), K_);
    return;
  }
  const auto* d = reinterpret_cast<const float*>(in);
  const Q8Row q{d, reinterpret_cast<const int8_t*>(d + K_ / 32), reinterpret_cast<const int16_t*>(d + K_ / 32 + K_ / 4)};
  for (int64_t r = r0; r < r1; ++r) y[r - r0] = kquant_dot(weight_, w + size_t(r) * rb, q, K_);
}

extern std::atomic<bool> g_quant_vnni_on;  // quant_products.cpp
bool gemv_vnni_available() { return quant_dot() != QuantDot::Avx2; }
void gemv_use_vnni(bool on) { g_quant_vnni_on.store(on, std::memory_order_relaxed); }

}  // namespace toy::cpu
