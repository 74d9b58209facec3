// The launchers of the row-wise kernels, in plain types (no toy or CUDA headers): reductions
// (reduce.cu), softmax and the diag mask (softmax.cu), the norms (norm.cu) and the
// cross-entropy loss (loss.cu). glue_reduce.cpp turns tensors into these views. The
// semantics are the CPU kernels' (backend/cpu/reduce.cpp, softmax.cpp, norm.cpp, loss.cpp);
// float views are F32, F16 or BF16 (the glue refuses other types), statistics are f32 arrays.
// A View whose data is null stands for an undefined (optional) tensor. Every launcher queues
// its kernels on the compute stream and returns at once; nothing is read back to the host.
#pragma once
#include <cstdint>

#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

// ---- reductions (reduce.cu) ---------------------------------------------------------------------
// out (contiguous, x's shape without `axis`) = sum (op 0, accumulated in double) or max (op 1)
// of x (any strides) over `axis`; for max, index (contiguous I32, or null) gets the position of
// the first maximum, a NaN counting as the maximum (the first NaN wins). A few long outputs,
// and sums down long columns, are reduced in chunks (a function of the shape and op alone):
// scratch is then reduce_split_chunks(op, x, axis) * out.numel 8-byte partials (0 chunks: no
// split, scratch may be null).
int64_t reduce_split_chunks(int op, const View& x, int axis);
void launch_reduce(int op, const View& x, int axis, const View& out, int32_t* index, void* scratch);

// ---- softmax (softmax.cu) -------------------------------------------------------------------------
// y = softmax(x * scale + mask) or log_softmax over the last axis; mask F32 broadcast to x's
// shape (any strides) or absent. A fully masked row gives 0 (log: -inf).
void launch_softmax(const View& x, const View& mask, float scale, bool log, const View& y);
// dz = y * (g - sum(g y)), or for log_softmax g - exp(y) sum(g).
void launch_softmax_backward(const View& y, const View& g, bool log, const View& dz);
// y = x, with `value` where column j > n_past + i (i the row in the last-but-one dimension).
void launch_diag_mask(const View& x, int64_t n_past, float value, const View& y);

// ---- norms over the last axis (norm.cu) -----------------------------------------------------------
// The number of row groups whose partial weight gradients a norm backward keeps (a function
// of the shape alone, so the sums' order — their bits — never depends on the GPU): the
// scratch of a weight (or bias) gradient is norm_partial_groups(rows, D) * D floats.
int64_t norm_partial_groups(int64_t rows, int64_t D);

// rows = x.numel / D. w optional; rstd [rows].
void launch_rms_norm(const View& x, const View& w, float eps, const View& y, float* rstd);
// dx = ; dw += (when dw.data is set; partial is its scratch).
void launch_rms_norm_backward(const View& x, const View& w, const float* rstd, const View& g, const View& dx,
                              const View& dw, float* partial);
// w and b optional; mean and rstd [rows].
void launch_layer_norm(const View& x, const View& w, const View& b, float eps, const View& y, float* mean,
                       float* rstd);
// dx = ; dw += and db += when given (partial_w / partial_b their scratch).
void launch_layer_norm_backward(const View& x, const View& w, const float* mean, const float* rstd, const View& g,
                                const View& dx, const View& dw, const View& db, float* partial_w, float* partial_b);
// y = x / max(||x||, eps); inv [rows] = 1 / max(||x||, eps).
void launch_l2_norm(const View& x, float eps, const View& y, float* inv);
// dx = inv * (g - y * sum(y g)) (inv * g where the norm was clamped to eps).
void launch_l2_norm_backward(const View& y, const float* inv, float eps, const View& g, const View& dx);

// ---- cross-entropy (loss.cu) ----------------------------------------------------------------------
// Per row of logits [N, V]: lse[i], loss[i] = w_i (lse_i - z[i, t_i]) with w_i = 0 where
// t_i == ignore, else weights[i] (null: 1). targets I32 [N], weights F32 [N] or null.
void launch_cross_entropy(const View& logits, const int32_t* targets, const float* weights, int32_t ignore,
                          float* loss, float* lse);
// One block: loss (a scalar of its Elem) = sum(loss_rows, double) * inv, inv (F32 scalar) =
// 1 / (normalizer > 0 ? normalizer : counted weight), 0 when that is 0. Runs for n = 0 too.
void launch_cross_entropy_total(const float* loss_rows, int64_t n, const int32_t* targets, const float* weights,
                                int32_t ignore, float normalizer, const View& loss, float* inv);
// dlogits = grad * inv * w_i * (softmax(z_i) - onehot(t_i)); grad a scalar of its Elem, inv
// F32 scalar, both read on the device. dlogits may alias logits.
void launch_cross_entropy_backward(const View& logits, const int32_t* targets, const float* weights, int32_t ignore,
                                   const float* lse, const View& grad, const float* inv, const View& dlogits);

}  // namespace toy::cuda
