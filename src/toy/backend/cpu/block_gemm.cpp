// Register-tiled small GEMMs (block_gemm.h). For each tile of MR rows and NV vectors of
// columns: accumulators stay in registers across all of k, A(i, k) is broadcast, B's row k
// is loaded once per tile; the last vector of a row is masked when N is not a multiple of
// the vector width. No packing: at these sizes A and B are in L1/L2 already.
#include "toy/backend/cpu/block_gemm.h"

#include <immintrin.h>

#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"

namespace toy::cpu {

namespace {

// Loops over a tile's rows and vectors must unroll completely: an accumulator array indexed
// by a loop variable lives in memory, and GCC then stores every accumulator every k.
#define TOY_UNROLL_ALL _Pragma("GCC unroll 16")

// A(i, k) = a[i * si + k * sk]: (si, sk) = (lda, 1), or (1, lda) for A transposed.
struct AStrides {
  int64_t si, sk;
};

// ---- AVX2: 6 rows x 16 columns (two 8-lane vectors) per tile: 12 accumulators of the 16
// registers. (Masked tails are slow on AMD; the common widths, head dims of 64 and 128 and
// full key chunks of 256, are multiples of 16 and need none.) --------------------------------------

// Lane mask for the first n (0..8) lanes.
inline __m256i first_lanes(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int MR, int NV, bool Tail>
void tile256(AStrides as, int64_t K, float alpha, const float* a, const float* b, int64_t ldb, float beta, float* c,
             int64_t ldc, int64_t last) {
  const __m256i mask = first_lanes(last);  // lanes of the last vector that exist
  __m256 acc[MR][NV];
  TOY_UNROLL_ALL
  for (int r = 0; r < MR; ++r)
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    __m256 bv[NV];
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) bv[v] = !Tail || v + 1 < NV ? _mm256_loadu_ps(bk + 8 * v) : _mm256_maskload_ps(bk + 8 * v, mask);
    TOY_UNROLL_ALL
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * as.si + k * as.sk);
      TOY_UNROLL_ALL
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  TOY_UNROLL_ALL
  for (int r = 0; r < MR; ++r)
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + 8 * v;
      const bool full = !Tail || v + 1 < NV;
      __m256 out = _mm256_mul_ps(acc[r][v], va);
      if (beta != 0.0f) {
        const __m256 old = full ? _mm256_loadu_ps(cp) : _mm256_maskload_ps(cp, mask);
        out = _mm256_fmadd_ps(acc[r][v], va, _mm256_mul_ps(vb, old));
      }
      if (full)
        _mm256_storeu_ps(cp, out);
      else
        _mm256_maskstore_ps(cp, mask, out);
    }
}

template <int MR>
void rows256(AStrides as, int64_t N, int64_t K, float alpha, const float* a, const float* b, int64_t ldb, float beta,
             float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 16 <= N; j += 16) tile256<MR, 2, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 8);
  const int64_t rest = N - j;
  if (rest == 8)
    tile256<MR, 1, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 8);
  else if (rest > 8)
    tile256<MR, 2, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, rest - 8);
  else if (rest > 0)
    tile256<MR, 1, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, rest);
}

// ---- AVX-512: 64 columns (four 16-lane vectors) per tile ---------------------------------

template <int MR, int NV, bool Tail>
TOY_AVX512 void tile512(AStrides as, int64_t K, float alpha, const float* a, const float* b, int64_t ldb,
                        float beta, float* c, int64_t ldc, int64_t last) {
  const __mmask16 mask = __mmask16((1u << last) - 1);  // lanes of the last vector that exist
  __m512 acc[MR][NV];
  TOY_UNROLL_ALL
  for (int r = 0; r < MR; ++r)
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    __m512 bv[NV];
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) bv[v] = !Tail || v + 1 < NV ? _mm512_loadu_ps(bk + 16 * v) : _mm512_maskz_loadu_ps(mask, bk + 16 * v);
    TOY_UNROLL_ALL
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * as.si + k * as.sk]);
      TOY_UNROLL_ALL
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  TOY_UNROLL_ALL
  for (int r = 0; r < MR; ++r)
    TOY_UNROLL_ALL
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + 16 * v;
      const __mmask16 m = !Tail || v + 1 < NV ? __mmask16(0xFFFF) : mask;
      __m512 out = _mm512_mul_ps(acc[r][v], va);
      if (beta != 0.0f) out = _mm512_fmadd_ps(acc[r][v], va, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, cp)));
      _mm512_mask_storeu_ps(cp, m, out);
    }
}

template <int MR>
TOY_AVX512 void rows512(AStrides as, int64_t N, int64_t K, float alpha, const float* a, const float* b,
                        int64_t ldb, float beta, float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 64 <= N; j += 64) tile512<MR, 4, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 16);
  const int64_t rest = N - j;
  if (rest <= 0) return;
  if (rest % 16 == 0) {  // whole vectors (a causal chunk ends on a 16-key block when S - T is a multiple of 16)
    switch (rest / 16) {
      case 1: tile512<MR, 1, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 16); break;
      case 2: tile512<MR, 2, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 16); break;
      default: tile512<MR, 3, false>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, 16); break;
    }
    return;
  }
  const int64_t last = rest - (rest - 1) / 16 * 16;  // 1..15 lanes in the last vector
  switch ((rest + 15) / 16) {
    case 1: tile512<MR, 1, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, last); break;
    case 2: tile512<MR, 2, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, last); break;
    case 3: tile512<MR, 3, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, last); break;
    default: tile512<MR, 4, true>(as, K, alpha, a, b + j, ldb, beta, c + j, ldc, last); break;
  }
}

// Runs rows(MR, a_i, c_i) over M's rows in tiles of MaxRows and one smaller tile.
template <int MaxRows, class Rows>
void by_row_tiles(int64_t M, AStrides as, const float* a, float* c, int64_t ldc, Rows&& rows) {
  int64_t i = 0;
  for (; i + MaxRows <= M; i += MaxRows) rows(std::integral_constant<int, MaxRows>{}, a + i * as.si, c + i * ldc);
  const float* ai = a + i * as.si;
  float* ci = c + i * ldc;
  switch (M - i) {
    case 1: rows(std::integral_constant<int, 1>{}, ai, ci); break;
    case 2: rows(std::integral_constant<int, 2>{}, ai, ci); break;
    case 3: rows(std::integral_constant<int, 3>{}, ai, ci); break;
    case 4: if constexpr (MaxRows > 4) rows(std::integral_constant<int, 4>{}, ai, ci); break;
    case 5: if constexpr (MaxRows > 5) rows(std::integral_constant<int, 5>{}, ai, ci); break;
    default: break;
  }
}

}  // namespace

void block_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const AStrides as = trans_a ? AStrides{1, lda} : AStrides{lda, 1};
  if (avx512_forms()) {
    by_row_tiles<6>(M, as, a, c, ldc, [&]<int MR>(std::integral_constant<int, MR>, const float* ai, float* ci) {
      rows512<MR>(as, N, K, alpha, ai, b, ldb, beta, ci, ldc);
    });
  } else {
    by_row_tiles<6>(M, as, a, c, ldc, [&]<int MR>(std::integral_constant<int, MR>, const float* ai, float* ci) {
      rows256<MR>(as, N, K, alpha, ai, b, ldb, beta, ci, ldc);
    });
  }
}

}  // namespace toy::cpu
