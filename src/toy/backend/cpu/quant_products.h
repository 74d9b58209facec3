// Products of activation rows with weights in the 32-value block types (Q8_0, Q4_0, Q5_0),
// any number of rows: decoding (a few rows) and prompts (hundreds) run the same arithmetic
// (see quant_products.cpp), so a model's numbers do not depend on how many rows were
// multiplied together, nor on the CPU's kernel variant.
#pragma once
#include "toy/core/tensor.h"

namespace toy::cpu {

// Whether quant_products handles weights of type t.
bool quant_products_supports(DType t);
// Whether prompts (more than kGemvMaxRows rows) should take quant_products too: where the
// CPU has a VNNI dot product. AVX2's multiply-adds need six instructions per 32 products
// against SGEMM's four FMAs, so an AVX2-only CPU (Zen 3) multiplies prompts faster through
// SGEMM over widened tiles (matmul_weight.cpp): measured on Zen 4 forced to AVX2, SmolLM2
// Q8_0 prompts 491 tokens/s through these tiles against ~620 through SGEMM.
bool quant_products_for_prompts();
// y [N, out] (+)= x [N, K] @ w [out, K]^T; x and y f32 contiguous, K a multiple of 32.
void quant_products(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);

}  // namespace toy::cpu
