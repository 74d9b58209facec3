// The launchers of the recurrent kernels (scan.cu: the Mamba-2 scan and the gated delta rule;
// moe.cu: the per-token expert matmul), in plain types (glue_scan.cpp fills them from
// tensors). Layouts are the CPU kernels' (backend/cpu/ssm.cpp, gated_delta.cpp, moe.cpp): every
// pointer is a contiguous row-major F32 array unless said otherwise; "optional" pointers may
// be null. Scratch is device memory the glue allocates, of the size the *_scratch function gives.
#pragma once
#include <cstdint>

#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

// ---- ssm scan (Mamba-2) --------------------------------------------------------------------------

// x [B, T, H, P], dt [B, T, H], A [H], Bm and C [B, T, G, N] (head h reads group h / (H / G)),
// s0 [B, H, P, N] (optional: zeros).
struct SsmScanGeometry {
  int64_t B = 0, T = 0, H = 0, P = 0, G = 0, N = 0;
  const float *x = nullptr, *dt = nullptr, *A = nullptr, *Bm = nullptr, *C = nullptr, *s0 = nullptr;
};
// The largest state width N the kernels take (a warp holds a state row, 16 values a lane).
inline constexpr int64_t kSsmScanMaxN = 512;

// y [B, T, H, P], s_final [B, H, P, N].
void launch_ssm_scan(const SsmScanGeometry& g, float* y, float* s_final);
// Floats of scratch the backward needs.
int64_t ssm_scan_backward_scratch(const SsmScanGeometry& g);
// gy [B, T, H, P], gs [B, H, P, N] (optional); dx, ddt, dA, dB, dC "=", ds0 (optional) "=".
void launch_ssm_scan_backward(const SsmScanGeometry& g, const float* gy, const float* gs, float* dx, float* ddt,
                              float* dA, float* dB, float* dC, float* ds0, float* scratch);

// ---- gated delta rule (Gated DeltaNet) ----------------------------------------------------------

// q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv], s0 [B, Hv, Dk, Dv] (optional:
// zeros); V head h reads K head h % Hk.
struct GatedDeltaGeometry {
  int64_t B = 0, T = 0, Hk = 0, Hv = 0, Dk = 0, Dv = 0;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr, *s0 = nullptr;
};
// The largest Dk and Dv the kernels take (the state's column: 8 values a lane; the
// backward's block holds the whole [Dk, Dv] state in registers).
inline constexpr int64_t kGatedDeltaMaxHead = 256;
// Tokens between the states the forward records for the backward (kern::kGatedDeltaStateEvery).
inline constexpr int64_t kGatedDeltaEvery = 64;

// o [B, T, Hv, Dv] and s_final [B, Hv, Dk, Dv] (each optional), starts [B, Hv, ceil(T / 64),
// Dk, Dv] (optional): the state before every 64th token.
void launch_gated_delta_rule(const GatedDeltaGeometry& g, float* o, float* s_final, float* starts);
// Floats of scratch the backward needs.
int64_t gated_delta_rule_backward_scratch(const GatedDeltaGeometry& g);
// starts as the forward wrote them (required: the glue recomputes them when the op has none);
// go [B, T, Hv, Dv]; gs (optional) [B, Hv, Dk, Dv]; dq, dk, dv, dg, dbeta "=", ds0 (optional) "=".
void launch_gated_delta_rule_backward(const GatedDeltaGeometry& g, const float* starts, const float* go,
                                      const float* gs, float* dq, float* dk, float* dv, float* dg, float* dbeta,
                                      float* ds0, float* scratch);

// ---- MoE -----------------------------------------------------------------------------------------

// w [E, N, K] of element type w_elem (F32, F16 or BF16), x [T, X, K] (X = 1 or U), ids I32 [T, U].
struct MulMatIdGeometry {
  int64_t E = 0, N = 0, K = 0, T = 0, X = 0, U = 0;
  const void* w = nullptr;
  Elem w_elem = Elem::F32;
  const float* x = nullptr;
  const int32_t* ids = nullptr;
};

// out [T, U, N] = w[ids[t, u]] @ x[t, u or 0].
void launch_mul_mat_id(const MulMatIdGeometry& g, float* out);
// Ints of scratch the backward needs (the (t, u) pairs grouped by expert).
int64_t mul_mat_id_backward_scratch(const MulMatIdGeometry& g);
// g [T, U, N]; dx [T, X, K] "=" (optional), dw [E, N, K] F32 "+=" (optional).
void launch_mul_mat_id_backward(const MulMatIdGeometry& g, const float* grad, float* dx, float* dw,
                                int32_t* scratch);

}  // namespace toy::cuda
