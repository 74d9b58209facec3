// The launchers of the conv kernels (conv.cu: im2col, col2im, ssm_conv and its backward) and
// of the rest of the small kernels (misc.cu: add_id, argsort, top_k, the Gated DeltaNet q/k/v
// split with its L2 norms and its backward), in plain types (no toy or CUDA headers);
// glue_misc.cpp turns tensors into these views. The semantics are the CPU kernels'
// (backend/cpu/conv.cpp, reduce.cpp, moe.cpp, gated_delta.cpp). Inputs may be strided views,
// outputs are contiguous; float views are F32, F16 or BF16 (computed in f32) unless a launcher
// says F32. Every launcher queues its kernels on the compute stream and returns at once;
// nothing is read back to the host, and no result depends on timing (no float atomics).
#pragma once
#include <cstdint>

#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {

// ---- conv.cu ------------------------------------------------------------------------------------

// The geometry of an im2col: x [N, C, H, W], kernel KH x KW, stride, padding and dilation,
// giving OH x OW output positions (kern::Im2ColArgs plus the sizes).
struct ConvShape {
  int64_t N, C, H, W, OH, OW;
  int32_t kh, kw, sh, sw, ph, pw, dh, dw;
};
// cols [N, OH*OW, C*KH*KW] = the patches of x (zeros in the padding).
void launch_im2col(const View& x, const ConvShape& s, const View& cols);
// dx [N, C, H, W] = the sum of every cols entry that im2col read from each element (one
// thread per dx element, its contributions added in the CPU's order).
void launch_col2im(const View& cols, const ConvShape& s, const View& dx);

// y [B, T, C][b, t, c] = sum_k w[c, k] x[b, t + k, c]; x [B, T+K-1, C], w [C, K].
void launch_ssm_conv(const View& x, const View& w, const View& y);
// dx [B, T+K-1, C] (=) and, when dw.data is non-null, dw [C, K] += sum over b and t of
// g[b, t, c] x[b, t + k, c]; g [B, T, C].
void launch_ssm_conv_backward(const View& x, const View& w, const View& g, const View& dx, const View& dw);

// ---- misc.cu ------------------------------------------------------------------------------------

// out[t, u, :] = x[t, u, :] + b[ids[t, u], :]; x, b, out F32, ids I32 (ids checked by the op).
void launch_add_id(const View& x, const View& b, const View& ids, const View& out);

// Argsort and top-k sort each row (the last axis) of x by a block-wide bitonic sort of
// (order key, position) pairs: a total order, so the result is the CPU's stable sort. Rows of
// up to kSortSharedLen (padded to a power of two) sort in shared memory; longer rows in a
// global scratch of sort_scratch_words(rows, L) 32-bit words that the caller allocates (0 when
// none is needed; then `scratch` may be null).
inline constexpr int64_t kSortSharedLen = 4096;
int64_t sort_scratch_words(int64_t rows, int64_t L);
// indices [..., L] (I32, contiguous): the positions that sort each row, stable; NaN counts as
// larger than every number (last ascending, first descending).
void launch_argsort(const View& x, bool descending, const View& indices, void* scratch);
// values [..., k] (x's type) and indices [..., k] (I32): the k largest of each row in
// descending order (NaN first, ties by lower position).
void launch_top_k(const View& x, int64_t k, const View& values, const View& indices, void* scratch);

// Gated DeltaNet's split (all F32): c [B, T, (2 Hk + Hv) D] -> q, k [B, T, Hk, D], each head
// times inv = 1 / max(|x|, eps) (q also times q_scale), v [B, T, Hv, D] a copy; q_inv and
// k_inv [B, T, Hk] keep inv.
void launch_gdn_split_norm(const View& c, int64_t Hk, int64_t Hv, int64_t D, float eps, float q_scale, const View& q,
                           const View& k, const View& v, const View& q_inv, const View& k_inv);
// dc [B, T, (2 Hk + Hv) D] (=) from q, k, their inv, and dq, dk, dv.
void launch_gdn_split_norm_backward(const View& q, const View& k, const View& q_inv, const View& k_inv, float eps,
                                    float q_scale, const View& dq, const View& dk, const View& dv, const View& dc);

}  // namespace toy::cuda
