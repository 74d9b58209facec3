// Which form of the float kernels runs: the AVX-512 forms (simd512.h) under the avx512 kernel
// variant (cpu_features.h, TOY_CPU), else the AVX2 forms. Both give the same bits.
#pragma once

namespace toy::cpu {

// Read once from kernel_variant(); cheap enough for every row loop.
bool avx512_forms();
// Tests: run the AVX2 forms (false) or go back to the variant's (true) in this process.
void use_avx512_forms(bool on);

}  // namespace toy::cpu
