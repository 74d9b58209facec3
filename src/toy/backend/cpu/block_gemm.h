// Small single-threaded GEMMs for the tiles of fused attention (16 query rows x a key chunk
// of up to 256, head dims of 64-256): in cache, too small for BLAS to pack, and run by each
// thread on its own tile. Register tiles of 6 rows x 64 columns (AVX-512) or 6 x 16 (AVX2).
//
// C[i, j] = alpha * sum_k A(i, k) B[k, j] + beta * C[i, j], with A(i, k) = a[i * lda + k]
// (trans_a false) or a[k * lda + i] (true); B and C row-major with leading dims ldb, ldc.
// beta 0: C is not read (may hold garbage, NaN included).
//
// Every element is one chain of FMAs over k = 0, 1, ... from 0, then scaled: fma(acc,
// alpha, beta * C) (alpha * acc when beta is 0). Its bits depend on nothing else — not the
// tile, the vector width or the CPU — so both forms, and any split of the work, agree.
#pragma once
#include <cstdint>

namespace toy::cpu {

void block_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace toy::cpu
