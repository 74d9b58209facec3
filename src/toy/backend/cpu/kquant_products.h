// Products with the K-quant weight types (Q2_K to Q6_K) and activations rounded to Q8_K, in
// llama.cpp's AVX2 arithmetic (see kquant_products.cpp), for one activation row (decoding,
// gemv_blocks) or many (prompts): every row gets the same bits however many ran together.
#pragma once
#include <cstdint>

#include "toy/core/tensor.h"

namespace toy::cpu {

// One activation row rounded to Q8_K (gemv_blocks.h's quantize_activations): its scale per 32
// values (a block of 256's, repeated), its values, the sums of each 16.
struct Q8Row {
  const float* d;        // [K / 32]
  const int8_t* q;       // [K]
  const int16_t* sum16;  // [K / 16]
};

bool kquant_supports(DType t);
// Whether prompts (more than kGemvMaxRows rows) take kquant_products, else f32 tiles over the
// decoded weight (gemm_weight_rows; the activations rounded the same way): where the kernel
// variant is avx512; a test hook turns it off.
bool kquant_for_prompts();
void kquant_use_for_prompts(bool on);
// w's row (K values of type t) dotted with x.
float kquant_dot(DType t, const uint8_t* w, const Q8Row& x, int64_t K);
// y [N, out] (+)= x [N, K] @ w [out, K]^T for any N: the activations rounded to Q8_K, then
// tiles of weight rows x activation rows, each pair's arithmetic kquant_dot's.
void kquant_products(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);

}  // namespace toy::cpu
