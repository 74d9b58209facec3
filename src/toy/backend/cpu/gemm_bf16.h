// Products of BF16 operands on the CPU's BF16 arithmetic (cpu_features.h, Bf16Products): AMX
// tiles (16 x 16 f32 results from 16 x 32 by 32 x 16 bf16 tiles per instruction) or AVX512-BF16's
// vdpbf16ps (per f32 lane, two bf16 products added to the accumulator). Mixed-precision
// training's three products per projection and the prompts of BF16 weights run on it where the
// CPU has either.
//
// What it computes: c = a @ b (+ c), each operand rounded to bf16 as it is packed unless it is
// bf16 already (f32_to_bf16's rounding, the cast's: nearest even, NaNs quieted), every product exact in f32 and the sums in f32, along k in
// a fixed order per form, so the bits depend on neither the thread count nor how c is split
// (they do on the form: the sums' orders differ). As the instructions do, bf16 values below
// the smallest normal (|x| < 2^-126) count as zero and so do subnormal partial sums (the f32
// path keeps them; a difference below 1e-38 per product).
#pragma once
#include <cstdint>

#include "toy/core/cpu_features.h"

namespace toy::cpu {

// One operand: element (r, c) at p + r * row_stride + c * col_stride (in elements), f32
// (rounded to bf16 as it is packed) or bf16 bits.
struct Bf16Operand {
  const void* p = nullptr;
  bool is_bf16 = false;
  int64_t row_stride = 0, col_stride = 0;
};

// Whether gemm_bf16 runs here: the avx512 kernel variant (TOY_CPU=avx2 turns it off) on a CPU
// with AMX or (AMD since Zen 4) AVX512-BF16: bf16_products() of cpu_features.h is not Widened.
bool gemm_bf16_available();

// c [M, N] (row stride ldc, f32) = a [M, K] @ b [K, N], plus c's values when accumulate.
// Threads split c. `form` (tests) must be one this CPU has; call only where
// gemm_bf16_available().
void gemm_bf16(int64_t M, int64_t N, int64_t K, const Bf16Operand& a, const Bf16Operand& b, float* c, int64_t ldc,
               bool accumulate, Bf16Products form = bf16_products());

}  // namespace toy::cpu
