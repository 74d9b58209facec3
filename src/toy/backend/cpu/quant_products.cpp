// Products with Q8_0 / Q4_0 / Q5_0 weights as integer dot products, for one activation row
// (decoding) or many (prompts), without widening a weight to floats.
//
// The activations are first rounded as llama.cpp rounds them for these weights (Q8_0 blocks:
// per 32 values, scale amax / 127 rounded to f16, values round(x / scale); gemv_blocks.h).
// Then, for every (weight row, activation row) pair, in block order, with one 8-lane float
// accumulator:
//     acc = fma(d_w * d_x, float(isum), acc)
// where isum holds, in lane j, the exact integer sum of the products of values 4j..4j+3 of
// the block; the result is the sum of acc's lanes in hsum256's order. This is the order
// llama.cpp's AVX2 dot product uses (one accumulator). Every form below does exactly these
// operations on each pair, lane for lane, so a product's bits do not depend on the form
// (AVX2, AVX-VNNI, AVX512-VNNI), on the tile it ran in, or on how many rows ran together:
// a prompt's rows get the numbers each would get decoding alone.
//
// Forms (core/cpu_features.h's quant_dot):
//   - AVX2: the weights as signed bytes, isum = madd(maddubs(|w|, sign(x, w)), 1).
//   - VNNI (AVX-VNNI's VEX form, or AVX512-VNNI's EVEX form on 256 bits for a single row):
//     the weight bytes offset to unsigned (w ^ 0x80 = w + 128), so vpdpbusd gives
//     sum (w + 128) x = sum w x + 128 sum x per lane, started from the packed -128 sum x:
//     the same exact sums in one instruction.
//   - AVX512-VNNI on 512 bits: two activation rows in one register (lanes 0-7 the first,
//     8-15 the second) against a weight block broadcast to both halves.
// Tiles: RW weight rows x RX activation rows (RX / 2 pairs on 512 bits), all of K; each weight
// block is decoded once per tile, each activation block loaded once per tile.
// Threads split the weight rows (row_blocks.h); each output is computed by one thread.
#include "toy/backend/cpu/quant_products.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/row_blocks.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/cpu_features.h"
#include "toy/core/error.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

// GCC 12 warns inside its own AVX-512 headers (intrinsics that start from a deliberately
// undefined register, e.g. the broadcast and the 256-bit extract): not this file's values.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace toy::cpu {

// The test hook of gemv_blocks.h: VNNI off runs the AVX2 form.
std::atomic<bool> g_quant_vnni_on{true};

namespace {

// ---- weight blocks: the 32 signed values of a block (the scale is the f16 at its start) ----

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

// values(): the block's 32 signed values. unsigned_values(): the same plus 128 (the VNNI
// forms' operand, w ^ 0x80), made directly where AVX-512 has a cheaper way: the sums that
// come out are the same exact integers, so the bits do not change.
#define TOY_EVEX256 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
struct Q8_0Block {
  static constexpr int64_t kBytes = 34;
  static __m256i values(const uint8_t* b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)); }
  TOY_EVEX256 static __m256i unsigned_values(const uint8_t* b) {
    return _mm256_xor_si256(values(b), _mm256_set1_epi8(char(0x80)));
  }
};
struct Q4_0Block {
  static constexpr int64_t kBytes = 18;
  static __m256i values(const uint8_t* b) { return _mm256_sub_epi8(unpack_nibbles(b + 2), _mm256_set1_epi8(8)); }
  // nibble - 8 + 128
  TOY_EVEX256 static __m256i unsigned_values(const uint8_t* b) {
    return _mm256_add_epi8(unpack_nibbles(b + 2), _mm256_set1_epi8(120));
  }
};
struct Q5_0Block {
  static constexpr int64_t kBytes = 22;
  static __m256i values(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    // (nibble | fifth bit << 4) - 16 = nibble - (fifth bit clear ? 16 : 0)
    const __m256i clear = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(16));
    return _mm256_sub_epi8(unpack_nibbles(b + 6), clear);
  }
  // (nibble | fifth bit << 4) - 16 + 128 = nibble + 112, plus 16 where the fifth bit is set
  // (the 32 bits are a byte mask as they stand).
  TOY_EVEX256 static __m256i unsigned_values(const uint8_t* b) {
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i base = _mm256_add_epi8(unpack_nibbles(b + 6), _mm256_set1_epi8(112));
    return _mm256_mask_add_epi8(base, __mmask32(qh), base, _mm256_set1_epi8(16));
  }
};

// Prefetches the weight line `ahead` bytes on (decoding is bound by reading the weights),
// once per two blocks. A tile reads its RW rows side by side, so the line the next tile will
// read at this point is RW rows on: 1 KB ahead of a row alone would fall inside the tile.
inline void prefetch_line(const uint8_t* wb, size_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(wb) + ahead, _MM_HINT_T0);
}
inline size_t prefetch_distance(int rw, size_t rb) { return std::max<size_t>(size_t(rw) * rb, 1024); }

// ---- activations: rounded to Q8_0 blocks and packed in pairs of rows ----
// Per pair and block of 32, 192 bytes:
//   [0, 64)     the values of the pair's first row (32 int8), then its second's
//   [64, 128)   -128 x the sum of each four values (8 int32), first row then second (VNNI's
//               starting sums)
//   [128, 192)  each row's block scale repeated 8 times (float), first then second
// A pair's blocks are contiguous; an odd last row is paired with a row of zeros. A lone row
// (decoding one sequence) is packed alone, 96 bytes a block (values, sums, scales): half the
// footprint, so a long row (K = 6912: 21 KB) stays in L1 while the weights stream past.
constexpr int64_t kPairBlock = 192;
constexpr int64_t kLoneBlock = 96;

// One row's block of 32 activations (null: zeros) rounded into a packed block of stride xs:
// values at 0, starting sums at xs / 3, the scale repeated at 2 xs / 3.
void pack_block(const float* x, int64_t xs, uint8_t* out) {
  auto* q = reinterpret_cast<int8_t*>(out);
  float d = 0.0f;
  if (x)
    d = quantize_block_q8_0(x, q);
  else
    std::memset(q, 0, 32);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + xs / 3),
                      _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sums, 7)));
  _mm256_storeu_ps(reinterpret_cast<float*>(out + 2 * xs / 3), _mm256_set1_ps(d));
}

// Rows x0 and x1 (x1 null: zeros) of K values into a pair's nb = K / 32 packed blocks; with
// lone set, x0 alone into kLoneBlock blocks. Rounded straight into place.
void pack_pair(const float* x0, const float* x1, int64_t K, bool lone, uint8_t* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    if (lone) {
      pack_block(x0 + 32 * b, kLoneBlock, out + b * kLoneBlock);
      continue;
    }
    pack_block(x0 + 32 * b, kPairBlock, out + b * kPairBlock);
    pack_block(x1 ? x1 + 32 * b : nullptr, kPairBlock, out + b * kPairBlock + 32);
  }
}

// ---- tiles ----
// RW weight rows (w, row stride rb) x RX activation rows (x[j]: the row's first packed block:
// its pair's block 0, plus 32 for a pair's second row; xs the packed block stride: its values,
// starting sums and scales at 0, xs / 3 and 2 xs / 3); res[r * RX + j].
#define TOY_QUANT_TILE_256(NAME, ATTRIBUTES, DECODE, BLOCK_DOT)                                                   \
  template <class B, int RW, int RX>                                                                            \
  ATTRIBUTES void NAME(const uint8_t* w, size_t rb, const uint8_t* const* x, int64_t xs, int64_t nb, float* res) { \
    __m256 acc[RW][RX];                                                                                         \
    for (int r = 0; r < RW; ++r)                                                                                \
      for (int j = 0; j < RX; ++j) acc[r][j] = _mm256_setzero_ps();                                             \
    const size_t ahead = prefetch_distance(RW, rb);                                                             \
    int64_t b = 0;                                                                                              \
    /* two blocks an iteration, prefetching once (the loop of a memory-bound row) */                            \
    for (; b + 2 <= nb; b += 2) {                                                                               \
      for (int r = 0; r < RW; ++r) prefetch_line(w + r * rb + b * B::kBytes, ahead);                            \
      TOY_QUANT_BLOCK_256(b, DECODE, BLOCK_DOT)                                                                 \
      TOY_QUANT_BLOCK_256(b + 1, DECODE, BLOCK_DOT)                                                             \
    }                                                                                                           \
    if (b < nb) {                                                                                               \
      TOY_QUANT_BLOCK_256(b, DECODE, BLOCK_DOT)                                                                 \
    }                                                                                                           \
    for (int r = 0; r < RW; ++r)                                                                                \
      for (int j = 0; j < RX; ++j) res[r * RX + j] = hsum256(acc[r][j]);                                        \
  }

// One block (index BI) of a 256-bit tile: every weight row's block decoded once, every
// activation row's loaded once, one fma per (weight row, activation row).
#define TOY_QUANT_BLOCK_256(BI, DECODE, BLOCK_DOT)                                                                \
  {                                                                                                             \
    const int64_t bi = (BI);                                                                                    \
    __m256i u[RW];                                                                                              \
    __m256 dw[RW];                                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < RW; ++r) {                                                      \
      const uint8_t* wb = w + r * rb + bi * B::kBytes;                                                          \
      u[r] = DECODE(wb);                                                                                        \
      dw[r] = _mm256_set1_ps(half_at(wb));                                                                      \
    }                                                                                                           \
    _Pragma("GCC unroll 8") for (int j = 0; j < RX; ++j) {                                                      \
      const uint8_t* xb = x[j] + bi * xs;                                                                       \
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));                               \
      const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + xs / 3));                  \
      const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float*>(xb + 2 * xs / 3));                       \
      _Pragma("GCC unroll 8") for (int r = 0; r < RW; ++r) acc[r][j] =                                          \
          _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(BLOCK_DOT(start, u[r], q)), acc[r][j]);   \
    }                                                                                                           \
  }

// A weight block's operand for each form (B the block type, from the tile's template).
#define TOY_AS_STORED(wb) B::values(wb)
#define TOY_OFFSET_TO_UNSIGNED(wb) _mm256_xor_si256(B::values(wb), _mm256_set1_epi8(char(0x80)))
#define TOY_UNSIGNED_EVEX(wb) B::unsigned_values(wb)
// Sum of each four products of signed bytes w and x, as 8 int32 lanes (w may be -128..127).
inline __m256i avx2_block_dot(__m256i, __m256i w, __m256i x) {
  const __m256i ax = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sx), _mm256_set1_epi16(1));
}
__attribute__((target("avxvnni"))) inline __m256i vex_block_dot(__m256i start, __m256i u, __m256i x) {
  return _mm256_dpbusd_avx_epi32(start, u, x);
}
__attribute__((target("avx512vnni,avx512vl"))) inline __m256i evex_block_dot(__m256i start, __m256i u, __m256i x) {
  return _mm256_dpbusd_epi32(start, u, x);
}

TOY_QUANT_TILE_256(tile_avx2, , TOY_AS_STORED, avx2_block_dot)
TOY_QUANT_TILE_256(tile_avxvnni, __attribute__((target("avxvnni"))), TOY_OFFSET_TO_UNSIGNED, vex_block_dot)
TOY_QUANT_TILE_256(tile_evex256, TOY_EVEX256, TOY_UNSIGNED_EVEX, evex_block_dot)
#undef TOY_QUANT_TILE_256
#undef TOY_QUANT_BLOCK_256
#undef TOY_AS_STORED
#undef TOY_OFFSET_TO_UNSIGNED
#undef TOY_UNSIGNED_EVEX
#undef TOY_EVEX256

// RW weight rows x P pairs of activation rows (x: the first pair's block 0; pairs follow
// every nb blocks), two rows a register; res[r * 2P + 2p + half].
template <class B, int RW, int P>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))) void tile_avx512(
    const uint8_t* w, size_t rb, const uint8_t* x, int64_t nb, float* res) {
  __m512 acc[RW][P];
  for (int r = 0; r < RW; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  const size_t ahead = prefetch_distance(RW, rb);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i u[RW];
    __m512 dw[RW];
#pragma GCC unroll 8
    for (int r = 0; r < RW; ++r) {
      const uint8_t* wb = w + r * rb + b * B::kBytes;
      if ((b & 1) == 0) prefetch_line(wb, ahead);
      u[r] = _mm512_broadcast_i64x4(B::unsigned_values(wb));
      dw[r] = _mm512_set1_ps(half_at(wb));
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const uint8_t* xb = x + (p * nb + b) * kPairBlock;
      const __m512i q = _mm512_loadu_si512(xb);
      const __m512i start = _mm512_loadu_si512(xb + 64);
      const __m512 dx = _mm512_loadu_ps(xb + 128);
#pragma GCC unroll 8
      for (int r = 0; r < RW; ++r)
        acc[r][p] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], dx), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, u[r], q)),
                                    acc[r][p]);
    }
  }
  for (int r = 0; r < RW; ++r)
    for (int p = 0; p < P; ++p) {
      res[r * 2 * P + 2 * p] = hsum256(_mm512_castps512_ps256(acc[r][p]));
      res[r * 2 * P + 2 * p + 1] = hsum256(_mm512_extractf32x8_ps(acc[r][p], 1));
    }
}

using Tile256 = void (*)(const uint8_t*, size_t, const uint8_t* const*, int64_t, int64_t, float*);
using Tile512 = void (*)(const uint8_t*, size_t, const uint8_t*, int64_t, float*);

// The 256-bit tile of a form: AVX2 and AVX-VNNI for rw weight rows (1..2) and rx activation
// rows (1..4), 16 registers; AVX512-VNNI's 256-bit form (a lone row: pairs take tile_512) for
// rw 1..4 and rx 1.
template <class B>
Tile256 tile_256(QuantDot form, int rw, int rx) {
  static constexpr Tile256 avx2[2][4] = {
      {tile_avx2<B, 1, 1>, tile_avx2<B, 1, 2>, tile_avx2<B, 1, 3>, tile_avx2<B, 1, 4>},
      {tile_avx2<B, 2, 1>, tile_avx2<B, 2, 2>, tile_avx2<B, 2, 3>, tile_avx2<B, 2, 4>}};
  static constexpr Tile256 vex[2][4] = {
      {tile_avxvnni<B, 1, 1>, tile_avxvnni<B, 1, 2>, tile_avxvnni<B, 1, 3>, tile_avxvnni<B, 1, 4>},
      {tile_avxvnni<B, 2, 1>, tile_avxvnni<B, 2, 2>, tile_avxvnni<B, 2, 3>, tile_avxvnni<B, 2, 4>}};
  static constexpr Tile256 evex[4] = {tile_evex256<B, 1, 1>, tile_evex256<B, 2, 1>, tile_evex256<B, 3, 1>,
                                      tile_evex256<B, 4, 1>};
  if (form == QuantDot::Avx512Vnni) return evex[rw - 1];
  return (form == QuantDot::AvxVnni ? vex : avx2)[rw - 1][rx - 1];
}

// The 512-bit tile for rw weight rows (1..4) and p pairs (1..4).
template <class B>
Tile512 tile_512(int rw, int p) {
  static constexpr Tile512 t[4][4] = {
      {tile_avx512<B, 1, 1>, tile_avx512<B, 1, 2>, tile_avx512<B, 1, 3>, tile_avx512<B, 1, 4>},
      {tile_avx512<B, 2, 1>, tile_avx512<B, 2, 2>, tile_avx512<B, 2, 3>, tile_avx512<B, 2, 4>},
      {tile_avx512<B, 3, 1>, tile_avx512<B, 3, 2>, tile_avx512<B, 3, 3>, tile_avx512<B, 3, 4>},
      {tile_avx512<B, 4, 1>, tile_avx512<B, 4, 2>, tile_avx512<B, 4, 3>, tile_avx512<B, 4, 4>}};
  return t[rw - 1][p - 1];
}

QuantDot form_in_use() {
  return g_quant_vnni_on.load(std::memory_order_relaxed) ? quant_dot() : QuantDot::Avx2;
}

template <class B>
void run_products(const float* xp, int64_t N, int64_t K, const uint8_t* wp, int64_t out, float* yp,
                  bool accumulate) {
  const int64_t nb = K / 32, pairs = (N + 1) / 2;
  const size_t rb = size_t(nb * B::kBytes);
  auto* packed = reinterpret_cast<uint8_t*>(scratch_floats(size_t(pairs * nb * kPairBlock / 4), 6));
  auto pack = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      pack_pair(xp + 2 * p * K, 2 * p + 1 < N ? xp + (2 * p + 1) * K : nullptr, K, N == 1, packed + p * nb * kPairBlock);
  };
  if (N > 2)
    parallel_for(0, pairs, pairs < 16 ? 1 : 4, pack);
  else
    pack(0, pairs);

  const QuantDot form = form_in_use();
  // Activation rows a tile takes: 8 (4 pairs) on 512 bits, 4 on 256 (16 registers). Weight
  // rows: 4 on 512 bits, 2 on 256; decoding one row, 1 (weight rows read side by side are
  // separate streams: four halved decoding speed on Zen 4).
  const int64_t group = form == QuantDot::Avx512Vnni ? 8 : 4;
  const int rw_max = N == 1 ? 1 : form == QuantDot::Avx512Vnni ? 4 : 2;
  // Writes a tile's results (res[r * width + j]) for rw weight rows from r0 and activation
  // rows n0.. n0 + rows: a 512-bit tile is 2p wide, and an odd last row's partner (zeros) is
  // dropped.
  auto put = [&](int64_t r0, int rw, int64_t n0, int rows, int width, const float* res) {
    for (int r = 0; r < rw; ++r)
      for (int j = 0; j < rows; ++j) {
        float& o = yp[(n0 + j) * out + r0 + r];
        o = accumulate ? o + res[r * width + j] : res[r * width + j];
      }
  };
  // Activation groups outside, weight rows inside: a group's packed rows stay in L1/L2 while
  // the task's weight rows (in L2) pass by. Decoding hands out 16 rows a task, prompts 64.
  for_row_blocks(out, N <= kGemvMaxRows ? 16 : 64, [&](int64_t r0, int64_t r1) {
    float res[4 * 8];
    for (int64_t n0 = 0; n0 < N; n0 += group) {
      const int rows = int(std::min(group, N - n0));
      const uint8_t* first = packed + (n0 / 2) * nb * kPairBlock;
      for (int64_t r = r0; r < r1; r += rw_max) {
        const int rw = int(std::min<int64_t>(rw_max, r1 - r));
        const uint8_t* wr = wp + size_t(r) * rb;
        if (form == QuantDot::Avx512Vnni && rows >= 2) {
          const int p = (rows + 1) / 2;
          tile_512<B>(rw, p)(wr, rb, first, nb, res);
          put(r, rw, n0, rows, 2 * p, res);
          continue;
        }
        const uint8_t* x[4];
        for (int j = 0; j < rows; ++j) x[j] = first + (j / 2) * nb * kPairBlock + (j % 2) * 32;
        tile_256<B>(form, rw, rows)(wr, rb, x, N == 1 ? kLoneBlock : kPairBlock, nb, res);
        put(r, rw, n0, rows, rows, res);
      }
    }
  });
}

template <class B>
void lone_row_products(const uint8_t* packed, const uint8_t* w, int64_t K, int64_t r0, int64_t r1, float* y) {
  const int64_t nb = K / 32;
  const size_t rb = size_t(nb * B::kBytes);
  const Tile256 tile = tile_256<B>(form_in_use(), 1, 1);
  const uint8_t* x[1] = {packed};
  for (int64_t r = r0; r < r1; ++r) tile(w + size_t(r) * rb, rb, x, kLoneBlock, nb, y + (r - r0));
}

}  // namespace

size_t quant_lone_row_bytes(int64_t K) { return size_t(K / 32 * kLoneBlock); }

void quant_pack_lone_row(const float* x, int64_t K, uint8_t* out) { pack_pair(x, nullptr, K, true, out); }

void quant_lone_row_products(DType t, const uint8_t* packed, const uint8_t* w, int64_t K, int64_t r0, int64_t r1,
                             float* y) {
  switch (t) {
    case DType::Q8_0: return lone_row_products<Q8_0Block>(packed, w, K, r0, r1, y);
    case DType::Q4_0: return lone_row_products<Q4_0Block>(packed, w, K, r0, r1, y);
    case DType::Q5_0: return lone_row_products<Q5_0Block>(packed, w, K, r0, r1, y);
    default: TOY_CHECK(false, "[quant products] no lone-row products for {}", name(t));
  }
}

bool quant_products_for_prompts() { return form_in_use() != QuantDot::Avx2; }

bool quant_products_supports(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q5_0; }

void quant_products(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), K = w.size(1), out = w.size(0);
  TOY_CHECK(quant_products_supports(w.dtype()) && K % 32 == 0, "[quant products] a {} weight with rows of {}",
            name(w.dtype()), K);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const auto* wp = static_cast<const uint8_t*>(w.raw_data());
  switch (w.dtype()) {
    case DType::Q8_0: return run_products<Q8_0Block>(xp, N, K, wp, out, yp, accumulate);
    case DType::Q4_0: return run_products<Q4_0Block>(xp, N, K, wp, out, yp, accumulate);
    default: return run_products<Q5_0Block>(xp, N, K, wp, out, yp, accumulate);
  }
}

}  // namespace toy::cpu
