// MoE primitives. mul_mat_id groups the (token, slot) pairs by expert and runs one SGEMM per
// expert on gathered rows (mul_mat_id_weight: experts in a stored dtype, as linear multiplies); add_id adds a per-expert bias row. Backward: dx per pair
// (summed over slots when x is shared), dW per expert (one writer each).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/row_blocks.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
struct MoeDims {
  int64_t E, N, K, T, X, U;
};
MoeDims moe_dims(const Tensor& w, const Tensor& x, const Tensor& ids) {
  return {w.size(0), w.size(1), w.size(2), ids.size(0), x.size(1), ids.size(1)};
}
// pairs[e] = flat (t * U + u) indices routed to expert e, in order.
std::vector<std::vector<int64_t>> group_by_expert(const Tensor& ids, int64_t E) {
  std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(E));
  const int32_t* pid = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) pairs[size_t(pid[i])].push_back(i);
  return pairs;
}
}  // namespace

void mul_mat_id(const Tensor& w, const Tensor& x, const Tensor& ids, Tensor& out) {
  const MoeDims d = moe_dims(w, x, ids);
  const auto pairs = group_by_expert(ids, d.E);
  const float* pw = w.data<float>();
  const float* px = x.data<float>();
  float* po = out.data<float>();
  parallel_tasks(d.E, [&](int64_t e) {
    const auto& pe = pairs[size_t(e)];
    if (pe.empty()) return;
    const int64_t m = int64_t(pe.size());
    std::vector<float> xin(size_t(m * d.K)), y(size_t(m * d.N));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = pe[size_t(i)] / d.U, u = pe[size_t(i)] % d.U;
      std::copy_n(px + (t * d.X + (d.X == 1 ? 0 : u)) * d.K, d.K, xin.data() + i * d.K);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(d.N), int(d.K), 1.0f, xin.data(), int(d.K),
                pw + e * d.N * d.K, int(d.K), 0.0f, y.data(), int(d.N));
    for (int64_t i = 0; i < m; ++i) std::copy_n(y.data() + i * d.N, d.N, po + pe[size_t(i)] * d.N);
  });
}

// Stored-dtype experts (F16, BF16, GGUF blocks) times f32 activations, each product as linear
// computes it with that expert's matrix (matmul_weight), so the same bits. An expert chosen by
// a few pairs (decoding: each chosen expert once per sequence) takes its rows' products
// straight from the blocks, and all such experts share one parallel region: a decoding token's
// k experts are one pass over the k matrices, not k passes each with its own start and wait.
// An expert with many pairs (a prompt) gets its own matmul_weight over its gathered rows.
void mul_mat_id_weight(const Tensor& w, const Tensor& x, const Tensor& ids, Tensor& out) {
  const MoeDims d = moe_dims(w, x, ids);
  const auto pairs = group_by_expert(ids, d.E);
  const DType t = w.dtype();
  const size_t matrix_bytes = size_t(d.N) * row_bytes(t, d.K);
  const auto* pw = static_cast<const uint8_t*>(w.raw_data());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  auto x_row = [&](int64_t pair) { return pair / d.U * d.X + (d.X == 1 ? 0 : pair % d.U); };

  std::vector<int64_t> few;  // experts whose pairs run from the blocks, together
  for (int64_t e = 0; e < d.E; ++e) {
    const auto& pe = pairs[size_t(e)];
    if (pe.empty()) continue;
    if (int64_t(pe.size()) <= kGemvMaxRows && gemv_blocks_supports(t)) {
      few.push_back(e);
      continue;
    }
    Tensor xe = empty(Shape{int64_t(pe.size()), d.K}), ye = empty(Shape{int64_t(pe.size()), d.N});
    for (size_t i = 0; i < pe.size(); ++i) std::copy_n(px + x_row(pe[i]) * d.K, d.K, xe.data<float>() + i * d.K);
    const Tensor we = make_view(w, Shape{d.N, d.K}, Strides{d.K, 1}, w.offset() + e * d.N * d.K);
    matmul_weight(xe, we, ye, false);
    for (size_t i = 0; i < pe.size(); ++i) std::copy_n(ye.data<float>() + i * d.N, d.N, po + pe[i] * d.N);
  }
  if (few.empty() || d.N == 0) return;
  std::vector<uint8_t> needed(size_t(d.T * d.X), 0);  // the rows of x the few experts' pairs read
  for (int64_t e : few)
    for (int64_t pair : pairs[size_t(e)]) needed[size_t(x_row(pair))] = 1;
  const PreparedRows rows(t, px, d.T * d.X, d.K, needed);  // (scratch slot 5: matmul_weight above is done with it)
  // Each expert's output rows padded to whole blocks of 16, so a block never spans two experts.
  constexpr int64_t kBlock = 16;
  const int64_t span = (d.N + kBlock - 1) / kBlock * kBlock;
  // (for_row_blocks may hand over several blocks at once — all of them on one thread.)
  for_row_blocks(int64_t(few.size()) * span, kBlock, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; b += kBlock) {
      const int64_t e = few[size_t(b / span)], r0 = b % span, r1 = std::min(d.N, r0 + kBlock);
      if (r0 >= d.N) continue;
      for (int64_t pair : pairs[size_t(e)])
        rows.products(x_row(pair), pw + size_t(e) * matrix_bytes, r0, r1, po + pair * d.N + r0);
    }
  });
}

void mul_mat_id_backward(const Tensor& w, const Tensor& x, const Tensor& ids, const Tensor& g, Tensor& dx, Tensor& dw) {
  const MoeDims d = moe_dims(w, x, ids);
  const auto pairs = group_by_expert(ids, d.E);
  const float* pw = w.data<float>();
  const float* px = x.data<float>();
  const float* pg = g.data<float>();
  float* pdw = dw.defined() ? dw.data<float>() : nullptr;
  // Per-pair input gradient, then folded over slots if x is shared by all slots.
  std::vector<float> dpair(size_t(d.T * d.U * d.K), 0.0f);
  parallel_tasks(d.E, [&](int64_t e) {
    const auto& pe = pairs[size_t(e)];
    if (pe.empty()) return;
    const int64_t m = int64_t(pe.size());
    std::vector<float> xin(size_t(m * d.K)), gin(size_t(m * d.N)), dxe(size_t(m * d.K));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = pe[size_t(i)] / d.U, u = pe[size_t(i)] % d.U;
      std::copy_n(px + (t * d.X + (d.X == 1 ? 0 : u)) * d.K, d.K, xin.data() + i * d.K);
      std::copy_n(pg + pe[size_t(i)] * d.N, d.N, gin.data() + i * d.N);
    }
    // dx_pairs = G W_e
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(d.K), int(d.N), 1.0f, gin.data(), int(d.N),
                pw + e * d.N * d.K, int(d.K), 0.0f, dxe.data(), int(d.K));
    for (int64_t i = 0; i < m; ++i) std::copy_n(dxe.data() + i * d.K, d.K, dpair.data() + pe[size_t(i)] * d.K);
    // dW_e += G^T X
    if (pdw)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(d.N), int(d.K), int(m), 1.0f, gin.data(), int(d.N),
                  xin.data(), int(d.K), 1.0f, pdw + e * d.N * d.K, int(d.K));
  });
  float* pdx = dx.data<float>();
  if (d.X == 1) {
    for (int64_t t = 0; t < d.T; ++t) {
      float* o = pdx + t * d.K;
      std::fill_n(o, d.K, 0.0f);
      for (int64_t u = 0; u < d.U; ++u) {
        const float* s = dpair.data() + (t * d.U + u) * d.K;
        for (int64_t k = 0; k < d.K; ++k) o[k] += s[k];
      }
    }
  } else {
    std::copy(dpair.begin(), dpair.end(), pdx);
  }
}

void add_id(const Tensor& x, const Tensor& b, const Tensor& ids, Tensor& out) {
  const int64_t N = x.size(-1), pairs = ids.numel();
  const float* px = x.data<float>();
  const float* pb = b.data<float>();
  const int32_t* pid = ids.data<int32_t>();
  float* po = out.data<float>();
  parallel_for(0, pairs, std::max<int64_t>(1, 4096 / std::max<int64_t>(N, 1)), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      for (int64_t n = 0; n < N; ++n) po[i * N + n] = px[i * N + n] + pb[pid[i] * N + n];
  });
}

}  // namespace toy::cpu
