// RMS, layer and L2 norms over the last axis, forward and backward. A block per row (rows
// loop over a capped grid), f32 math with block reductions, statistics (rstd, mean, inverse
// norm) in f32, as the CPU's norm.cpp computes them.
// Weight and bias gradients ("+=") stay deterministic without atomics: the backward runs on
// exactly norm_partial_groups(rows, D) blocks, block b taking rows b, b + G, b + 2G, ...; each
// thread adds its columns of each row into block b's row of a scratch buffer (the same thread
// always owns the same entries, so no races), and a second kernel adds the G partial rows, in
// order b = 0..G-1, onto the gradient.
#include <cmath>

#include "toy/backend/cuda/block_reduce.cuh"
#include "toy/backend/cuda/reduce_launch.h"

namespace toy::cuda {

namespace {

using namespace red;

constexpr int64_t kMaxPartialGroups = 1024;
constexpr int64_t kPartialBudget = int64_t(8) << 20;  // floats of scratch per gradient (32 MiB)

__device__ __forceinline__ bool has(const RowView& v) { return v.data != nullptr; }

template <class T>
__global__ void rms_norm_kernel(RowView x, RowView w, float eps, RowView y, float* rstd, int64_t rows, int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = load<T>(x, base + j);
      ss = fmaf(v, v, ss);
    }
    ss = block_reduce(ss, AddOp{});
    const float rs = 1.0f / sqrtf(ss / float(D) + eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float v = load<T>(x, base + j) * rs;
      if (has(w)) v *= load<T>(w, j);
      store<T>(y, base + j, v);
    }
  }
}

// partial (or null): this block's row of D floats, written by its first row, then added to.
template <class T>
__global__ void rms_norm_backward_kernel(RowView x, RowView w, const float* rstd, RowView g, RowView dx,
                                         float* partial, int64_t rows, int64_t D) {
  float* acc = partial ? partial + blockIdx.x * D : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    const float rs = rstd[r];
    const bool first = r == blockIdx.x;
    float s = 0.0f;  // sum(g w x)
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float gv = load<T>(g, base + j), xv = load<T>(x, base + j);
      const float gw = has(w) ? gv * load<T>(w, j) : gv;
      s = fmaf(gw, xv, s);
      if (acc) acc[j] = fmaf(gv * xv, rs, first ? 0.0f : acc[j]);
    }
    s = block_reduce(s, AddOp{});
    // dx = rstd * g w - x * s * rstd^3 / D
    const float k = s * rs * rs * rs / float(D);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float gv = load<T>(g, base + j);
      const float gw = has(w) ? gv * load<T>(w, j) : gv;
      store<T>(dx, base + j, rs * gw - k * load<T>(x, base + j));
    }
  }
}

template <class T>
__global__ void layer_norm_kernel(RowView x, RowView w, RowView b, float eps, RowView y, float* mean, float* rstd,
                                  int64_t rows, int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += load<T>(x, base + j);
    const float mu = block_reduce(sum, AddOp{}) / float(D);
    float var = 0.0f;  // two passes: exact for rows with a large mean
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float d = load<T>(x, base + j) - mu;
      var = fmaf(d, d, var);
    }
    var = block_reduce(var, AddOp{});
    const float rs = 1.0f / sqrtf(var / float(D) + eps);
    if (threadIdx.x == 0) mean[r] = mu, rstd[r] = rs;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      float v = (load<T>(x, base + j) - mu) * rs;
      if (has(w)) v *= load<T>(w, j);
      if (has(b)) v += load<T>(b, j);
      store<T>(y, base + j, v);
    }
  }
}

template <class T>
__global__ void layer_norm_backward_kernel(RowView x, RowView w, const float* mean, const float* rstd, RowView g,
                                           RowView dx, float* partial_w, float* partial_b, int64_t rows, int64_t D) {
  float* aw = partial_w ? partial_w + blockIdx.x * D : nullptr;
  float* ab = partial_b ? partial_b + blockIdx.x * D : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    const float mu = mean[r], rs = rstd[r];
    const bool first = r == blockIdx.x;
    float2 s = make_float2(0.0f, 0.0f);  // sum(g w), sum(g w xhat)
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = (load<T>(x, base + j) - mu) * rs, gv = load<T>(g, base + j);
      const float gw = has(w) ? gv * load<T>(w, j) : gv;
      s.x += gw;
      s.y = fmaf(gw, xh, s.y);
      if (aw) aw[j] = fmaf(gv, xh, first ? 0.0f : aw[j]);
      if (ab) ab[j] = first ? gv : ab[j] + gv;
    }
    s = block_reduce(s, AddOp{});
    const float mean_gw = s.x / float(D), mean_gwx = s.y / float(D);
    // dx = rstd * (g w - mean(g w) - xhat * mean(g w xhat))
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float xh = (load<T>(x, base + j) - mu) * rs, gv = load<T>(g, base + j);
      const float gw = has(w) ? gv * load<T>(w, j) : gv;
      store<T>(dx, base + j, rs * (gw - mean_gw - xh * mean_gwx));
    }
  }
}

template <class T>
__global__ void l2_norm_kernel(RowView x, float eps, RowView y, float* inv, int64_t rows, int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float v = load<T>(x, base + j);
      ss = fmaf(v, v, ss);
    }
    const float n = sqrtf(block_reduce(ss, AddOp{}));
    const float iv = 1.0f / (n < eps ? eps : n);  // (std::max(n, eps): NaN stays NaN)
    if (threadIdx.x == 0) inv[r] = iv;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) store<T>(y, base + j, load<T>(x, base + j) * iv);
  }
}

template <class T>
__global__ void l2_norm_backward_kernel(RowView y, const float* inv, float eps, RowView g, RowView dx, int64_t rows,
                                        int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    const float iv = inv[r];
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s = fmaf(load<T>(y, base + j), load<T>(g, base + j), s);
    s = block_reduce(s, AddOp{});
    if (iv >= 1.0f / eps) s = 0.0f;  // below eps the norm is the constant eps: a plain scale
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      store<T>(dx, base + j, iv * (load<T>(g, base + j) - load<T>(y, base + j) * s));
  }
}

// out[j] += partial[0][j] + ... + partial[G-1][j], in that order, in f32 (the CPU's fold).
template <class T>
__global__ void fold_kernel(const float* partial, int64_t groups, int64_t D, RowView out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < D; j += int64_t(gridDim.x) * blockDim.x) {
    float s = load<T>(out, j);
    for (int64_t b = 0; b < groups; ++b) s += partial[b * D + j];
    store<T>(out, j, s);
  }
}

int64_t last_dim(const View& x) { return x.ndim > 0 ? x.shape[x.ndim - 1] : 1; }
int64_t rows_of(const View& x, int64_t D) { return x.numel / (D > 0 ? D : 1); }

template <class T>
void fold(const float* partial, int64_t groups, int64_t D, const View& out) {
  constexpr int kThreads = 256;
  fold_kernel<T><<<grid_for((D + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(partial, groups, D,
                                                                                      row_view(out));
}

}  // namespace

int64_t norm_partial_groups(int64_t rows, int64_t D) {
  int64_t g = kPartialBudget / (D > 0 ? D : 1);
  if (g > kMaxPartialGroups) g = kMaxPartialGroups;
  if (g < 1) g = 1;
  return rows < g ? rows : g;
}

void launch_rms_norm(const View& x, const View& w, float eps, const View& y, float* rstd) {
  const int64_t D = last_dim(x), rows = rows_of(x, D);
  if (rows == 0) return;
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<grid_for(rows), row_threads(D), 0, stream()>>>(row_view(x), row_view(w), eps, row_view(y),
                                                                        rstd, rows, D);
  });
}

void launch_rms_norm_backward(const View& x, const View& w, const float* rstd, const View& g, const View& dx,
                              const View& dw, float* partial) {
  const int64_t D = last_dim(x), rows = rows_of(x, D);
  if (rows == 0) return;
  const bool want_dw = dw.data != nullptr;
  const int64_t groups = norm_partial_groups(rows, D);
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_backward_kernel<T><<<want_dw ? unsigned(groups) : grid_for(rows), row_threads(D), 0, stream()>>>(
        row_view(x), row_view(w), rstd, row_view(g), row_view(dx), want_dw ? partial : nullptr, rows, D);
    if (want_dw) fold<T>(partial, groups, D, dw);
  });
}

void launch_layer_norm(const View& x, const View& w, const View& b, float eps, const View& y, float* mean,
                       float* rstd) {
  const int64_t D = last_dim(x), rows = rows_of(x, D);
  if (rows == 0) return;
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_kernel<T><<<grid_for(rows), row_threads(D), 0, stream()>>>(row_view(x), row_view(w), row_view(b), eps,
                                                                          row_view(y), mean, rstd, rows, D);
  });
}

void launch_layer_norm_backward(const View& x, const View& w, const float* mean, const float* rstd, const View& g,
                                const View& dx, const View& dw, const View& db, float* partial_w, float* partial_b) {
  const int64_t D = last_dim(x), rows = rows_of(x, D);
  if (rows == 0) return;
  const bool want_dw = dw.data != nullptr, want_db = db.data != nullptr;
  const int64_t groups = norm_partial_groups(rows, D);
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    const unsigned grid = want_dw || want_db ? unsigned(groups) : grid_for(rows);
    layer_norm_backward_kernel<T><<<grid, row_threads(D), 0, stream()>>>(
        row_view(x), row_view(w), mean, rstd, row_view(g), row_view(dx), want_dw ? partial_w : nullptr,
        want_db ? partial_b : nullptr, rows, D);
    if (want_dw) fold<T>(partial_w, groups, D, dw);
    if (want_db) fold<T>(partial_b, groups, D, db);
  });
}

void launch_l2_norm(const View& x, float eps, const View& y, float* inv) {
  const int64_t D = last_dim(x), rows = rows_of(x, D);
  if (rows == 0) return;
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    l2_norm_kernel<T><<<grid_for(rows), row_threads(D), 0, stream()>>>(row_view(x), eps, row_view(y), inv, rows, D);
  });
}

void launch_l2_norm_backward(const View& y, const float* inv, float eps, const View& g, const View& dx) {
  const int64_t D = last_dim(y), rows = rows_of(y, D);
  if (rows == 0) return;
  with_float(y.elem, [&](auto tag) {
    using T = decltype(tag);
    l2_norm_backward_kernel<T><<<grid_for(rows), row_threads(D), 0, stream()>>>(row_view(y), inv, eps, row_view(g),
                                                                                row_view(dx), rows, D);
  });
}

}  // namespace toy::cuda
