// The tiles behind gemm_half.h and gemm_f32.h (internal to those two kernels): c = a @ b where b
// is packed a block at a time into panels of 32 columns, k-major ([k][32]: one 64-byte row of
// halves, or two of f32, per k; zeros past N), and a's rows are broadcast from where they lie
// (or from a packed copy where its k are not contiguous). Tiles of c keep their sums in
// registers, widening a half panel's row for each k in registers (F16C's vcvtph2ps, or a shift
// for BF16).
//
// Threads take contiguous runs of b's panels (c's columns), and parts of the rows where the
// panels are fewer than twice the threads (split_c). A run goes in groups of 8 panels;
// per group and block of 256 k the group is packed (128 KB of halves, 256 KB of f32: in L2),
// then for each 96 rows of a (96 KB) each panel's block (16 or 32 KB, in L1) meets the 96
// rows' tiles (groups of 32 measured the same on a Sapphire Rapids Xeon; 8 keep the scratch
// small). c is reloaded between k blocks, which does not change its bits (it holds the f32
// running sum): each c(i, j) is one FMA chain along k in order.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu::gemm_tiles {

constexpr int kNR = 32;            // columns of a panel (an AVX-512 tile; two AVX2 tiles)
constexpr int kMR512 = 12, kMR256 = 6;  // rows of a tile
constexpr int64_t kKC = 256;       // k per block
constexpr int64_t kMC = 96;        // rows of a per block (a multiple of both tiles' rows)
constexpr int kGroup = 8;          // panels packed together
// Scratch slots: the panels share matmul_weight's widened tiles' slot (never live at the same
// time); a's packed rows (gemm_f32) and gemm_weight_rows' decoded rows share gemm_bf16's a
// slot (the three never run inside each other). Not slot 6: matmul_weight's rounded
// activations, which a caller inside a parallel job holds in its chunk's.
constexpr int kSlotPanels = 5, kSlotRows = 7;

// ---- tiles -------------------------------------------------------------------------------

// What a panel holds: halves widened in registers, or f32 (block types, decoded as packed).
enum class Elem { F16, BF16, F32 };

// 16 (AVX-512) or 8 (AVX2) values of panel b from element i on, as f32.
template <Elem E>
TOY_AVX512 inline __m512 panel16(const void* b, int64_t i) {
  if constexpr (E == Elem::F32) return _mm512_loadu_ps(static_cast<const float*>(b) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(b) + i));
  if constexpr (E == Elem::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}
template <Elem E>
inline __m256 panel8(const void* b, int64_t i) {
  if constexpr (E == Elem::F32) return _mm256_loadu_ps(static_cast<const float*>(b) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(b) + i));
  if constexpr (E == Elem::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// Where a tile's sums start: 0 (p null), or row i's from p + i * ld (c itself, to go on from
// it; or a bias, ld 0, the same for every row).
struct Start {
  const float* p = nullptr;
  int64_t ld = 0;
};

// c[MR rows, cols] = a's MR rows (row stride lda) @ the panel's kc k-rows, the sums starting
// from `from` and taking the k in order.
template <int MR, Elem E>
TOY_AVX512 void tile512(const float* a, int64_t lda, const void* b, int64_t kc, float* c, int64_t ldc, int cols,
                        Start from) {
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xffff) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1);
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = from.p ? _mm512_maskz_loadu_ps(m0, from.p + i * from.ld) : _mm512_setzero_ps();
    acc[i][1] = from.p ? _mm512_maskz_loadu_ps(m1, from.p + i * from.ld + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = panel16<E>(b, k * kNR), b1 = panel16<E>(b, k * kNR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i * lda + k]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
}

// The AVX2 form: MR rows x 16 columns of the panel, from column `first` (0 or 16).
template <int MR, Elem E>
void tile256(const float* a, int64_t lda, const void* b, int64_t first, int64_t kc, float* c, int64_t ldc, int cols,
             Start from) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8), lane);
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = from.p ? _mm256_maskload_ps(from.p + i * from.ld, m0) : _mm256_setzero_ps();
    acc[i][1] = from.p ? _mm256_maskload_ps(from.p + i * from.ld + 8, m1) : _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = panel8<E>(b, k * kNR + first), b1 = panel8<E>(b, k * kNR + first + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i * lda + k);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    _mm256_maskstore_ps(c + i * ldc, m0, acc[i][0]);
    _mm256_maskstore_ps(c + i * ldc + 8, m1, acc[i][1]);
  }
}

using Tile512 = void (*)(const float*, int64_t, const void*, int64_t, float*, int64_t, int, Start);
using Tile256 = void (*)(const float*, int64_t, const void*, int64_t, int64_t, float*, int64_t, int, Start);

template <Elem E, int... R>
constexpr auto tiles512(std::integer_sequence<int, R...>) {
  return std::array<Tile512, sizeof...(R)>{tile512<R + 1, E>...};
}
template <Elem E, int... R>
constexpr auto tiles256(std::integer_sequence<int, R...>) {
  return std::array<Tile256, sizeof...(R)>{tile256<R + 1, E>...};
}

// Runs the tiles of c's rows [i0, i1) x one panel (columns j.., `cols` of them) over kc k, the
// sums of row i starting from from.p + i * from.ld (or 0).
template <Elem E>
void panel_rows(bool avx512, int64_t i0, int64_t i1, const float* a, int64_t lda, const void* panel, int64_t kc,
                float* c, int64_t ldc, int cols, Start from) {
  static constexpr auto t512 = tiles512<E>(std::make_integer_sequence<int, kMR512>());
  static constexpr auto t256 = tiles256<E>(std::make_integer_sequence<int, kMR256>());
  const int mr = avx512 ? kMR512 : kMR256;
  for (int64_t i = i0; i < i1; i += mr) {
    const int rows = int(std::min<int64_t>(mr, i1 - i));
    const float* ai = a + i * lda;
    float* ci = c + i * ldc;
    const Start fi{from.p ? from.p + i * from.ld : nullptr, from.ld};
    if (avx512) {
      t512[size_t(rows - 1)](ai, lda, panel, kc, ci, ldc, cols, fi);
    } else {
      t256[size_t(rows - 1)](ai, lda, panel, 0, kc, ci, ldc, std::min(cols, 16), fi);
      if (cols > 16)
        t256[size_t(rows - 1)](ai, lda, panel, 16, kc, ci + 16, ldc, cols - 16, {fi.p ? fi.p + 16 : nullptr, fi.ld});
    }
  }
}

// How run_panels blocks a product: k in blocks of at most kc_max (of equal sizes, rounded up
// to 8s, where `even`; else kc_max each and the rest), panels packed `group` at a time.
struct Blocking {
  int64_t kc_max;
  int64_t group;
  bool even;
};
inline constexpr Blocking kHalfBlocking{kKC, kGroup, false};

// The k blocks' size for K under b.
constexpr int64_t k_block(const Blocking& b, int64_t K) {
  if (!b.even || K <= b.kc_max) return std::min(K, b.kc_max);
  const int64_t blocks = (K + b.kc_max - 1) / b.kc_max;
  return std::min(b.kc_max, ((K + blocks - 1) / blocks + 7) / 8 * 8);
}

// c's columns of panels [p0, p1), all rows, all k: pack(p, k0, k1, dst) writes panel p's
// k-rows [k0, k1) to dst; a_block(i0, i1, k0, k1, first) gives a's rows [i0, i1) at k0 as
// {pointer, row stride} (a itself where its rows lie in memory; a packed copy otherwise),
// `first` true for the first of the groups of panels (each block of a is asked for once per
// group: first, every block once, rows in order within each k block, k blocks in order).
// The sums start from c (accumulate), else from `bias` (N values, the same for every row:
// what presetting c to it and accumulating gives, without that pass over c), else from 0.
template <Elem E, Blocking B = kHalfBlocking, class Pack, class ABlock>
void run_panels(int64_t p0, int64_t p1, int64_t M, int64_t N, int64_t K, ABlock&& a_block, float* c, int64_t ldc,
                bool accumulate, Pack&& pack, const float* bias = nullptr) {
  constexpr int64_t elem = E == Elem::F32 ? 4 : 2;
  constexpr int64_t panel_bytes = B.kc_max * kNR * elem;
  const bool avx512 = avx512_forms();
  // (64-byte aligned: a panel's k-row is whole cache lines, its loads never split one.)
  float* scratch = scratch_floats(size_t(B.group * panel_bytes / 4 + 16), kSlotPanels);
  char* packed = reinterpret_cast<char*>(scratch + (16 - reinterpret_cast<uintptr_t>(scratch) / 4 % 16) % 16);
  const int64_t kb = k_block(B, K);
  for (int64_t g0 = p0; g0 < p1; g0 += B.group) {
    const int64_t g1 = std::min(p1, g0 + B.group);
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
      const int64_t k1 = std::min(K, k0 + kb), kc = k1 - k0;
      for (int64_t p = g0; p < g1; ++p) pack(p, k0, k1, packed + (p - g0) * panel_bytes);
      const bool load = accumulate || k0 > 0;
      for (int64_t i0 = 0; i0 < M; i0 += kMC) {
        const int64_t i1 = std::min(M, i0 + kMC);
        const auto [ai, lda] = a_block(i0, i1, k0, k1, g0 == p0);
        for (int64_t p = g0; p < g1; ++p) {
          const int64_t j = p * kNR;
          float* cij = c + i0 * ldc + j;
          const Start from = load ? Start{cij, ldc} : bias ? Start{bias + j, 0} : Start{};
          panel_rows<E>(avx512, 0, i1 - i0, ai, lda, packed + (p - g0) * panel_bytes, kc, cij, ldc,
                        int(std::min<int64_t>(kNR, N - j)), from);
        }
      }
    }
  }
}

// a's rows as they lie (row stride lda, k contiguous): the a_block of run_panels that packs
// nothing.
struct RowsInPlace {
  const float* a;
  int64_t lda;
  std::pair<const float*, int64_t> operator()(int64_t i0, int64_t, int64_t k0, int64_t, bool) const {
    return {a + i0 * lda + k0, lda};
  }
};

// Splits c into tasks for the threads: runs of panels, and, where there are too few panels
// for the threads (a narrow product on many cores), parts of the rows too (each part packs
// its panels again: the price of keeping every core busy). run(p0, p1, i0, i1) multiplies
// panels [p0, p1) over rows [i0, i1). The split changes no bit (each c element is one chain).
template <class Run>
void split_c(int64_t M, int64_t N, Run&& run) {
  const int64_t panels = (N + kNR - 1) / kNR, threads = num_threads();
  int64_t parts = 1;
  if (panels < 2 * threads) parts = std::clamp<int64_t>((2 * threads + panels - 1) / panels, 1, (M + kMC - 1) / kMC);
  const int64_t part_rows = (M + parts - 1) / parts;
  parallel_for(0, panels * parts, 1, [&](int64_t t0, int64_t t1) {
    while (t0 < t1) {  // one part's run of panels at a time
      const int64_t part = t0 / panels, p0 = t0 % panels, p1 = std::min(panels, p0 + (t1 - t0));
      run(p0, p1, part * part_rows, std::min(M, (part + 1) * part_rows));
      t0 += p1 - p0;
    }
  });
}

// c = 0 (or left) when K is empty; whether there is anything to multiply.
inline bool nonempty(int64_t M, int64_t N, int64_t K, float* c, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return false;
  if (K <= 0 && !accumulate)
    for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
  return K > 0;
}

}  // namespace toy::cpu::gemm_tiles
