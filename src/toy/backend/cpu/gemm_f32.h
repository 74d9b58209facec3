// f32 products on toy's own tiles (gemm_tiles.h), no BLAS: the matmuls of f32 training
// (forward x W^T, backward g W and g^T x) and every other f32 matmul on the CPU.
//
// What it computes: each c(i, j) is one chain of f32 fused multiply-adds along k in order,
// starting from 0 (or from c's value when accumulating), as gemm_half does. So its bits are the
// same for every thread count, every split of c, every batch schedule and both forms (AVX-512
// and AVX2): a training run's products do not depend on the CPU kind or the threads, and a test
// recomputes them with std::fma.
#pragma once
#include <cstdint>

namespace toy::cpu {

// An f32 matrix as stored: element (r, col) at p[r * row_stride + col * col_stride] (in
// elements; any strides, a transposed view included).
struct F32Matrix {
  const float* p = nullptr;
  int64_t row_stride = 0, col_stride = 0;
};

// c [M, N] (row stride ldc) = a [M, K] @ b [K, N], plus c's values when accumulate, else plus
// `bias` (N values, added to every row) where given: each sum starts from c's value or the
// bias, so a bias gives the bits of c preset to it and accumulated, without that pass over c.
// With a_row_sums (M values), also each row of a summed along k as Reduce sums the rows of the
// [K, M] tensor aᵀ (runs of 64 k in f32, added in double): for dW = gᵀ x, g's column sums (a
// bias's gradient) taken as gᵀ is packed, not in another pass over g.
// Threads split c (unless called inside a parallel job, or the product is too small to share).
void gemm_f32(int64_t M, int64_t N, int64_t K, const F32Matrix& a, const F32Matrix& b, float* c, int64_t ldc,
              bool accumulate, const float* bias = nullptr, float* a_row_sums = nullptr);

}  // namespace toy::cpu
