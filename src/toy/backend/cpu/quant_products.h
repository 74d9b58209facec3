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
// against four f32 FMAs, so an AVX2-only CPU (Zen 3) multiplies prompts faster through f32
// tiles over decoded weights (gemm_weight_rows, gemm_half.h; then SGEMM over widened tiles):
// measured on Zen 4 forced to AVX2, SmolLM2 Q8_0 prompts 491 tokens/s through these tiles
// against ~620 through SGEMM.
bool quant_products_for_prompts();
// y [N, out] (+)= x [N, K] @ w [out, K]^T; x and y f32 contiguous, K a multiple of 32.
void quant_products(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);

// One activation row packed alone (decoding's layout) for quant_lone_row_products, which
// multiplies it by any rows of any weight of that K: mul_mat_id's gathered products. The
// arithmetic is quant_products' (the same bits as a row of any product).
size_t quant_lone_row_bytes(int64_t K);
void quant_pack_lone_row(const float* x, int64_t K, uint8_t* out);
// y[r - r0] = packed . w[r] for r in [r0, r1); w the weight's row 0.
void quant_lone_row_products(DType t, const uint8_t* packed, const uint8_t* w, int64_t K, int64_t r0, int64_t r1,
                             float* y);

}  // namespace toy::cpu
