// Products of a few activation rows with a stored-dtype weight, read straight from its
// blocks (see gemv_blocks.cpp). matmul_weight uses it for up to kGemvMaxRows rows.
#pragma once
#include <span>
#include "toy/core/tensor.h"

namespace toy::cpu {

inline constexpr int64_t kGemvMaxRows = 8;

// Whether gemv_blocks handles weights of type t (F16, BF16, Q8_0, Q4_0, Q5_0, Q2_K to Q6_K).
bool gemv_blocks_supports(DType t);
// The activation rounding the block products use (llama.cpp's Q8 blocks, with f32 scales):
// per block of 32, d = max|x| / 127 and q = round(x / d) (ties to even); sum16 holds the
// sums of each 16 q. A block with a NaN or infinity gets a non-finite scale (NaN or +-inf):
// its products come out NaN. K a multiple of 32.
// The activations of one row (K values) as llama.cpp rounds them for products with a weight
// of that type: Q8_0 (per 32, f16 scale) for the 32-block types, Q8_K (per 256) for the K
// types. d gets one scale per 32 values (a Q8_K block's repeated), q the values, sum16 the
// sums of every 16. K is a multiple of 32 (of 256 for the K types).
void quantize_activations(DType weight, const float* x, int64_t K, float* d, int8_t* q, int16_t* sum16);
bool activations_in_256s(DType weight);
// One Q8_0 block of activations: x's 32 values rounded into q; returns the block's scale.
float quantize_block_q8_0(const float* x, int8_t* q);
// Whether products with a weight of this type see rounded activations: F16, BF16 (rounded to
// that type, as llama.cpp converts them for its dot products) and the block types.
bool rounds_activations(DType weight);
// The rounding written back as floats (d * q for the block types), for products done in f32
// (prompts): F16/BF16 any K; the block types K as quantize_activations needs.
void round_activations(DType weight, const float* x, int64_t K, float* out);
// y [N, out] (+)= x [N, K] @ w [out, K]^T, N <= kGemvMaxRows; x and y f32 contiguous.
void gemv_blocks(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);
// Activation rows prepared once (rounded and packed as gemv_blocks prepares them for weights
// of one stored dtype) and then multiplied, a row at a time, by rows of any weight of that
// dtype and K, with gemv_blocks' arithmetic (so its bits): mul_mat_id's gathered products,
// where a decoding token's chosen experts all run in one parallel region.
class PreparedRows {
 public:
  // Prepares the rows of x [rows, K] that `needed` marks (all of them when it is empty), in
  // parallel; products may then be asked of those rows only.
  PreparedRows(DType weight, const float* x, int64_t rows, int64_t K, std::span<const uint8_t> needed = {});
  // y[r - r0] = x[row] . w[r] for r in [r0, r1); w the weight's row 0.
  void products(int64_t row, const uint8_t* w, int64_t r0, int64_t r1, float* y) const;

 private:
  void prepare(const float* x, uint8_t* out) const;  // one row
  DType weight_;
  int64_t K_;
  size_t row_bytes_;  // of one prepared row in buf_
  uint8_t* buf_;      // the prepared rows: the calling thread's scratch (slot 5)
};

// Q8_0/Q4_0/Q5_0 products use the CPU's VNNI dot when the kernel variant has one (the same
// bits as without); tests and benchmarks turn it off to compare.
bool gemv_vnni_available();
void gemv_use_vnni(bool on);

}  // namespace toy::cpu
