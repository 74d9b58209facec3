// Products of a few activation rows with a weight kept in its stored dtype, straight from
// the blocks: the decode-time path, which is bound by reading the weights, so each weight
// row is read once and dotted with every activation row while it is in L1.
//   - Block types (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K): the activations are first quantized to
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
#include "toy/backend/cpu/scratch.h"
#include "toy/core/cpu_features.h"
#include "toy/core/error.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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

// Q8_0 (llama.cpp's quantize_row_q8_0): per 32 values, q = round(x * 127 / amax); the scale
// amax / 127 is stored as f16, so the products use the f16-rounded value.
void quantize_q8_0(const float* x, int64_t K, float* d, int8_t* q, int16_t* sum16) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
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
    d[b] = std::isfinite(scale) ? round_to_f16(scale) : scale;
    round_block32(xb, _mm256_set1_ps(scale != 0.0f && std::isfinite(scale) ? 127.0f / am : 0.0f), q + b * 32);
  }
  sums_of_16(q, K, sum16);
}

}  // namespace

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

// The weights a row will need 1 KB from now: the hardware prefetcher alone leaves the loads
// of a memory-bound product waiting (measured ~7% faster decoding with it).
inline void prefetch_ahead(const uint8_t* w, int lines = 1) {
  for (int i = 0; i < lines; ++i) _mm_prefetch(reinterpret_cast<const char*>(w) + 1024 + 64 * i, _MM_HINT_T0);
}

// Sum of the 32 products of signed bytes w and x, as 8 int32 lanes (w may be -128..127).
inline __m256i dot_i8(__m256i w, __m256i x) {
  const __m256i ax = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sx), _mm256_set1_epi16(1));
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// 32 bits -> 32 bytes, byte j = 0xff where bit j is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                          0x0303030303030303);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), shuf);
  const __m256i bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // all bits but bit j of each byte
  v = _mm256_or_si256(v, bit);
  return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

float dot_q8_0(const uint8_t* w, const Q8Row& x, int64_t K) {
  // Two accumulators: the blocks' products are independent, the additions need not queue.
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int64_t nb = K / 32;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 68) {
    prefetch_ahead(w);
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 36));
    const __m256 s0 = _mm256_cvtepi32_ps(dot_i8(w0, load32(x.q + 32 * b)));
    const __m256 s1 = _mm256_cvtepi32_ps(dot_i8(w1, load32(x.q + 32 * b + 32)));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w) * x.d[b]), s0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w + 34) * x.d[b + 1]), s1, acc1);
  }
  if (b < nb) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w) * x.d[b]), _mm256_cvtepi32_ps(dot_i8(w0, load32(x.q + 32 * b))),
                           acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// Several activation rows against Q8_0 weights (sequences decoding together) read each row
// from one packed array: per block of 32, the 32 values, then -128 times the sum of each
// four of them (the VNNI kernels' starting sums, below), then the block's scale repeated 8
// times — 96 bytes, one pointer per row, the scale ready to multiply as a vector.
constexpr int64_t kPackedBlock = 96;

void pack_q8_0_rows(const Q8Row& x, int64_t K, uint8_t* out) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < K / 32; ++b, out += kPackedBlock) {
    const __m256i q = load32(x.q + 32 * b);
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32),
                        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sums, 7)));
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 64), _mm256_set1_ps(x.d[b]));
  }
}

inline __m256i packed_q(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m256i packed_start(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)); }
inline __m256 packed_scale(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 64)); }

// R packed activation rows against one Q8_0 weight row: each weight block is loaded and
// prepared (PREP) once for all R rows (dot_q8_0 does that per row), while every (row,
// activation) product keeps dot_q8_0's exact arithmetic and order (the integer sums of each
// four products, the scale product d_w * d_x, even blocks in one accumulator, odd in the
// other): a batch of sequences gets the bits one sequence alone gets. BLOCK_DOT(start, w, x)
// gives the 8 lanes of integer sums. Stamped three times:
// - AVX2: the weights as stored, dot_i8 (sign, multiply-add, widen; the start sums unused);
// - VNNI's u8 x s8 dot (vpdpbusd), where the CPU has it: the weight bytes offset by 128 to
//   unsigned (w ^ 0x80 = w + 128), so each lane gets sum (w + 128) x = sum w x + 128 sum x,
//   starting from the packed -128 sum x — the same exact integer sums in one instruction
//   instead of three, so the same bits. The VEX form (AVX-VNNI: Intel since Alder Lake, AMD
//   since Zen 5) and the EVEX form (AVX512-VNNI with VL: Intel's AVX-512 server parts, Zen 4).
#define TOY_DOT_ROWS_Q8_0(NAME, ATTRIBUTES, PREP, BLOCK_DOT)                                                      \
  template <int R>                                                                                                \
  ATTRIBUTES void NAME(const uint8_t* w, const uint8_t* const* x, int64_t K, float* out) {                        \
    __m256 acc0[R], acc1[R];                                                                                      \
    for (int n = 0; n < R; ++n) acc0[n] = _mm256_setzero_ps(), acc1[n] = _mm256_setzero_ps();                    \
    const int64_t nb = K / 32;                                                                                    \
    int64_t b = 0;                                                                                                \
    for (; b + 2 <= nb; b += 2, w += 68) {                                                                        \
      prefetch_ahead(w);                                                                                          \
      const __m256i u0 = PREP(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2)));                      \
      const __m256i u1 = PREP(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 36)));                     \
      const __m256 d0 = _mm256_set1_ps(half_at(w)), d1 = _mm256_set1_ps(half_at(w + 34));                         \
      for (int n = 0; n < R; ++n) {                                                                               \
        const uint8_t* p = x[n] + kPackedBlock * b;                                                               \
        const __m256i p0 = BLOCK_DOT(packed_start(p), u0, packed_q(p));                                           \
        const __m256i p1 = BLOCK_DOT(packed_start(p + kPackedBlock), u1, packed_q(p + kPackedBlock));             \
        acc0[n] = _mm256_fmadd_ps(_mm256_mul_ps(d0, packed_scale(p)), _mm256_cvtepi32_ps(p0), acc0[n]);           \
        acc1[n] = _mm256_fmadd_ps(_mm256_mul_ps(d1, packed_scale(p + kPackedBlock)), _mm256_cvtepi32_ps(p1),      \
                                  acc1[n]);                                                                       \
      }                                                                                                           \
    }                                                                                                             \
    if (b < nb) {                                                                                                 \
      const __m256i u0 = PREP(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2)));                      \
      const __m256 d0 = _mm256_set1_ps(half_at(w));                                                               \
      for (int n = 0; n < R; ++n) {                                                                               \
        const uint8_t* p = x[n] + kPackedBlock * b;                                                               \
        const __m256i p0 = BLOCK_DOT(packed_start(p), u0, packed_q(p));                                           \
        acc0[n] = _mm256_fmadd_ps(_mm256_mul_ps(d0, packed_scale(p)), _mm256_cvtepi32_ps(p0), acc0[n]);           \
      }                                                                                                           \
    }                                                                                                             \
    for (int n = 0; n < R; ++n) out[n] = hsum(_mm256_add_ps(acc0[n], acc1[n]));                                   \
  }

inline __m256i as_stored(__m256i w) { return w; }
inline __m256i offset_to_unsigned(__m256i w) { return _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))); }
inline __m256i avx2_block_dot(__m256i, __m256i w, __m256i x) { return dot_i8(w, x); }
__attribute__((target("avxvnni"))) inline __m256i vex_block_dot(__m256i start, __m256i u, __m256i x) {
  return _mm256_dpbusd_avx_epi32(start, u, x);
}
__attribute__((target("avx512vnni,avx512vl"))) inline __m256i evex_block_dot(__m256i start, __m256i u, __m256i x) {
  return _mm256_dpbusd_epi32(start, u, x);
}

TOY_DOT_ROWS_Q8_0(dot_rows_q8_0_avx2, , as_stored, avx2_block_dot)
TOY_DOT_ROWS_Q8_0(dot_rows_q8_0_avxvnni, __attribute__((target("avxvnni"))), offset_to_unsigned, vex_block_dot)
TOY_DOT_ROWS_Q8_0(dot_rows_q8_0_avx512vnni, __attribute__((target("avx512vnni,avx512vl"))), offset_to_unsigned,
                  evex_block_dot)
#undef TOY_DOT_ROWS_Q8_0

enum class Vnni { None, Vex, Evex };

Vnni detect_vnni() {
  if (cpu_has_avx_vnni()) return Vnni::Vex;
  if (cpu_has_avx512_vnni_vl()) return Vnni::Evex;
  return Vnni::None;
}

const Vnni g_vnni_found = detect_vnni();
std::atomic<bool> g_vnni_on{true};

Vnni vnni_in_use() { return g_vnni_on.load(std::memory_order_relaxed) ? g_vnni_found : Vnni::None; }

template <int R>
void dot_rows_q8_0(Vnni v, const uint8_t* w, const uint8_t* const* x, int64_t K, float* out) {
  if (v == Vnni::Vex)
    dot_rows_q8_0_avxvnni<R>(w, x, K, out);
  else if (v == Vnni::Evex)
    dot_rows_q8_0_avx512vnni<R>(w, x, K, out);
  else
    dot_rows_q8_0_avx2<R>(w, x, K, out);
}

float dot_q4_0(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < K / 32; ++b, w += 18) {
    if ((b & 3) == 0) prefetch_ahead(w, 2);
    const __m256i wq = _mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8));
    const __m256 s = _mm256_cvtepi32_ps(dot_i8(wq, load32(x.q + 32 * b)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w) * x.d[b]), s, acc);
  }
  return hsum(acc);
}

float dot_q5_0(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < K / 32; ++b, w += 22) {
    if ((b & 1) == 0) prefetch_ahead(w);
    uint32_t qh;
    std::memcpy(&qh, w + 2, 4);
    // (nibble | fifth bit << 4) - 16 = nibble - (fifth bit clear ? 16 : 0)
    const __m256i clear = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    const __m256i wq = _mm256_sub_epi8(unpack_nibbles(w + 6), clear);
    const __m256 s = _mm256_cvtepi32_ps(dot_i8(wq, load32(x.q + 32 * b)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half_at(w) * x.d[b]), s, acc);
  }
  return hsum(acc);
}

inline void k4_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

float dot_q4_k(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 144) {
    prefetch_ahead(w, 3);
    const float d = half_at(w), dmin = half_at(w + 2);
    const uint8_t* scales = w + 4;
    const uint8_t* qs = w + 16;
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;  // sub-block of 32
        const int64_t xb = sb * 8 + j;
        int sc, m;
        k4_scale_min(j, scales, &sc, &m);
        const __m256i wq = h == 0 ? _mm256_and_si256(q, low) : _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, load32(x.q + 32 * xb)), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * float(sc) * x.d[xb]), _mm256_cvtepi32_ps(p), acc);
        mins += dmin * float(m) * x.d[xb] * float(int(x.sum16[2 * xb]) + int(x.sum16[2 * xb + 1]));
      }
    }
  }
  return hsum(acc) - mins;
}

float dot_q6_k(const uint8_t* w, const Q8Row& x, int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  float offset = 0;
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < K / 256; ++sb, w += 210) {
    prefetch_ahead(w, 4);
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = half_at(w + 208);
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
      for (int r = 0; r < 4; ++r) {
        const int64_t xb = sb * 8 + 4 * h + r;  // activation block of 32
        const int is = 8 * h + 2 * r;           // the two 16-value scales
        const int s0 = sc[is], s1 = sc[is + 1];
        const __m256i scales = _mm256_setr_epi16(int16_t(s0), int16_t(s0), int16_t(s0), int16_t(s0), int16_t(s0),
                                                 int16_t(s0), int16_t(s0), int16_t(s0), int16_t(s1), int16_t(s1),
                                                 int16_t(s1), int16_t(s1), int16_t(s1), int16_t(s1), int16_t(s1),
                                                 int16_t(s1));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], load32(x.q + 32 * xb)), scales);
        const float dx = d * x.d[xb];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dx), _mm256_cvtepi32_ps(p), acc);
        offset += 32.0f * dx * float(s0 * int(x.sum16[2 * xb]) + s1 * int(x.sum16[2 * xb + 1]));
      }
    }
  }
  return hsum(acc) - offset;
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
  float s = hsum(_mm256_add_ps(a0, a1));
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
  float s = hsum(_mm256_add_ps(a0, a1));
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

BlockDot block_dot(DType t) {
  switch (t) {
    case DType::Q8_0: return dot_q8_0;
    case DType::Q4_0: return dot_q4_0;
    case DType::Q5_0: return dot_q5_0;
    case DType::Q4_K: return dot_q4_k;
    case DType::Q6_K: return dot_q6_k;
    default: return nullptr;
  }
}

// Runs fn over [0, rows) in blocks of rows. Each thread owns a contiguous share (so it streams
// its weights in order, as the hardware prefetcher wants) and, when done, takes blocks left
// in the others' shares: on a shared machine one core is often slower, and a fixed split
// would make every product wait for it. Counters sit on separate cache lines, so a thread
// touches another's only when it steals. Each row is computed by one thread, the same way
// whichever, so results do not depend on the schedule.
template <class F>
void for_row_blocks(int64_t rows, F&& fn) {
  constexpr int64_t kRowBlock = 16;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t shares = std::min<int64_t>(num_threads(), blocks);
  if (shares <= 1) return fn(int64_t(0), rows);
  struct alignas(64) Share {
    std::atomic<int64_t> next;
    int64_t end;
  };
  Share share[64];
  const int64_t n_shares = std::min<int64_t>(shares, 64);
  for (int64_t t = 0; t < n_shares; ++t) {
    share[t].next.store(blocks * t / n_shares, std::memory_order_relaxed);
    share[t].end = blocks * (t + 1) / n_shares;
  }
  parallel_for(0, n_shares, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < n_shares; ++k) {
        Share& s = share[(t + k) % n_shares];
        for (int64_t b; (b = s.next.fetch_add(1, std::memory_order_relaxed)) < s.end;)
          fn(b * kRowBlock, std::min(rows, (b + 1) * kRowBlock));
      }
  });
}

}  // namespace

bool gemv_blocks_supports(DType t) { return t == DType::F16 || t == DType::BF16 || block_dot(t) != nullptr; }

void gemv_blocks(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), K = w.size(1), out = w.size(0);
  TOY_CHECK(N <= kGemvMaxRows && gemv_blocks_supports(w.dtype()), "[gemv] {} rows of a {} weight", N,
            name(w.dtype()));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const size_t rb = row_bytes(w.dtype(), K);
  const uint8_t* wp = static_cast<const uint8_t*>(w.raw_data());
  if (w.dtype() == DType::F16 || w.dtype() == DType::BF16) {
    const FloatDot dot = w.dtype() == DType::F16 ? dot_f16 : dot_bf16;
    float* xr = scratch_floats(size_t(N * K), 5);  // slot of matmul_weight: never live at once
    round_activations(w.dtype(), xp, N * K, xr);
    for_row_blocks(out, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t n = 0; n < N; ++n) {
          const float v = dot(wp + size_t(r) * rb, xr + n * K, K);
          yp[n * out + r] = accumulate ? yp[n * out + r] + v : v;
        }
    });
    return;
  }
  const BlockDot dot = block_dot(w.dtype());
  const Vnni vnni = vnni_in_use();
  // Q8_0 rows go through the packed kernels when several sequences decode together (one
  // weight load serves them all) or when VNNI makes even one row's product cheaper.
  const bool packed = w.dtype() == DType::Q8_0 && (N >= 2 || vnni != Vnni::None);
  // The activations, quantized once (K / 32 scales, K values, K / 16 sums per row; packed:
  // also 96 bytes per block), in one scratch buffer of floats.
  const int64_t row_floats = K / 32 + K / 4 + K / 32 + (packed ? K / 32 * kPackedBlock / 4 : 0);
  float* buf = scratch_floats(size_t(N * row_floats), 5);  // slot of matmul_weight: never live at once
  Q8Row rows[kGemvMaxRows];
  const uint8_t* prows[kGemvMaxRows] = {};
  for (int64_t n = 0; n < N; ++n) {
    float* base = buf + n * row_floats;
    float* d = base;
    int8_t* q = reinterpret_cast<int8_t*>(base + K / 32);
    int16_t* s16 = reinterpret_cast<int16_t*>(base + K / 32 + K / 4);
    quantize_activations(w.dtype(), xp + n * K, K, d, q, s16);
    rows[n] = {d, q, s16};
    if (packed) {
      uint8_t* pk = reinterpret_cast<uint8_t*>(base + K / 32 + K / 4 + K / 32);
      pack_q8_0_rows(rows[n], K, pk);
      prows[n] = pk;
    }
  }
  for_row_blocks(out, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = wp + size_t(r) * rb;
      float v[4];
      int64_t n = 0;
      auto put = [&](int64_t n0, int count) {
        for (int i = 0; i < count; ++i) {
          float& o = yp[(n0 + i) * out + r];
          o = accumulate ? o + v[i] : v[i];
        }
      };
      if (packed) {
        for (; n + 4 <= N; n += 4) dot_rows_q8_0<4>(vnni, wr, prows + n, K, v), put(n, 4);
        if (N - n == 3) dot_rows_q8_0<3>(vnni, wr, prows + n, K, v), put(n, 3), n += 3;
        if (N - n == 2) dot_rows_q8_0<2>(vnni, wr, prows + n, K, v), put(n, 2), n += 2;
        if (N - n == 1) dot_rows_q8_0<1>(vnni, wr, prows + n, K, v), put(n, 1), n += 1;
      }
      for (; n < N; ++n) v[0] = dot(wr, rows[n], K), put(n, 1);
    }
  });
}

bool gemv_vnni_available() { return g_vnni_found != Vnni::None; }
void gemv_use_vnni(bool on) { g_vnni_on.store(on, std::memory_order_relaxed); }

}  // namespace toy::cpu
