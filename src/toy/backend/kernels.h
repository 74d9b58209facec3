// The backend interface: one signature per primitive kernel. A backend registers a function
// of exactly this type under the kernel's name (backend/cpu/install.cpp); ops call it through
// a KernelRef. Conventions for every kernel:
//  - inputs may be strided views unless a comment says "contiguous"; outputs are
//    contiguous, freshly allocated by the op, on the same device as the inputs;
//  - shapes and dtypes were checked by the op: kernels do not re-validate;
//  - "=" outputs are overwritten; gradients marked "+=" are accumulated;
//  - Unary and Binary may be given their first input as the output (same contiguous
//    layout): the in-place ops add_ and scale_ do that.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "toy/core/arena_range.h"
#include "toy/core/lr_schedule.h"
#include "toy/core/sampling.h"
#include "toy/core/tensor.h"

namespace toy::kern {

// ---- elementwise ------------------------------------------------------------------------
enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Rsqrt, Square, Abs, Tanh, Sigmoid, Relu, Silu, GeluTanh, GeluErf, Scale, Clamp, Softplus,
};
struct UnaryArgs {
  float alpha = 1.0f;  // Scale: factor
  float lo = 0.0f, hi = 0.0f;  // Clamp bounds
};
// y = op(x); x and y same shape and dtype (F32/F16/BF16).
using Unary = void(UnaryOp op, const Tensor& x, Tensor& y, const UnaryArgs& a);
// dx = g * op'(x) (uses y = op(x) where cheaper); x, y, g same shape.
using UnaryBackward = void(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& g, Tensor& dx,
                           const UnaryArgs& a);

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
// out = a op b; a and b are already broadcast (zero strides) to out's shape.
using Binary = void(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out);

// dst = src converted to dst's dtype (any layout on both sides, same shape; dst may be a view).
// Block-type sources are dequantized (src contiguous); block-type destinations quantized.
using Copy = void(const Tensor& src, Tensor& dst);
// Every element of dst (any layout) = value.
using Fill = void(Tensor& dst, double value);
// Random fill of a contiguous float tensor from Philox(seed, stream, counter + i / per), per
// = 2 (normal: Box-Muller from words 2(i%2), 2(i%2)+1) or 4 (uniform in [a, b) from word i%4);
// element i depends only on the arguments and i (core/rng.h).
struct RandomFillArgs {
  uint64_t seed = 0, stream = 0, counter = 0;
  bool normal = false;
  float a = 0, b = 1;  // mean and std, or lo and hi
};
using RandomFill = void(Tensor& dst, const RandomFillArgs& a);
// dst[i] = i (a [n] tensor of F32/F16/BF16/I32).
using Arange = void(Tensor& dst);

// Packed rows: x [rows, 2F] -> out [rows, F] = silu(x[:, :F]) * x[:, F:] (x contiguous).
using SwigluPacked = void(const Tensor& x, Tensor& out);
// dx [rows, 2F] from x and g [rows, F].
using SwigluPackedBackward = void(const Tensor& x, const Tensor& g, Tensor& dx);
// out = silu(a) * b (a, b, out same shape).
using Swiglu = void(const Tensor& a, const Tensor& b, Tensor& out);
// da = g * b * silu'(a), db = g * silu(a).
using SwigluBackward = void(const Tensor& a, const Tensor& b, const Tensor& g, Tensor& da, Tensor& db);

// y = x * keep / (1 - p), keep drawn from Philox(seed, stream, counter + i / 4) > p, where
// counter also counts from step * 2^32 when `step` (an I32 device scalar: the training step,
// advanced by a kernel) is given. The same call with x = g gives the backward (the mask is
// recomputed, never stored).
struct DropoutArgs {
  float p;
  uint64_t seed, stream, counter;
  const Tensor* step = nullptr;
};
using Dropout = void(const Tensor& x, Tensor& y, const DropoutArgs& a);

// ---- matmul -----------------------------------------------------------------------------
// c = alpha * a @ b + beta * c. a [..., M, K], b [..., K, N], c [..., M, N] (c contiguous);
// batch dims of a and b already broadcast to c's. a and b may be transposed views (either
// of their last two strides 1); float dtypes, computed in f32.
using Matmul = void(const Tensor& a, const Tensor& b, Tensor& c, float alpha, float beta);
// c [M, N] = a [M, K] @ b [K, N] + bias [N] on every row, all f32 (a and b 2-d, either a
// transposed view; bias contiguous): each sum starts from the bias, so c has the bits of Matmul
// on c preset to the bias with beta 1, without that pass over c. A linear layer's forward; a
// backend without it gets the bias copied into c and Matmul.
using MatmulBias = void(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c);
// c [M, N] = a [M, K] @ b [K, N] and sums [M] = a's rows summed along k, with the bits of
// Reduce's sum of the [K, M] tensor aᵀ over its axis 0; all f32 (a and b 2-d, either a
// transposed view; c and sums contiguous). A linear layer's weight and bias gradients (gᵀ x and
// g summed over the tokens) from one read of g; a backend without it gets Matmul and Reduce.
using MatmulRowSums = void(const Tensor& a, const Tensor& b, Tensor& c, Tensor& sums);
// Products with a weight matrix stored in any dtype toy reads (F16, BF16, GGUF blocks), the
// activations in f32: y [N, out] = x [N, in] W^T (+ y when accumulate), W [out, in] contiguous.
using MatmulWeight = void(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);
// dx [N, in] = g [N, out] W: the backward of MatmulWeight with respect to x.
using MatmulWeightT = void(const Tensor& g, const Tensor& w, Tensor& dx);
// Whether Matmul multiplies two operands of type t (F16 or BF16) as they are, faster than their
// f32 widenings (a GPU's tensor cores; a CPU's BF16 dot product). Mixed precision then hands
// it operands of that type, else f32 operands holding the rounded values.
using MatmulTakesHalf = bool(DType t);
// c [M, N] (f32) = round(a) @ round(b): a [M, K] and b [K, N] 2-d (either may be a transposed
// view), each f32 (rounded to t as it is read: what cast does) or already of type t. Mixed
// precision's backward products without the casts' passes over the activations (called where
// MatmulTakesHalf(t); a backend without it gets the casts and Matmul).
using MatmulRounded = void(const Tensor& a, const Tensor& b, DType t, Tensor& c);

// ---- reductions -------------------------------------------------------------------------
enum class ReduceOp : uint8_t { Sum, Max };
// out[..., j...] = reduce over `axis` of x. out has x's shape without `axis`. For Max,
// `index` (I32, same shape as out) receives the position of the first maximum.
using Reduce = void(ReduceOp op, const Tensor& x, int axis, Tensor& out, Tensor* index);
// Along the last axis: indices (I32) that sort x (stable), ascending or descending.
using Argsort = void(const Tensor& x, bool descending, Tensor& indices);
// Along the last axis: the k largest values, in descending order, and their indices.
using TopK = void(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);

// ---- norms (over the last axis; rows = all other dims; x contiguous) --------------------
// y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). w may be undefined (all ones).
using RmsNorm = void(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd);
// dx = ; dw += (when dw defined).
using RmsNormBackward = void(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx,
                             Tensor& dw);
using LayerNorm = void(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd);
using LayerNormBackward = void(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                               const Tensor& g, Tensor& dx, Tensor& dw, Tensor& db);
// y = x / max(||x||, eps); inv = 1 / max(||x||, eps) per row.
using L2Norm = void(const Tensor& x, float eps, Tensor& y, Tensor& inv);
using L2NormBackward = void(const Tensor& x, const Tensor& y, const Tensor& inv, float eps, const Tensor& g,
                            Tensor& dx);

// ---- softmax (last axis; x contiguous) ----------------------------------------------------
// z = x * scale + mask (mask undefined, or broadcast to x's shape by zero strides);
// y = softmax(z) or log_softmax(z).
using Softmax = void(const Tensor& x, const Tensor& mask, float scale, bool log, Tensor& y);
// dz from y and g: softmax: y * (g - sum(g*y)); log_softmax: g - exp(y) * sum(g).
using SoftmaxBackward = void(const Tensor& y, const Tensor& g, bool log, Tensor& dz);
// y = x with x[..., i, j] = value where j > n_past + i (last two dims).
using DiagMask = void(const Tensor& x, int64_t n_past, float value, Tensor& y);

// ---- rope ---------------------------------------------------------------------------------
struct RopeArgs {
  int n_dims = 0;  // rotated leading dims of each head (<= head dim)
  int64_t heads_begin = 0, heads_end = -1;  // heads [begin, end) rotate, others are copied (-1 = all)
  bool neox = false;  // halves layout (x[i], x[i + n/2]) instead of adjacent pairs
  float freq_base = 10000.0f, freq_scale = 1.0f;
  float ext_factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
  int n_ctx_orig = 0;
  bool inverse = false;  // rotate by -theta (the backward)
};
// x [B, T, H, D] (any strides), pos I32 [T] or [B, T], freq_factors F32 [n_dims/2] or undefined.
using Rope = void(const Tensor& x, const Tensor& pos, const Tensor& freq_factors, const RopeArgs& a, Tensor& y);

// ---- attention ----------------------------------------------------------------------------
struct AttentionArgs {
  float scale = 1.0f;
  bool causal = true;  // key j visible to query i iff j <= i + (S - T)
  int64_t window = 0;  // and, when > 0, i + (S - T) - j < window (a sliding window)
};
// q [B, T, H, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv] with last stride 1; segments I32 [B, T]
// (T == S) or undefined: key j is visible only within the query's segment.
// out [B, T, H, Dv]; lse F32 [B, H, T] (log-sum-exp of scaled scores, for the backward).
using Attention = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segments,
                       const AttentionArgs& a, Tensor& out, Tensor& lse);
// dq/dk/dv: [B, T, H, D] etc. with unit last stride, head stride D and batch stride T rows
// (contiguous tensors, or views into one packed [B, T, H + 2Hkv, D] gradient); "=".
using AttentionBackward = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segments,
                               const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionArgs& a,
                               Tensor& dq, Tensor& dk, Tensor& dv);
// One query row for each of N sequences, each against its own keys (a batch of decoding
// sequences whose caches hold different lengths): q [N, 1, H, D]; ks[i] [1, S_i, Hkv, D] and
// vs[i] [1, S_i, Hkv, Dv] with last stride 1, F32 or (all of them) F16; out [N, 1, H, Dv].
// Row i is, bit for bit, the Attention kernel's output for q[i] over (ks[i], vs[i]) as F32.
// No segments; no backward.
using AttentionDecode = void(const Tensor& q, std::span<const Tensor> ks, std::span<const Tensor> vs,
                             const AttentionArgs& a, Tensor& out);

// ---- rows -------------------------------------------------------------------------------
// out[i, :] = table[ids[i], :]; table [V, D] (any float or block dtype), ids I32 [N].
using GetRows = void(const Tensor& table, const Tensor& ids, Tensor& out);
// dtable[ids[i], :] += g[i, :] (dtable zeroed by the op).
using ScatterAddRows = void(const Tensor& g, const Tensor& ids, Tensor& dtable);
// dst[ids[i], :] = src[i, :] in place.
using SetRows = void(Tensor& dst, const Tensor& ids, const Tensor& src);

// ---- loss -------------------------------------------------------------------------------
// Per row of logits [N, V]: loss[i] = w_i * (lse_i - z[i, t_i]); w_i = 0 where t_i == ignore
// or weights[i] (when defined) is 0. lse [N].
using CrossEntropy = void(const Tensor& logits, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                          Tensor& loss, Tensor& lse);
// The mean of the rows' losses, on the device: count = the non-ignored rows (or their summed
// weight), inv = 1 / (normalizer > 0 ? normalizer : count) (0 when that is 0), loss (a scalar
// of loss's dtype) = (sum of the rows, in double) * inv; inv is an F32 scalar for backward.
using CrossEntropyTotal = void(const Tensor& loss_rows, const Tensor& targets, const Tensor& weights,
                               int32_t ignore_index, float normalizer, Tensor& loss, Tensor& inv);
// dlogits[i, :] = scale * w_i * (softmax(z_i) - onehot(t_i)) with scale = float(grad) * inv
// (two device scalars: the output's gradient and CrossEntropyTotal's inv). dlogits may alias
// logits.
using CrossEntropyBackward = void(const Tensor& logits, const Tensor& targets, const Tensor& weights,
                                  int32_t ignore_index, const Tensor& lse, const Tensor& grad, const Tensor& inv,
                                  Tensor& dlogits);

// ---- conv -------------------------------------------------------------------------------
struct Im2ColArgs {
  int kh, kw, sh, sw, ph, pw, dh, dw;
};
// x [N, C, H, W] -> cols [N, OH*OW, C*KH*KW]; backward sums cols back into dx [N, C, H, W].
using Im2Col = void(const Tensor& x, const Im2ColArgs& a, Tensor& cols);
using Col2Im = void(const Tensor& cols, const Im2ColArgs& a, Tensor& dx);
// y[b, t, c] = sum_k w[c, k] * x[b, t + k, c]; x [B, T+K-1, C], w [C, K].
using SsmConv = void(const Tensor& x, const Tensor& w, Tensor& y);
using SsmConvBackward = void(const Tensor& x, const Tensor& w, const Tensor& g, Tensor& dx, Tensor& dw);

// ---- ssm scan (Mamba-2) ---------------------------------------------------------------------
// x [B, T, H, P], dt [B, T, H] (softplus applied inside), A [H], Bm/C [B, T, G, N], s0 [B, H, P, N];
// dtp = softplus(dt), s_t = exp(dtp*A) s_{t-1} + dtp x_t B_t^T, y_t = s_t C_t.
// y [B, T, H, P], s_final [B, H, P, N].
using SsmScan = void(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                     const Tensor& s0, Tensor& y, Tensor& s_final);
using SsmScanBackward = void(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& Bm, const Tensor& C,
                             const Tensor& s0, const Tensor& gy, const Tensor& gs, Tensor& dx, Tensor& ddt,
                             Tensor& dA, Tensor& dB, Tensor& dC, Tensor& ds0);

// ---- gated delta rule (Gated DeltaNet) ----------------------------------------------------------
// q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g (log decay) and beta [B, T, Hv], s0 [B, Hv, Dk, Dv]
// (undefined: zeros); V head h reads K head h % Hk. Per (b, V head), S [Dk, Dv]:
//   S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t.
// o [B, T, Hv, Dv], s_final [B, Hv, Dk, Dv]. chunk > 1: the chunked (WY) form over chunks of
// that many tokens; chunk 1: token by token. `starts`, when defined ([B, Hv, C, Dk, Dv], C =
// ceil(T / kGatedDeltaStateEvery)), receives the state before every kGatedDeltaStateEvery-th
// token, for the backward. All F32, contiguous.
inline constexpr int64_t kGatedDeltaStateEvery = 64;
using GatedDeltaRule = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                            const Tensor& s0, int64_t chunk, Tensor& o, Tensor& s_final, Tensor& starts);
// Gradients (=) of all inputs; gs (the final state's gradient) and ds0 may be undefined;
// `starts` as the forward wrote them (undefined: recomputed here).
using GatedDeltaRuleBackward = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                    const Tensor& beta, const Tensor& s0, const Tensor& starts, const Tensor& go,
                                    const Tensor& gs, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                                    Tensor& ds0);

// A Gated DeltaNet layer's conv output c [B, T, 2 Hk D + Hv D] split into q, k [B, T, Hk, D]
// (each L2-normalised per head: x / max(|x|, eps); q also times q_scale) and v [B, T, Hv, D],
// all contiguous; q_inv / k_inv [B, T, Hk] keep 1 / max(|x|, eps) for the backward.
using GdnSplitNorm = void(const Tensor& c, int64_t Hk, int64_t Hv, int64_t D, float eps, float q_scale, Tensor& q,
                          Tensor& k, Tensor& v, Tensor& q_inv, Tensor& k_inv);
// dc (=) from the gradients of the three parts (q and k, v as the forward wrote them).
using GdnSplitNormBackward = void(const Tensor& q, const Tensor& k, const Tensor& q_inv, const Tensor& k_inv,
                                  float eps, float q_scale, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                  Tensor& dc);

// ---- MoE --------------------------------------------------------------------------------------
// out[t, e, :] = W[ids[t, e]] @ x[t, e or 0, :]; W [E, N, K], x [T, X, K] (X = 1 or n_used), ids I32 [T, n_used].
// mul_mat_id_weight: the same with W in a stored dtype (F16, BF16, GGUF blocks) and x f32, each
// product as matmul_weight computes it (the activations rounded for that weight type).
using MulMatId = void(const Tensor& w, const Tensor& x, const Tensor& ids, Tensor& out);
// dx (=) and dw (+=, when defined).
using MulMatIdBackward = void(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& g, Tensor& dx,
                              Tensor& dw);
// out[t, e, :] = x[t, e, :] + b[ids[t, e], :].
using AddId = void(const Tensor& x, const Tensor& b, const Tensor& ids, Tensor& out);

// ---- optimizers (in place, F32, contiguous) ---------------------------------------------------
struct SgdArgs {
  float momentum = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};
// lr: F32 scalar tensor (may live on the device). buf may be undefined when momentum == 0.
using Sgd = void(Tensor& param, const Tensor& grad, Tensor& buf, const Tensor& lr, const SgdArgs& a);
struct AdamWArgs {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};
// step: F32 scalar tensor holding t (1-based) for bias correction.
using AdamW = void(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& lr, const Tensor& step,
                   const AdamWArgs& a);
using toy::ArenaRange;
// AdamW over the ranges of a parameter arena (values, grads, m, v: contiguous F32 [n]) in one
// call; a.weight_decay applies to the ranges marked decay; elements outside every range are
// left alone. Ranges are sorted and disjoint. Each element gets the bits AdamW gives it.
// The optimizer's clock, one kernel per step: step (F32 scalar, the optimizer steps taken)
// += 1, lr (F32 scalar) = cosine_lr(position, schedule) (core/lr_schedule.h), position (I32
// scalar) the training step being taken (it runs ahead of step when F16 loss scaling skips).
using OptimizerClock = void(Tensor& step, Tensor& lr, const Tensor& position, const LrSchedule& schedule);
// A training loop's step clock (I32 scalar) += 1.
using StepClock = void(Tensor& step);

// ---- sampling ---------------------------------------------------------------------------
// The sampler's chain on one row of logits (infer/sampler.h): penalties for the recent
// tokens (`penalized` I32 [n, 2]: token id and count, count 0 padding; undefined when none), then greedy
// (temperature 0) or temperature, top-k, min-p and top-p cuts and a draw at `r` in [0, 1).
// out I32 [1]: the token, or -1 - i when logit i is the first NaN. Only `out` comes back to
// the host.
using toy::SampleDraw;
using SampleToken = void(const Tensor& logits, const Tensor& penalized, Tensor& out, const SampleDraw& a);
using AdamWRanges = void(Tensor& values, const Tensor& grads, Tensor& m, Tensor& v, const Tensor& lr,
                         const Tensor& step, const AdamWArgs& a, const std::vector<ArenaRange>& ranges);
// out F32 [ranges.size()]: out[i] = the sum of x's squares over range i (x contiguous F32 [n]),
// with the bits of sum(square(x[range])): each square rounded to f32, then summed as Reduce
// sums a flat tensor. A parameter arena's gradients' squared norms in one call (a backend
// without it gets those ops range by range).
using SquareNormsRanges = void(const Tensor& x, const std::vector<ArenaRange>& ranges, Tensor& out);

}  // namespace toy::kern
