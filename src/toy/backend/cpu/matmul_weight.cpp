// Products with weights stored in their file's dtype (F16, BF16, GGUF block types), no f32
// copy of a whole matrix ever made. The activations are first rounded as llama.cpp rounds them
// for that weight type (8-bit blocks, f16 or bf16: gemv_blocks.h). Which kernel multiplies:
// - a few rows (decoding): gemv_blocks, dot products straight from the blocks;
// - Q8_0/Q4_0/Q5_0 (and Q2_K..Q6_K), any number of rows where the CPU allows: integer
//   products (quant_products.h, kquant_products.h);
// - BF16 with many rows, where the CPU has BF16 products: gemm_bf16;
// - F16 and BF16 otherwise, and the backward through them: gemm_half (widened in registers);
// - block types otherwise (AVX2 prompts): gemm_weight_rows, the same tiles on decoded panels;
// - the backward through block types: W's rows widened to f32 a tile at a time into
//   per-thread scratch, then SGEMM, splitting x's rows across threads.
// Deterministic for a thread count.
#include <cblas.h>

#include <algorithm>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/gemm_bf16.h"
#include "toy/backend/cpu/gemm_half.h"
#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/kquant_products.h"
#include "toy/backend/cpu/quant_products.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
constexpr int64_t kTileRows = 64;
constexpr int kSlot = 5;         // scratch slot of the widened tiles (the other kernels use 0..4)
constexpr int kRoundedSlot = 6;  // the rounded activations

// Widens rows [r0, r1) of w into buf (row-major f32, in values per row).
void widen_rows(const Tensor& w, int64_t r0, int64_t r1, float* buf) {
  const int64_t in = w.size(1);
  const size_t rb = row_bytes(w.dtype(), in);
  const char* base = static_cast<const char*>(w.raw_data());
  for (int64_t r = r0; r < r1; ++r) row_to_f32(w.dtype(), base + size_t(r) * rb, buf + (r - r0) * in, in);
}
}  // namespace

void matmul_weight(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t N = x.size(0), in = w.size(1), out = w.size(0);
  // Q8_0/Q4_0/Q5_0: integer products for any number of rows where the CPU has VNNI (prompts
  // then get decoding's numbers); without, prompts take gemm_weight_rows below (faster there).
  if (quant_products_supports(w.dtype()) && (N <= kGemvMaxRows || quant_products_for_prompts()))
    return quant_products(x, w, y, accumulate);
  // Q2_K..Q6_K (kquant_products.h): the same integer arithmetic for any number of rows (llama.cpp's).
  if (kquant_supports(w.dtype()) && w.size(1) % 256 == 0 && (N <= kGemvMaxRows || kquant_for_prompts()))
    return kquant_products(x, w, y, accumulate);
  if (N <= kGemvMaxRows && gemv_blocks_supports(w.dtype())) return gemv_blocks(x, w, y, accumulate);
  // y = x W^T: x's rows rounded to bf16 as they are packed (round_activations' rounding), W^T
  // read k-contiguous.
  if (w.dtype() == DType::BF16 && gemm_bf16_available())
    return gemm_bf16(N, out, in, {x.data<float>(), false, in, 1}, {w.raw_data(), true, 1, in}, y.data<float>(), out,
                     accumulate);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  // The activations are rounded as in the few-row path (and as llama.cpp rounds them), so a
  // model computes the same function whatever the number of rows.
  if (rounds_activations(w.dtype())) {
    float* rp = scratch_floats(size_t(N * in), kRoundedSlot);  // the calling thread's
    parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) round_activations(w.dtype(), xp + n * in, in, rp + n * in);
    });
    xp = rp;
  }
  if (gemm_half_supports(w.dtype()))
    return gemm_half(N, out, in, xp, in, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), 1, in}, yp, out,
                     accumulate);
  if (is_block(w.dtype()))
    return gemm_weight_rows(N, xp, in, {static_cast<const uint8_t*>(w.raw_data()), w.dtype(), out, in, row_bytes(w.dtype(), in)},
                            yp, out, accumulate);
  // (linear_stored hands over F16, BF16 and block types only: an F32 weight goes to matmul.)
  fail("[matmul_weight] no product for {} weights", name(w.dtype()));
}

void matmul_weight_t(const Tensor& g, const Tensor& w, Tensor& dx) {
  const int64_t N = g.size(0), in = w.size(1), out = w.size(0);
  const float* gp = g.data<float>();
  float* dp = dx.data<float>();
  // dx = g W: W's rows are k-rows here.
  if (gemm_half_supports(w.dtype()))
    return gemm_half(N, in, out, gp, out, {static_cast<const uint16_t*>(w.raw_data()), w.dtype(), in, 1}, dp, in,
                     false);
  float* buf = scratch_floats(size_t(kTileRows * in), kSlot);
  for (int64_t r0 = 0; r0 < out; r0 += kTileRows) {
    const int64_t r1 = std::min(out, r0 + kTileRows);
    widen_rows(w, r0, r1, buf);
    // dx [rows of x] (+)= g[rows, r0:r1] @ tile [r1 - r0, in]
    parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n1 - n0), int(in), int(r1 - r0), 1.0f,
                  gp + n0 * out + r0, int(out), buf, int(in), r0 == 0 ? 0.0f : 1.0f, dp + n0 * in, int(in));
    });
  }
}

}  // namespace toy::cpu
