// Softmax / log-softmax over the last axis with a scale and an additive F32 mask, the
// backward, and the causal diag mask. A block per row: the max, then the sum of exponentials,
// then the outputs, each pass re-reading the row (it stays in L2 between passes); f32 math.
// As on the CPU, a fully masked row (max -inf) gives zeros (log: -inf), and a row holding NaN
// gives NaN throughout.
#include <cmath>

#include "toy/backend/cuda/block_reduce.cuh"
#include "toy/backend/cuda/reduce_launch.h"

namespace toy::cuda {

namespace {

using namespace red;

// z = x * scale + mask for element j of row r.
template <class T>
struct Scores {
  RowView x, mask;
  bool has_mask;
  float scale;
  int64_t D;

  __device__ __forceinline__ float at(int64_t mrow, int64_t ms, int64_t r, int64_t j) const {
    const float v = load<T>(x, r * D + j) * scale;
    return has_mask ? v + reinterpret_cast<const float*>(mask.data)[mrow + j * ms] : v;
  }
};

template <class T>
__global__ void softmax_kernel(Scores<T> s, bool log, RowView y, int64_t rows) {
  const int64_t D = s.D;
  const int64_t ms = s.has_mask ? last_stride(s.mask) : 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t mrow = s.has_mask ? offset_of(s.mask, r * D) : 0;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) mx = MaxNanOp{}(mx, s.at(mrow, ms, r, j));
    mx = block_reduce(mx, MaxNanOp{});
    if (mx == -INFINITY) {  // fully masked
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) store<T>(y, r * D + j, log ? -INFINITY : 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) sum += exp_nonpos(s.at(mrow, ms, r, j) - mx);
    sum = block_reduce(sum, AddOp{});
    if (log) {
      const float shift = mx + logf(sum);
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x) store<T>(y, r * D + j, s.at(mrow, ms, r, j) - shift);
    } else {
      const float inv = 1.0f / sum;
      for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
        store<T>(y, r * D + j, exp_nonpos(s.at(mrow, ms, r, j) - mx) * inv);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(RowView y, RowView g, bool log, RowView dz, int64_t rows, int64_t D) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = r * D;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
      s += log ? load<T>(g, base + j) : load<T>(g, base + j) * load<T>(y, base + j);
    s = block_reduce(s, AddOp{});
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float yv = load<T>(y, base + j), gv = load<T>(g, base + j);
      store<T>(dz, base + j, log ? gv - exp_nonpos(yv) * s : yv * (gv - s));
    }
  }
}

// Elementwise: the raw element or `fill` (exact copies, no f32 round trip needed).
template <class T>
__global__ void diag_mask_kernel(RowView x, int64_t n_past, T fill, T* y, int64_t n, int64_t Tq, int64_t Tk) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % Tk, q = (i / Tk) % Tq;
    y[i] = j <= n_past + q ? reinterpret_cast<const T*>(x.data)[offset_of(x, i)] : fill;
  }
}

int64_t rows_of(const View& v, int64_t D) { return v.numel / (D > 0 ? D : 1); }

}  // namespace

void launch_softmax(const View& x, const View& mask, float scale, bool log, const View& y) {
  const int64_t D = x.ndim > 0 ? x.shape[x.ndim - 1] : 1, rows = rows_of(x, D);
  if (x.numel == 0) return;
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    Scores<T> s{row_view(x), row_view(mask), mask.data != nullptr, scale, D};
    softmax_kernel<T><<<grid_for(rows), row_threads(D), 0, stream()>>>(s, log, row_view(y), rows);
  });
}

void launch_softmax_backward(const View& y, const View& g, bool log, const View& dz) {
  const int64_t D = y.ndim > 0 ? y.shape[y.ndim - 1] : 1, rows = rows_of(y, D);
  if (y.numel == 0) return;
  with_float(y.elem, [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T>
        <<<grid_for(rows), row_threads(D), 0, stream()>>>(row_view(y), row_view(g), log, row_view(dz), rows, D);
  });
}

void launch_diag_mask(const View& x, int64_t n_past, float value, const View& y) {
  if (x.numel == 0) return;
  const int64_t Tk = x.shape[x.ndim - 1], Tq = x.shape[x.ndim - 2];
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    diag_mask_kernel<T><<<grid_for((x.numel + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(
        row_view(x), n_past, from_f<T>(value), static_cast<T*>(y.data), x.numel, Tq, Tk);
  });
}

}  // namespace toy::cuda
