// Products of f32 rows with a matrix of half-precision values (F16 or BF16 bits), the halves
// widened to f32 in registers as the tiles read them: the prompts of F16 weights everywhere and
// of BF16 weights where the CPU has no BF16 products (gemm_bf16.h), and the backward through
// such frozen weights. No f32 copy of the weight is made, and no BLAS runs, so the speed does
// not depend on which kernels OpenBLAS picks for the CPU (or is told to: OPENBLAS_CORETYPE).
//
// What it computes: each c(i, j) is one chain of f32 fused multiply-adds along k in order,
// starting from 0 (or from c's value when accumulating): c = fma(a(i, k), b(k, j), c) for
// k = 0, 1, ..., K - 1. So its bits are the same for every thread count, every split of c,
// and both forms (AVX-512: tiles of 12 x 32; AVX2: 6 x 16; variant.h picks), and a test can
// recompute them with std::fma.
#pragma once
#include <cstdint>

#include "toy/core/dtype.h"

namespace toy::cpu {

// b as stored: element (k, j) at p[k * k_stride + j * j_stride] (in elements), of type F16 or
// BF16. A weight [out, in] multiplied as x W^T is {p, t, 1, in}; as g W, {p, t, in, 1}.
struct HalfOperand {
  const uint16_t* p = nullptr;
  DType type = DType::F16;
  int64_t k_stride = 0, j_stride = 0;
};

inline bool gemm_half_supports(DType t) { return t == DType::F16 || t == DType::BF16; }

// c [M, N] (row stride ldc) = a [M, K] (f32, row stride lda) @ b [K, N], plus c's values when
// accumulate. Threads split c's columns.
void gemm_half(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const HalfOperand& b, float* c,
               int64_t ldc, bool accumulate);

// A weight [rows, cols] of a GGUF block type as stored: row r at p + r * row_bytes.
struct WeightRows {
  const uint8_t* p = nullptr;
  DType type = DType::Q8_0;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
};

// c [M, rows] (+)= a [M, cols] @ W^T for a block-type weight (whole blocks per row): the same
// tiles, on panels of W's rows decoded to f32 as they are packed (row_to_f32's values), so the
// same promise: each c(i, j) one FMA chain along k in order. For prompts where the CPU has no
// integer products for the type (AVX2: Zen 3), instead of SGEMM over widened tiles.
void gemm_weight_rows(int64_t M, const float* a, int64_t lda, const WeightRows& w, float* c, int64_t ldc,
                      bool accumulate);

}  // namespace toy::cpu
