// gemm_f32 (gemm_f32.h) on gemm_tiles.h's tiles. b is packed into f32 panels: copied where its
// k-rows lie contiguous (g W, g^T x), transposed 8 x 8 in registers where its columns do (x W^T:
// a weight's rows). a is read where it lies when its k are contiguous (x, g); otherwise (g^T in
// dW = g^T x) each block of 96 rows x up to 512 k is transposed into scratch before its tiles
// run, once per group of 8 panels. Few instructions, but in a training step g^T comes from L3:
// at cpu-medium's shapes dW runs ~15% below x W^T and g W (and below OpenBLAS's SkylakeX
// kernels; in the AVX2 forms matmul.cpp hands these products to OpenBLAS).
#include "toy/backend/cpu/gemm_f32.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "toy/backend/cpu/gemm_tiles.h"
#include "toy/backend/cpu/simd.h"

namespace toy::cpu {

using namespace gemm_tiles;

namespace {

// Below this many multiply-adds one thread does the whole product (sharing costs more).
constexpr double kShareFlops = 1 << 17;
// The threads split c's rows (each running all its panels) where each gets at least this many:
// each then reads only its own rows of a, which the op before wrote in the same split (its
// rows are in that core's caches: cpu-small training +3-6%, Xeon SPR), and packs only its own
// part where a is packed; but each packs all of b, so a's rows in place need more rows to pay
// for that. Fewer rows: threads split c's panels (split_c).
constexpr int64_t kRowsPerThread = 192, kPackedRowsPerThread = 48;

// Whether the tiles read a where it lies (its k contiguous), rather than packed.
bool rows_in_place(const F32Matrix& a, int64_t K) { return a.col_stride == 1 || K == 1; }

// out[k - k0][jj] = b(k, j0 + jj) for k in [k0, k1), jj < 32; columns from N on are zeros.
void pack_panel(const F32Matrix& b, int64_t N, int64_t K, int64_t j0, int64_t k0, int64_t k1, float* out) {
  const int64_t cols = std::min<int64_t>(kNR, N - j0);
  if (cols < kNR)
    for (int64_t k = k0; k < k1; ++k) std::fill(out + (k - k0) * kNR + cols, out + (k - k0 + 1) * kNR, 0.0f);
  if (b.col_stride == 1 || N == 1) {  // a k-row of columns lies contiguous
    for (int64_t k = k0; k < k1; ++k)
      std::memcpy(out + (k - k0) * kNR, b.p + k * b.row_stride + j0, size_t(cols) * sizeof(float));
    return;
  }
  int64_t jj = 0;
  if (b.row_stride == 1 || K == 1) {  // each column's k contiguous: 8 x 8 transposes
    for (; jj + 8 <= cols; jj += 8) {
      const float* col = b.p + (j0 + jj) * b.col_stride;
      int64_t k = k0;
      for (; k + 8 <= k1; k += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(col + i * b.col_stride + k);
        transpose8_ps(r);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (k - k0 + q) * kNR + jj, r[q]);
      }
      for (; k < k1; ++k)
        for (int i = 0; i < 8; ++i) out[(k - k0) * kNR + jj + i] = col[i * b.col_stride + k * b.row_stride];
    }
  }
  for (; jj < cols; ++jj)
    for (int64_t k = k0; k < k1; ++k) out[(k - k0) * kNR + jj] = b.p[k * b.row_stride + (j0 + jj) * b.col_stride];
}

// k blocks of up to 512, of even sizes (768 = 2 x 384): c is loaded and stored once per block,
// and at training's widths one block takes all of k; the panel streams from L2 at this size.
// Measured against 256 (gemm_half's) on a Sapphire Rapids Xeon: cpu-medium's products +6%,
// cpu-small's the same.
constexpr Blocking kF32Blocking{512, kGroup, true};
// Row stride of a packed block of a.
constexpr int64_t kPackedLda = kF32Blocking.kc_max;

// Sums of a's rows along k, taken as a is read, in Reduce's order for a sum over the rows of
// a [K, M] tensor (aᵀ: g, whose column sums are a bias's gradient): runs of 64 k summed in
// f32 from 0, each run's sum added in double, the total rounded to f32. So they have the bits
// of `sum(g, 0)`. Rows [row0, row0 + run.size()).
struct RowSums {
  int64_t row0 = 0, K = 0;
  std::vector<float> run;
  std::vector<double> total;
  RowSums(int64_t first, int64_t rows, int64_t k) : row0(first), K(k), run(size_t(rows), 0.0f), total(size_t(rows), 0.0) {}
  // Row i has taken its k up to `k_end` (exclusive): a run ends there at a multiple of 64 or K.
  void ran_to(int64_t i, int64_t k_end) {
    if (k_end % 64 != 0 && k_end != K) return;
    total[size_t(i - row0)] += double(run[size_t(i - row0)]);
    run[size_t(i - row0)] = 0.0f;
  }
  void add(int64_t i, int64_t k, float v) {
    run[size_t(i - row0)] += v;
    ran_to(i, k + 1);
  }
  // Rows [i0, i1) of a, every k, where no packing passes them (a read in place, or no product).
  void add_rows(const F32Matrix& a, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = 0; k < K; ++k) add(i, k, a.p[i * a.row_stride + k * a.col_stride]);
  }
  void write(float* out) const {
    for (size_t i = 0; i < total.size(); ++i) out[size_t(row0) + i] = float(total[i]);
  }
};

// out[ii * kPackedLda + kk] = a(i0 + ii, k0 + kk): a block of a whose k are not contiguous,
// transposed 8 x 8 in registers where its rows are (a = g^T), element by element otherwise;
// with `sums`, each element also added to its row's sum as it passes.
void pack_a_block(const F32Matrix& a, int64_t i0, int64_t i1, int64_t k0, int64_t k1, float* out, RowSums* sums) {
  const int64_t rows = i1 - i0, kc = k1 - k0;
  int64_t ii = 0;
  if (a.row_stride == 1) {
    for (; ii + 8 <= rows; ii += 8) {
      float* run = sums ? sums->run.data() + (i0 + ii - sums->row0) : nullptr;
      int64_t kk = 0;
      for (; kk + 8 <= kc; kk += 8) {
        __m256 r[8];
        for (int q = 0; q < 8; ++q) r[q] = _mm256_loadu_ps(a.p + (k0 + kk + q) * a.col_stride + i0 + ii);
        if (sums) {  // (8 rows at once, each k in order; a run can end only after the 8th: k0 + kk is a multiple of 8)
          __m256 s = _mm256_loadu_ps(run);
          for (int q = 0; q < 8; ++q) s = _mm256_add_ps(s, r[q]);
          _mm256_storeu_ps(run, s);
          for (int q = 0; q < 8; ++q) sums->ran_to(i0 + ii + q, k0 + kk + 8);
        }
        transpose8_ps(r);
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (ii + q) * kPackedLda + kk, r[q]);
      }
      for (; kk < kc; ++kk)
        for (int q = 0; q < 8; ++q) {
          const float v = a.p[(k0 + kk) * a.col_stride + i0 + ii + q];
          out[(ii + q) * kPackedLda + kk] = v;
          if (sums) sums->add(i0 + ii + q, k0 + kk, v);
        }
    }
  }
  for (; ii < rows; ++ii)
    for (int64_t kk = 0; kk < kc; ++kk) {
      const float v = a.p[(i0 + ii) * a.row_stride + (k0 + kk) * a.col_stride];
      out[ii * kPackedLda + kk] = v;
      if (sums) sums->add(i0 + ii, k0 + kk, v);
    }
}

// Panels [p0, p1) of c over rows [i0, i1); with row_sums, a's rows [i0, i1) summed into it
// where this part has panel 0 (one part per row does).
void run_part(int64_t N, int64_t K, const F32Matrix& a, const F32Matrix& b, float* c, int64_t ldc,
              bool accumulate, const float* bias, float* row_sums, int64_t p0, int64_t p1, int64_t i0, int64_t i1) {
  auto pack = [&](int64_t p, int64_t k0, int64_t k1, char* dst) {
    pack_panel(b, N, K, p * kNR, k0, k1, reinterpret_cast<float*>(dst));
  };
  float* ci = c + i0 * ldc;
  std::optional<RowSums> sums;
  if (row_sums && p0 == 0) sums.emplace(i0, i1 - i0, K);
  if (rows_in_place(a, K)) {
    run_panels<Elem::F32, kF32Blocking>(p0, p1, i1 - i0, N, K, RowsInPlace{a.p + i0 * a.row_stride, a.row_stride}, ci,
                                        ldc, accumulate, pack, bias);
    if (sums) {  // (not a bias's gradient: summed apart)
      sums->add_rows(a, i0, i1);
      sums->write(row_sums);
    }
    return;
  }
  float* block = scratch_floats(size_t(kMC * kPackedLda), kSlotRows);
  auto packed_rows = [&](int64_t r0, int64_t r1, int64_t k0, int64_t k1,
                         bool first) -> std::pair<const float*, int64_t> {
    pack_a_block(a, i0 + r0, i0 + r1, k0, k1, block, first && sums ? &*sums : nullptr);
    return {block, kPackedLda};
  };
  run_panels<Elem::F32, kF32Blocking>(p0, p1, i1 - i0, N, K, packed_rows, ci, ldc, accumulate, pack, bias);
  if (sums) sums->write(row_sums);
}

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, const F32Matrix& a, const F32Matrix& b, float* c, int64_t ldc,
              bool accumulate, const float* bias, float* a_row_sums) {
  if (accumulate) bias = nullptr;
  if (a_row_sums && M > 0 && (K <= 0 || N <= 0)) {  // (no part runs: the sums apart)
    RowSums sums(0, M, K);
    sums.add_rows(a, 0, M);
    sums.write(a_row_sums);
  }
  if (K <= 0 && bias && M > 0 && N > 0)
    for (int64_t i = 0; i < M; ++i) std::copy(bias, bias + N, c + i * ldc);
  if (!nonempty(M, N, K, c, ldc, accumulate || bias)) return;
  if (double(M) * double(N) * double(K) < kShareFlops || in_parallel_region()) {
    run_part(N, K, a, b, c, ldc, accumulate, bias, a_row_sums, 0, (N + kNR - 1) / kNR, 0, M);
    return;
  }
  const int64_t threads = num_threads();
  if (M >= (rows_in_place(a, K) ? kRowsPerThread : kPackedRowsPerThread) * threads) {
    // (Parts of whole tiles.)
    const int64_t rows = ((M + threads - 1) / threads + kMR512 - 1) / kMR512 * kMR512;
    const int64_t panels = (N + kNR - 1) / kNR;
    parallel_for(0, (M + rows - 1) / rows, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        run_part(N, K, a, b, c, ldc, accumulate, bias, a_row_sums, 0, panels, t * rows, std::min(M, (t + 1) * rows));
    });
    return;
  }
  split_c(M, N, [&](int64_t p0, int64_t p1, int64_t i0, int64_t i1) {
    run_part(N, K, a, b, c, ldc, accumulate, bias, a_row_sums, p0, p1, i0, i1);
  });
}

}  // namespace toy::cpu
