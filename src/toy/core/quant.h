// GGUF block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K): the byte layouts of
// ggml-common.h, decoded and encoded row by row (Q2_K and Q3_K decode only). See ../shared/docs/GGUF.md §4 for the layouts. These are the
// portable reference codecs; fast quantized dot products live in the CPU backend.
#pragma once
#include <cstdint>

#include "toy/core/dtype.h"

namespace toy {

// Decodes n elements (a multiple of the block size) of block data into f32.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Any stored row (F32, F16, BF16 or a block type) as n f32 values.
void row_to_f32(DType t, const void* src, float* dst, int64_t n);
// Encodes n f32 elements into blocks of type t.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace toy
