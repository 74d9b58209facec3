// The functional op set. Every op checks its arguments (throwing toy::Error that names the
// op, what was expected and what was found), dispatches to a kernel through the registry,
// and, when an input requires grad, records its backward rule on the tape.
// Shapes use fixed letters: B batch, T time, H heads, D feature dim, V vocab, N rows.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "toy/core/arena_range.h"
#include "toy/core/lr_schedule.h"
#include "toy/core/rng.h"
#include "toy/core/sampling.h"
#include "toy/core/tensor.h"

namespace toy {

// ---- elementwise (ops/elementwise.cpp) ----------------------------------------------------
// Binary ops broadcast like NumPy; both operands must have the same float dtype.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);
Tensor add_scalar(const Tensor& x, float s);  // x + s (composite of scale-free fill + add)
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor softplus(const Tensor& x);  // log(1 + e^x), x itself above 20 (as PyTorch and ggml)
enum class GeluApprox { Tanh, None };
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::Tanh);
Tensor clamp(const Tensor& x, float lo, float hi);
// silu(a) * b.
Tensor swiglu(const Tensor& a, const Tensor& b);
// Split form: x [..., 2F] -> silu(x[..., :F]) * x[..., F:].
Tensor swiglu(const Tensor& x);
// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1-p).
// Identity when !training or p == 0. The mask comes from gen's counter, never stored.
Tensor dropout(const Tensor& x, float p, bool training = true, Generator& gen = default_generator());

// ---- matmul (ops/matmul.cpp) ------------------------------------------------------------
// a [..., M, K] @ b [..., K, N] -> [..., M, N], batch dims broadcast; 1-D operands are
// promoted as in NumPy. transpose_a/b use the transposed view of the operand (no copy).
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// x [..., in] @ w[out, in]^T + b[out] (b optional).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
// Sum of outer products of rows: a [..., N, M], b [..., N, P] -> a^T b [..., M, P];
// 1-D a [M], b [P] -> [M, P].
Tensor out_prod(const Tensor& a, const Tensor& b);

// ---- reductions (ops/reduce.cpp) ----------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> 0-d
Tensor sum(const Tensor& x, int axis, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int axis, bool keepdim = false);
Tensor max(const Tensor& x);
Tensor max(const Tensor& x, int axis, bool keepdim = false);
Tensor argmax(const Tensor& x, int axis = -1, bool keepdim = false);  // I32
Tensor argsort(const Tensor& x, bool descending = false);            // I32, last axis
// The k largest along the last axis, descending: {values, indices (I32)}.
std::pair<Tensor, Tensor> top_k(const Tensor& x, int64_t k);
// Sums g (broadcast result) back to `shape` — the backward of broadcasting.
Tensor sum_to(const Tensor& g, const Shape& shape);
// One token drawn from one row of logits [V] (or [1, V]) on their device, by the sampler's
// chain (infer/sampler.h): `penalized` (pairs of token id in [0, V) and its count in the
// recent tokens, made on the host; count 0 is padding, so a caller can keep one size and the
// allocator one block) uploaded, then penalties, greedy or temperature/top-k/
// min-p/top-p and the draw at d.r. Returns an I32 scalar on the logits' device: the token,
// or -1 - i when logit i is the first NaN — the one thing a caller reads back.
Tensor sample_token(const Tensor& logits, std::span<const int32_t> penalized, const SampleDraw& d);

// ---- norms (ops/norm.cpp): over the last axis -------------------------------------------
Tensor rms_norm(const Tensor& x, const Tensor& w = Tensor(), float eps = 1e-6f);
Tensor layer_norm(const Tensor& x, const Tensor& w = Tensor(), const Tensor& b = Tensor(), float eps = 1e-5f);
Tensor l2_norm(const Tensor& x, float eps = 1e-12f);

// ---- softmax (ops/softmax.cpp): over the last axis -----------------------------------------
// softmax(x * scale + mask); mask (additive, e.g. -inf) broadcasts to x.
Tensor softmax(const Tensor& x, float scale = 1.0f, const Tensor& mask = Tensor());
Tensor log_softmax(const Tensor& x, float scale = 1.0f, const Tensor& mask = Tensor());
// x [..., Tq, Tk] with x[..., i, j] = -inf for j > n_past + i (causal masking).
Tensor diag_mask_inf(const Tensor& x, int64_t n_past = 0);

// ---- rope (ops/rope.cpp) ----------------------------------------------------------------
struct RopeOptions {
  int n_dims = 0;  // rotated dims per head; 0 = the whole head
  bool neox = false;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  float ext_factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;
  int n_ctx_orig = 0;
  Tensor freq_factors;  // F32 [n_dims / 2]: each frequency is divided by its factor (Llama 3)
  // Only heads [heads_begin, heads_end) rotate (-1 = to the last); the others are copied.
  // Lets RoPE run on a packed qkv tensor, rotating q and k and passing v through.
  int64_t heads_begin = 0, heads_end = -1;
};
// x [B, T, H, D]; positions I32 [T] or [B, T].
Tensor rope(const Tensor& x, const Tensor& positions, const RopeOptions& o = {});

// ---- attention (ops/attention.cpp) -------------------------------------------------------
struct AttentionOptions {
  float scale = 0.0f;  // 0 = 1/sqrt(D)
  bool causal = true;
  Tensor segments;     // I32 [B, T]: block-causal within equal ids (packed sequences)
  int64_t window = 0;  // causal only: query i sees keys j with i' - window < j <= i' (i' = i + S - T); 0: all
};
// Fused scaled-dot-product attention: q [B, T, H, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv]
// (H a multiple of Hkv; heads share K/V by index) -> [B, T, H, Dv]. Never stores T x S.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o = {});
// The same on a packed projection qkv [B, T, H + 2*Hkv, D] (q heads, then k, then v, as a fused
// qkv Linear produces them): the gradient comes back packed in one tensor, with no slices.
Tensor attention_qkv(const Tensor& qkv, int64_t heads, int64_t kv_heads, const AttentionOptions& o = {});
// One query row per sequence, each over its own keys and values (decoding a batch whose
// caches hold different lengths): q [N, 1, H, D]; ks[i] [1, S_i, Hkv, D], vs[i] [1, S_i, Hkv, Dv]
// -> [N, 1, H, Dv]. Row i equals attention(q[i], ks[i], vs[i], o) bit for bit; where the device
// has the kernel, all N rows run in one call (their heads share the threads). Keys and values
// may be F16 under F32 queries (an F16 cache: read as F16, the numbers of its F32 widening).
// No segments.
Tensor attention_decode(const Tensor& q, std::span<const Tensor> ks, std::span<const Tensor> vs,
                        const AttentionOptions& o = {});

// ---- shape and rows (ops/shape.cpp, ops/rows.cpp) ------------------------------------------
// View with a new shape (one dim may be -1); throws if the strides cannot express it.
Tensor view(const Tensor& x, const Shape& shape);
// view() when possible, else a contiguous copy.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor transpose(const Tensor& x, int d0 = -2, int d1 = -1);
Tensor contiguous(const Tensor& x);       // x itself when already contiguous
Tensor contiguous_copy(const Tensor& x);  // always a fresh tensor
// x on device d (x itself when it is there): a counted transfer (core/device_access.h); the
// gradient goes back to x's device.
Tensor to(const Tensor& x, Device d);
// Host-made ids (a batch, a prompt) checked before their upload to device d: every element in
// [0, below) (or equal to *ignore), else toy::Error naming op, what and the position. The
// copy on d is marked (TensorImpl::ids_checked_below: views and transfers carry it, an
// in-place write clears it) so that ops there do not read the ids back to check them again;
// the host tensor is not marked (the host may write into it again).
Tensor upload_checked_ids(const Tensor& ids, Device d, int64_t below, const char* op, const char* what,
                          const int32_t* ignore = nullptr);
Tensor concat(const std::vector<Tensor>& xs, int axis);
// Elements start, start+step, ... < end along axis (negative start/end count from the end).
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end, int64_t step = 1);
// pads[i] = {before, after} for the last pads.size() dims, filled with value.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& pads, float value = 0.0f);
// Tiles x: repeats[i] copies along dim i (repeats.size() >= ndim, like torch.Tensor.repeat).
Tensor repeat(const Tensor& x, const std::vector<int64_t>& repeats);
// Broadcast view (zero strides) to shape.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int axis);
Tensor squeeze(const Tensor& x, int axis);
Tensor cast(const Tensor& x, DType dtype);
// table [V, D] (float or block dtype), ids I32 [...] -> [..., D] (F32 for block tables).
Tensor get_rows(const Tensor& table, const Tensor& ids);
// Copy of dst [N, D] with rows ids [M] replaced by src [M, D].
Tensor set_rows(const Tensor& dst, const Tensor& ids, const Tensor& src);
// In place, without gradient (KV caches).
void set_rows_(Tensor& dst, const Tensor& ids, const Tensor& src);
// dst = src in place (same shape, any layouts, dtype converted). No gradient.
void copy_(Tensor& dst, const Tensor& src);
void fill_(Tensor& dst, double value);
// dst += src and dst *= s in place (dst contiguous float; src dst's shape, dtype and device).
// No gradient: gradient accumulation, clipping and unscaling over a parameter arena.
void add_(Tensor& dst, const Tensor& src);
void scale_(Tensor& dst, float s);

// ---- loss (ops/loss.cpp) --------------------------------------------------------------------
struct CrossEntropyOptions {
  int32_t ignore_index = -100;  // targets equal to it do not count
  Tensor weights;               // F32, targets' shape: per-position weight (0 = masked); undefined = all 1
  // Divide the summed loss by this instead of the counted weight of this call (0 = count
  // here). Chunks of one batch pass the batch's total count, so their losses add up to the
  // batch mean.
  float normalizer = 0.0f;
};
// Mean over counted positions of -log softmax(logits)[target]. logits [..., V], targets
// I32 [...]. Fused with log-softmax: only the log-sum-exp per row is kept for the backward.
// When no position counts, the loss is 0 (not NaN).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o = {});
// cross_entropy(linear(h, w), targets) computed in chunks of rows, each chunk a
// recomputation region: at most one chunk of logits (and its gradient) exists at a time, so
// a large vocabulary never needs a logits-sized buffer. h [..., D], w [V, D].
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets, int64_t chunk_rows,
                            const CrossEntropyOptions& o = {});

// ---- conv (ops/conv.cpp) --------------------------------------------------------------------
struct Conv2dOptions {
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};
// x [N, C, H, W] -> [N, OH*OW, C*KH*KW].
Tensor im2col(const Tensor& x, int kh, int kw, const Conv2dOptions& o = {});
// x [N, C, H, W], w [OC, C, KH, KW], b [OC] -> [N, OC, OH, OW].
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), const Conv2dOptions& o = {});
// Depthwise causal conv over time: x [B, T, C], w [C, K] -> [B, T, C];
// y[b, t, c] = sum_k w[c, k] * x[b, t - K + 1 + k, c] (zeros before t = 0).
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ---- MoE and SSM (ops/moe.cpp, ops/ssm.cpp) ------------------------------------------------
// Per-token expert matmul: w [E, N, K], x [T, X, K] (X = 1 broadcasts), ids I32 [T, U] -> [T, U, N].
Tensor mul_mat_id(const Tensor& w, const Tensor& x, const Tensor& ids);
// x [T, U, N] + b[ids[t, u]], b [E, N].
Tensor add_id(const Tensor& x, const Tensor& b, const Tensor& ids);
// x [B, T+K-1, C] (the K-1 previous inputs prepended), w [C, K] -> [B, T, C].
Tensor ssm_conv(const Tensor& x, const Tensor& w);
// Mamba-2 selective scan; returns {y [B, T, H, P], final state [B, H, P, N]}. s0 may be
// undefined (zeros). See backend/kernels.h for the recurrence.
std::pair<Tensor, Tensor> ssm_scan(const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                                   const Tensor& C, const Tensor& s0 = Tensor());
// The gated delta rule (Gated DeltaNet): q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g (log decay,
// usually <= 0) and beta [B, T, Hv], s0 [B, Hv, Dk, Dv] (undefined: zeros); V head h reads K
// head h % Hk. Per V head, S [Dk, Dv]: S <- exp(g_t) S; u = beta_t (v_t - S^T k_t);
// S <- S + k_t u^T; o_t = S^T q_t. Returns {o [B, T, Hv, Dv], final state [B, Hv, Dk, Dv]}.
// Auto: the chunked form (chunks of kGatedDeltaChunk tokens) from that many tokens on,
// token by token below (decoding); both compute the same function.
enum class GatedDeltaAlgorithm { Auto, Chunked, Recurrent };
inline constexpr int64_t kGatedDeltaChunk = 64;
std::pair<Tensor, Tensor> gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                           const Tensor& beta, const Tensor& s0 = Tensor(),
                                           GatedDeltaAlgorithm algorithm = GatedDeltaAlgorithm::Auto);
// A Gated DeltaNet layer's fused form: c [B, T, (2 Hk + Hv) D] (its conv output: q, k, v
// channels) split into q, k [B, T, Hk, D] and v [B, T, Hv, D], q and k L2-normalised per head
// (x / max(|x|, eps)) and q scaled by 1/sqrt(D), then gated_delta_rule — one tape node, so no
// slice of c, no normalised copy and no zero-filled gradient of c exists apart from the one dc.
std::pair<Tensor, Tensor> gated_delta_rule_qkv(const Tensor& c, const Tensor& g, const Tensor& beta, int64_t k_heads,
                                               int64_t v_heads, int64_t head_dim, float eps,
                                               const Tensor& s0 = Tensor());

// ---- optimizer steps (ops/optim.cpp): in place on F32 tensors ----------------------------
struct SgdOptions {
  float momentum = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};
// lr is an F32 scalar tensor so that it can live on the device.
void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const Tensor& lr, const SgdOptions& o = {});
struct AdamWOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};
// Decoupled weight decay (param *= 1 - lr*wd), bias-corrected moments; step holds t >= 1.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const Tensor& lr, const Tensor& step,
                const AdamWOptions& o = {});
// step += 1 and lr = cosine_lr(position, s) on their device, in one kernel (step and lr F32
// scalars, position the I32 scalar of a step clock): the optimizer's clock, with nothing of
// the step baked into the launch.
void advance_optimizer_clock(Tensor& step, Tensor& lr, const Tensor& position, const LrSchedule& s);
// step (an I32 scalar: a training loop's step clock) += 1 on its device.
void advance_step_clock(Tensor& step);
// The same over the ranges of a parameter arena (values, grads, m, v: contiguous F32 [n] on
// one device), in one kernel call: o.weight_decay applies to the ranges marked decay,
// elements outside every range stay as they are. Ranges sorted, disjoint, within [0, n).
void adamw_step_ranges(Tensor& values, const Tensor& grads, Tensor& m, Tensor& v, const Tensor& lr,
                       const Tensor& step, const AdamWOptions& o, const std::vector<ArenaRange>& ranges);
// F32 [ranges.size()]: each range's sum of squares of x (contiguous F32 [n]), with the bits of
// sum(square(slice(x, 0, begin, end))): the gradients' squared norms of a parameter arena, in
// one kernel where the device has it (ranges within [0, n), any order, not empty).
Tensor square_norms(const Tensor& x, const std::vector<ArenaRange>& ranges);

}  // namespace toy
