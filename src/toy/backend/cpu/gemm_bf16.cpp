// gemm_bf16 (gemm_bf16.h): both operands packed once into words of bf16 pairs, then tiles of c
// on AMX or vdpbf16ps, the threads taking blocks of c.
//
// Packing. Both instructions multiply the two bf16 halves of a 32-bit word of one operand with
// those of the other, so both operands are packed as words of two consecutive k: word (p, lane)
// = bf16(x(lane, 2p)) | bf16(x(lane, 2p + 1)) << 16, an odd K ending in a zero, the pairs padded
// with zero words to a multiple of 16. b is packed in panels of 32 columns, pair-major ([pairs]
// [32]: an AMX b tile is 16 such rows of 16 words, a vdpbf16ps operand one row's register); a
// in panels of 12 rows pair-major for vdpbf16ps (broadcast word by word) or of 16 rows as AMX
// a tiles ([pairs / 16][16 rows][16 pairs]). Padding lanes are zeros, so the tile loops have no
// edge cases but the stores. An operand is read lane-contiguous (two k-rows of lanes
// interleaved), k-contiguous (each lane's 32 k as 16 words) or, for other strides, element by
// element, in groups of 16 lanes x 16 pairs transposed (16 x 16 words) where the layout wants.
//
// vdpbf16ps tiles: 12 x 32 of c in 24 accumulators; per pair of k, two loads of b and 12
// broadcasts of a, each feeding two instructions. The k loop runs in blocks of 256 so a b
// panel's block (16 KB) stays in L1 while the 96-row block of a it meets streams from L2.
//
// AMX tiles: 32 x 32 of c in four tile registers, per 32 k two a tiles and two b tiles and four
// tdpbf16ps; blocks of 128 rows x 256 columns x 256 k: the b panel's 32 columns of a k block
// (16 KB) stay in L1 while the a tiles stream from L2 (512 k: 10% slower at 1024^3).
//
// Either way c is reloaded between k blocks, which does not change its bits (it holds the f32
// running sum).
#include "toy/backend/cpu/gemm_bf16.h"

#include <immintrin.h>

#include <algorithm>

#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/core/cpu_features.h"
#include "toy/core/dtype.h"
#include "toy/core/error.h"
#include "toy/core/thread_pool.h"

#define TOY_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define TOY_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

namespace toy::cpu {

namespace {

constexpr int kMR = 12;           // rows of a vdpbf16ps tile
constexpr int kNR = 32;           // columns of a tile (both forms) and of b's panels
constexpr int64_t kKPairs = 128;  // vdpbf16ps: pairs of k per block
constexpr int64_t kMC = 96;       // vdpbf16ps: rows of a block of c (kMR * 8)
constexpr int64_t kNC = 512;      // vdpbf16ps: columns of a block of c (kNR * 16)
constexpr int64_t kAmxMC = 128, kAmxNC = 256, kAmxKPairs = 128;  // AMX blocks
constexpr int kSlotA = 7, kSlotB = 8;  // scratch slots (scratch.h)

uint32_t* scratch_words(size_t n, int slot) { return reinterpret_cast<uint32_t*>(scratch_floats(n, slot)); }

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? 0 : __mmask16((1u << n) - 1); }
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// 16 f32 -> bf16 bits as f32_to_bf16 (the cast) rounds: nearest even on the bits, NaNs
// quieted. vcvtneps2bf16 does that but for f32 subnormals, which it flushes to zero: the
// instructions would take the bf16 subnormals the cast makes of most of them as zero anyway,
// but not the 2^-126 (a normal) it makes of the largest (|x| from 0x007f8000 up), so those
// lanes, rare enough to branch on, are rounded by the bits.
TOY_AVX512_BF16 inline __m256i round_to_bf16(__m512 x) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i above = _mm512_sub_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                         _mm512_set1_epi32(0x007f8000));
  const __mmask16 up = _mm512_cmplt_epu32_mask(above, _mm512_set1_epi32(0x8000));
  if (__builtin_expect(up == 0, 1)) return h;
  // (those lanes: + 2^15 carries into the exponent; the sign stays)
  const __m256i rounded = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16));
  return _mm256_mask_mov_epi16(h, up, rounded);
}

// 16 values of one k-row, lanes contiguous: bf16 bits in 16-bit lanes, masked lanes zero.
TOY_AVX512_BF16 inline __m256i load_lanes(const Bf16Operand& x, int64_t offset, __mmask16 m) {
  if (x.is_bf16) return _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x.p) + offset);
  return round_to_bf16(_mm512_maskz_loadu_ps(m, static_cast<const float*>(x.p) + offset));
}

// 32 consecutive k of one lane (those past `n` zero) as 16 words.
TOY_AVX512_BF16 inline __m512i load_pairs(const Bf16Operand& x, int64_t offset, int64_t n) {
  if (x.is_bf16) {
    const __mmask32 m = n >= 32 ? ~__mmask32(0) : n <= 0 ? 0 : __mmask32((1u << n) - 1);
    return _mm512_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x.p) + offset);
  }
  const float* f = static_cast<const float*>(x.p) + offset;
  const __m256i lo = round_to_bf16(_mm512_maskz_loadu_ps(first_lanes(n), f));
  const __m256i hi = round_to_bf16(_mm512_maskz_loadu_ps(first_lanes(n - 16), f + 16));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Transposes 16 x 16 32-bit words in place (r[i] lane j <-> r[j] lane i).
TOY_AVX512_BF16 void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + j], 128-bit lane L: column 4L + j of rows 4g..4g+3.
  __m512i u[16];
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
    r[j] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + j] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[8 + j] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
}

// Element (lane, k) of an operand as bf16 bits (the cast's rounding).
uint32_t element_bits(const Bf16Operand& x, int64_t offset) {
  if (x.is_bf16) return static_cast<const uint16_t*>(x.p)[offset];
  return f32_to_bf16(static_cast<const float*>(x.p)[offset]);
}

// A panel's layout: [pairs][W] words, or AMX a tiles ([pairs / 16][16 lanes][16 pairs], W 16).
enum class Panel { PairMajor, AmxTiles };

// Packs lanes [l0, l0 + W) of an operand (lanes past `lanes` as zeros) over all K, the pairs
// padded to a multiple of 16. Lane l, k at offset l * s_lane + k * s_k.
TOY_AVX512_BF16 void pack_panel(const Bf16Operand& x, int64_t s_lane, int64_t s_k, int64_t l0, int64_t lanes,
                                int64_t K, int W, Panel layout, uint32_t* dst) {
  const int64_t pairs = (K + 1) / 2, padded = round_up(pairs, 16);
  // Per pair, two k-rows of lanes interleaved: word j = (row 2p lane j, row 2p+1 lane j).
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int c0 = 0; c0 < W; c0 += 16) {
    const int64_t g0 = l0 + c0;  // the group's first lane
    const __mmask16 real = first_lanes(lanes - g0);
    for (int64_t p0 = 0; p0 < padded; p0 += 16) {
      __m512i r[16];
      bool by_pair;  // r[t] holds pair p0 + t of 16 lanes (else lane g0 + t's 16 pairs)
      if (s_lane == 1) {
        by_pair = true;
        for (int t = 0; t < 16; ++t) {
          const int64_t p = p0 + t, off = g0 + 2 * p * s_k;
          if (p >= pairs) {
            r[t] = _mm512_setzero_si512();
            continue;
          }
          const __m256i even = load_lanes(x, off, real);
          const __m256i odd = 2 * p + 1 < K ? load_lanes(x, off + s_k, real) : _mm256_setzero_si256();
          r[t] = _mm512_permutexvar_epi16(interleave, _mm512_inserti64x4(_mm512_castsi256_si512(even), odd, 1));
        }
      } else if (s_k == 1) {
        by_pair = false;
        for (int t = 0; t < 16; ++t)
          r[t] = g0 + t < lanes ? load_pairs(x, (g0 + t) * s_lane + 2 * p0, K - 2 * p0) : _mm512_setzero_si512();
      } else {
        by_pair = true;
        alignas(64) uint32_t w[16][16];
        for (int t = 0; t < 16; ++t)
          for (int j = 0; j < 16; ++j) {
            const int64_t p = p0 + t, l = g0 + j;
            w[t][j] = 0;
            if (l >= lanes || p >= pairs) continue;
            w[t][j] = element_bits(x, l * s_lane + 2 * p * s_k);
            if (2 * p + 1 < K) w[t][j] |= element_bits(x, l * s_lane + (2 * p + 1) * s_k) << 16;
          }
        for (int t = 0; t < 16; ++t) r[t] = _mm512_load_si512(w[t]);
      }
      if (layout == Panel::PairMajor) {
        if (!by_pair) transpose16(r);
        const __mmask16 store = first_lanes(W - c0);
        for (int t = 0; t < 16; ++t) _mm512_mask_storeu_epi32(dst + (p0 + t) * W + c0, store, r[t]);
      } else {
        if (by_pair) transpose16(r);
        for (int t = 0; t < 16; ++t) _mm512_storeu_si512(dst + p0 * 16 + t * 16, r[t]);
      }
    }
  }
}

// ---- vdpbf16ps ---------------------------------------------------------------------------

// c[rows, cols] (+)= the 12 x 32 tile of a's panel block and b's, over `pairs` pairs of k.
TOY_AVX512_BF16 void dot_tile(const uint32_t* a, const uint32_t* b, int64_t pairs, float* c, int64_t ldc, int rows,
                              int cols, bool load_c) {
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
  __m512 acc[kMR][2];
#pragma GCC unroll 12
  for (int i = 0; i < kMR; ++i) {
    const bool load = load_c && i < rows;
    acc[i][0] = load ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    acc[i][1] = load ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kNR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(a[p * kMR + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  for (int i = 0; i < rows; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
}

// Block t of c (row blocks x column blocks), all of k. pa/pb as packed; `padded` pairs each.
void dot_block(int64_t t, int64_t M, int64_t N, int64_t pairs, int64_t padded, const uint32_t* pa,
               const uint32_t* pb, float* c, int64_t ldc, bool accumulate) {
  const int64_t col_blocks = (N + kNC - 1) / kNC;
  const int64_t i0 = t / col_blocks * kMC, i1 = std::min(M, i0 + kMC);
  const int64_t j0 = t % col_blocks * kNC, j1 = std::min(N, j0 + kNC);
  for (int64_t p0 = 0; p0 < pairs; p0 += kKPairs) {
    const int64_t n = std::min(kKPairs, pairs - p0);
    for (int64_t j = j0; j < j1; j += kNR) {
      const uint32_t* bp = pb + (j / kNR * padded + p0) * kNR;
      for (int64_t i = i0; i < i1; i += kMR)
        dot_tile(pa + (i / kMR * padded + p0) * kMR, bp, n, c + i * ldc + j, ldc, int(std::min<int64_t>(kMR, M - i)),
                 int(std::min<int64_t>(kNR, N - j)), accumulate || p0 > 0);
    }
  }
}

// ---- AMX ---------------------------------------------------------------------------------

// The tile configuration (palette 1): tiles 0-3 c (16 x 16 f32), 4-5 a, 6-7 b (16 rows of 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// c[i.., j..] (rows x cols of 32 x 32) (+)= a's panels ip, ip + 1 times b's panel jp over pairs
// [p0, p1) (multiples of 16). Edge tiles go through a 32 x 32 buffer.
TOY_AMX void amx_tile(const uint32_t* pa, const uint32_t* pb, int64_t ip, int64_t jp, int64_t padded, int64_t p0,
                      int64_t p1, float* c, int64_t ldc, int rows, int cols, bool load_c) {
  alignas(64) float edge[32 * 32];
  const bool whole = rows == 32 && cols == 32;
  float* t = whole ? c : edge;
  const int64_t ldt = whole ? ldc : 32;
  if (!whole) {
    std::fill(edge, edge + 32 * 32, 0.0f);
    if (load_c)
      for (int i = 0; i < rows; ++i) std::copy(c + i * ldc, c + i * ldc + cols, edge + i * 32);
  }
  const size_t stride = size_t(ldt) * 4;
  // (GCC's tile loads are asm that names the pointer but not the memory: without this the
  // edge buffer's writes above could move below them.)
  __asm__ volatile("" ::: "memory");
  if (load_c || !whole) {
    _tile_loadd(0, t, stride);
    _tile_loadd(1, t + 16, stride);
    _tile_loadd(2, t + 16 * ldt, stride);
    _tile_loadd(3, t + 16 * ldt + 16, stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const uint32_t* a0 = pa + ip * padded * 16;
  const uint32_t* a1 = a0 + padded * 16;
  const uint32_t* b = pb + jp * padded * kNR;
  // Each product follows the loads it needs (tile registers are not renamed: a load waits
  // for the last product reading its register, so loads interleaved with products overlap).
  for (int64_t p = p0; p < p1; p += 16) {
    _tile_loadd(4, a0 + p * 16, 64);
    _tile_loadd(6, b + p * kNR, kNR * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + p * kNR + 16, kNR * 4);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a1 + p * 16, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, t, stride);
  _tile_stored(1, t + 16, stride);
  _tile_stored(2, t + 16 * ldt, stride);
  _tile_stored(3, t + 16 * ldt + 16, stride);
  if (!whole)
    for (int i = 0; i < rows; ++i) std::copy(edge + i * 32, edge + i * 32 + cols, c + i * ldc);
}

TOY_AMX void amx_block(int64_t t, int64_t M, int64_t N, int64_t padded, const uint32_t* pa, const uint32_t* pb,
                       float* c, int64_t ldc, bool accumulate) {
  static const TileConfig config;
  _tile_loadconfig(&config);  // per thread; released below so a switch saves no tile state
  const int64_t col_blocks = (N + kAmxNC - 1) / kAmxNC;
  const int64_t i0 = t / col_blocks * kAmxMC, i1 = std::min(M, i0 + kAmxMC);
  const int64_t j0 = t % col_blocks * kAmxNC, j1 = std::min(N, j0 + kAmxNC);
  for (int64_t p0 = 0; p0 < padded; p0 += kAmxKPairs) {
    const int64_t p1 = std::min(padded, p0 + kAmxKPairs);
    for (int64_t j = j0; j < j1; j += 32)
      for (int64_t i = i0; i < i1; i += 32)
        amx_tile(pa, pb, i / 16, j / kNR, padded, p0, p1, c + i * ldc + j, ldc, int(std::min<int64_t>(32, M - i)),
                 int(std::min<int64_t>(32, N - j)), accumulate || p0 > 0);
  }
  _tile_release();
}

}  // namespace

bool gemm_bf16_available() { return bf16_products() != Bf16Products::Widened; }

void gemm_bf16(int64_t M, int64_t N, int64_t K, const Bf16Operand& a, const Bf16Operand& b, float* c, int64_t ldc,
               bool accumulate, Bf16Products form) {
  TOY_CHECK(form == Bf16Products::Amx ? cpu_has_amx_bf16() : form == Bf16Products::Avx512Dot && cpu_has_avx512_bf16(),
            "[gemm_bf16] this CPU has no {} form", form == Bf16Products::Amx ? "AMX" : "vdpbf16ps");
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
    return;
  }
  const bool amx = form == Bf16Products::Amx;
  const int64_t pairs = (K + 1) / 2, padded = round_up(pairs, 16);
  const int a_rows = amx ? 16 : kMR;  // per panel
  // (AMX takes a's panels two at a time: an even count, the last one zeros when M needs an odd one.)
  const int64_t a_panels = amx ? round_up((M + 15) / 16, 2) : (M + kMR - 1) / kMR, b_panels = (N + kNR - 1) / kNR;
  uint32_t* pa = scratch_words(size_t(a_panels * padded * a_rows), kSlotA);
  uint32_t* pb = scratch_words(size_t(b_panels * padded * kNR), kSlotB);
  parallel_for(0, a_panels + b_panels, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (t < a_panels)
        pack_panel(a, a.row_stride, a.col_stride, t * a_rows, M, K, a_rows, amx ? Panel::AmxTiles : Panel::PairMajor,
                   pa + t * padded * a_rows);
      else
        pack_panel(b, b.col_stride, b.row_stride, (t - a_panels) * kNR, N, K, kNR, Panel::PairMajor,
                   pb + (t - a_panels) * padded * kNR);
    }
  });
  const int64_t mc = amx ? kAmxMC : kMC, nc = amx ? kAmxNC : kNC;
  const int64_t blocks = (M + mc - 1) / mc * ((N + nc - 1) / nc);
  parallel_for(0, blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (amx)
        amx_block(t, M, N, padded, pa, pb, c, ldc, accumulate);
      else
        dot_block(t, M, N, pairs, padded, pa, pb, c, ldc, accumulate);
    }
  });
}

}  // namespace toy::cpu
