// gemm_half (gemm_half.h) on gemm_tiles.h's tiles: b's halves packed as halves (no widening in
// memory) into panels, a weight's rows (k contiguous per column) transposed 8 x 8 halves at a
// time in SSE registers, k-rows already contiguous in columns copied. a is not packed: its
// rows are broadcast from where they lie (packing them, per thread and k block, cost more than
// it saved in a prompt's narrow products: K/V's 192 columns). gemm_weight_rows: panels of a
// block-type weight's rows decoded to f32 as they are packed.
#include "toy/backend/cpu/gemm_half.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "toy/backend/cpu/gemm_tiles.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/error.h"
#include "toy/core/quant.h"

namespace toy::cpu {

using namespace gemm_tiles;

namespace {

// ---- packing -----------------------------------------------------------------------------

// 8 x 8 halves: r[i] lane q <-> r[q] lane i.
inline void transpose8x8(__m128i r[8]) {
  __m128i a[8], b[8];
  for (int i = 0; i < 4; ++i) {
    a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    const __m128i* s = a + 4 * h;
    b[4 * h + 0] = _mm_unpacklo_epi32(s[0], s[2]);  // k 0, 1
    b[4 * h + 1] = _mm_unpackhi_epi32(s[0], s[2]);  // k 2, 3
    b[4 * h + 2] = _mm_unpacklo_epi32(s[1], s[3]);  // k 4, 5
    b[4 * h + 3] = _mm_unpackhi_epi32(s[1], s[3]);  // k 6, 7
  }
  for (int q = 0; q < 4; ++q) {
    r[2 * q] = _mm_unpacklo_epi64(b[q], b[4 + q]);
    r[2 * q + 1] = _mm_unpackhi_epi64(b[q], b[4 + q]);
  }
}

// out[k - k0][jj] = b(k, j0 + jj) for k in [k0, k1), jj < 32; columns from N on are zeros
// (never stored, but zeros cannot be denormals or NaNs that slow the FMAs).
void pack_panel(const HalfOperand& b, int64_t N, int64_t j0, int64_t k0, int64_t k1, uint16_t* out) {
  const int64_t cols = std::min<int64_t>(kNR, N - j0), kc = k1 - k0;
  if (cols < kNR)
    for (int64_t k = 0; k < kc; ++k) std::memset(out + k * kNR + cols, 0, size_t(kNR - cols) * 2);
  if (b.j_stride == 1) {  // a k-row of columns lies contiguous
    for (int64_t k = k0; k < k1; ++k) std::memcpy(out + (k - k0) * kNR, b.p + k * b.k_stride + j0, size_t(cols) * 2);
    return;
  }
  int64_t jj = 0;
  if (b.k_stride == 1) {  // each column's k contiguous: 8 x 8 transposes
    for (; jj + 8 <= cols; jj += 8) {
      const uint16_t* col = b.p + (j0 + jj) * b.j_stride;
      int64_t k = k0;
      for (; k + 8 <= k1; k += 8) {
        __m128i r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(col + i * b.j_stride + k));
        transpose8x8(r);
        for (int q = 0; q < 8; ++q) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (k - k0 + q) * kNR + jj), r[q]);
      }
      for (; k < k1; ++k)
        for (int i = 0; i < 8; ++i) out[(k - k0) * kNR + jj + i] = col[i * b.j_stride + k];
    }
  }
  for (; jj < cols; ++jj)
    for (int64_t k = k0; k < k1; ++k) out[(k - k0) * kNR + jj] = b.p[k * b.k_stride + (j0 + jj) * b.j_stride];
}

// Decodes rows [j0, j0 + cols) of a block-type weight w [N, K] at k [k0, k1) (block-aligned)
// into out[k - k0][jj] as f32 (columns from `cols` on zeros): each row's segment decoded into
// `rows` ([32][kc]), then transposed 8 x 8 in registers.
void pack_decoded_panel(const WeightRows& w, int64_t j0, int64_t cols, int64_t k0, int64_t k1, float* rows,
                        float* out) {
  const int64_t kc = k1 - k0;
  const size_t skip = row_bytes(w.type, k0);
  for (int64_t jj = 0; jj < kNR; ++jj) {
    float* r = rows + jj * kc;
    if (jj < cols)
      row_to_f32(w.type, w.p + size_t(j0 + jj) * w.row_bytes + skip, r, kc);
    else
      std::fill(r, r + kc, 0.0f);
  }
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8)
    for (int64_t jj = 0; jj < kNR; jj += 8) {
      __m256 t[8];
      for (int i = 0; i < 8; ++i) t[i] = _mm256_loadu_ps(rows + (jj + i) * kc + k);
      transpose8_ps(t);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (k + q) * kNR + jj, t[q]);
    }
  for (; k < kc; ++k)
    for (int64_t jj = 0; jj < kNR; ++jj) out[k * kNR + jj] = rows[jj * kc + k];
}

}  // namespace

void gemm_half(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const HalfOperand& b, float* c,
               int64_t ldc, bool accumulate) {
  TOY_CHECK(gemm_half_supports(b.type), "[gemm_half] b must be F16 or BF16, got {}", name(b.type));
  if (!nonempty(M, N, K, c, ldc, accumulate)) return;
  split_c(M, N, [&](int64_t p0, int64_t p1, int64_t i0, int64_t i1) {
    auto pack = [&](int64_t p, int64_t k0, int64_t k1, char* dst) {
      pack_panel(b, N, p * kNR, k0, k1, reinterpret_cast<uint16_t*>(dst));
    };
    const float* ai = a + i0 * lda;
    float* ci = c + i0 * ldc;
    if (b.type == DType::BF16)
      run_panels<Elem::BF16>(p0, p1, i1 - i0, N, K, RowsInPlace{ai, lda}, ci, ldc, accumulate, pack);
    else
      run_panels<Elem::F16>(p0, p1, i1 - i0, N, K, RowsInPlace{ai, lda}, ci, ldc, accumulate, pack);
  });
}

void gemm_weight_rows(int64_t M, const float* a, int64_t lda, const WeightRows& w, float* c, int64_t ldc,
                      bool accumulate) {
  const int64_t N = w.rows, K = w.cols;
  // (k blocks start at multiples of 256: on a block boundary of every type.)
  TOY_CHECK(is_block(w.type) && K % dtype_info(w.type).block_size == 0,
            "[gemm_weight_rows] needs a block type and whole blocks per row, got {} with {} columns", name(w.type), K);
  if (!nonempty(M, N, K, c, ldc, accumulate)) return;
  split_c(M, N, [&](int64_t p0, int64_t p1, int64_t i0, int64_t i1) {
    float* rows = scratch_floats(size_t(kNR * kKC), kSlotRows);
    run_panels<Elem::F32>(p0, p1, i1 - i0, N, K, RowsInPlace{a + i0 * lda, lda}, c + i0 * ldc, ldc, accumulate,
                          [&](int64_t p, int64_t k0, int64_t k1, char* dst) {
                            pack_decoded_panel(w, p * kNR, std::min<int64_t>(kNR, N - p * kNR), k0, k1, rows,
                                               reinterpret_cast<float*>(dst));
                          });
  });
}

}  // namespace toy::cpu
