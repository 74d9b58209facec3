// Cross-entropy fused with log-softmax (the CPU's loss.cpp): a block per row of logits for
// the forward (max, sum of exponentials, lse) and the backward (softmax from lse, minus the
// one-hot, times the row's weight and the device scalars grad * inv); one block for the mean
// over the rows, summed in double. Nothing is read back to the host.
#include <cmath>

#include "toy/backend/cuda/block_reduce.cuh"
#include "toy/backend/cuda/reduce_launch.h"

namespace toy::cuda {

namespace {

using namespace red;

constexpr int kTotalThreads = 1024;

// The row's weight: 0 for the ignore index, else weights[i] (null: 1).
__device__ __forceinline__ float row_weight(const int32_t* t, const float* w, int64_t i, int32_t ignore) {
  if (t[i] == ignore) return 0.0f;
  return w ? w[i] : 1.0f;
}

template <class T>
__global__ void cross_entropy_kernel(RowView z, const int32_t* targets, const float* weights, int32_t ignore,
                                     float* loss, float* lse, int64_t rows, int64_t V) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t base = i * V;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = MaxNanOp{}(mx, load<T>(z, base + j));
    mx = block_reduce(mx, MaxNanOp{});
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += exp_nonpos(load<T>(z, base + j) - mx);
    s = block_reduce(s, AddOp{});
    if (threadIdx.x == 0) {
      const float l = mx + logf(s);
      lse[i] = l;
      const float w = row_weight(targets, weights, i, ignore);
      // (the target's logit is read only for a counted row: an ignored target may be anything)
      loss[i] = w != 0.0f ? w * (l - load<T>(z, base + targets[i])) : 0.0f;
    }
  }
}

__global__ void cross_entropy_total_kernel(const float* rows, int64_t n, const int32_t* targets, const float* weights,
                                           int32_t ignore, float normalizer, void* loss, Elem loss_elem, float* inv) {
  double2 acc = make_double2(0.0, 0.0);  // the loss sum, the counted weight
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    acc.x += double(rows[i]);
    if (targets[i] != ignore) acc.y += weights ? double(weights[i]) : 1.0;
  }
  acc = block_reduce(acc, AddOp{});
  if (threadIdx.x == 0) {
    const double denom = normalizer > 0.0f ? double(normalizer) : acc.y;
    const float k = denom > 0 ? float(1.0 / denom) : 0.0f;
    *inv = k;
    store_scalar(loss, loss_elem, float(acc.x * double(k)));
  }
}

// Each element is read and then written by the same thread, so dlogits may be logits.
template <class T>
__global__ void cross_entropy_backward_kernel(RowView z, const int32_t* targets, const float* weights, int32_t ignore,
                                              const float* lse, const void* grad, Elem grad_elem, const float* inv,
                                              RowView d, int64_t rows, int64_t V) {
  const float scale = load_scalar(grad, grad_elem) * *inv;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const int64_t base = i * V;
    const float w = row_weight(targets, weights, i, ignore) * scale;
    if (w == 0.0f) {
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) store<T>(d, base + j, 0.0f);
      continue;
    }
    const float l = lse[i];
    const int64_t t = targets[i];
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      float v = exp_nonpos(load<T>(z, base + j) - l) * w;
      if (j == t) v = to_f(from_f<T>(v)) - w;  // (the CPU rounds p * w to T, then subtracts)
      store<T>(d, base + j, v);
    }
  }
}

int64_t last_dim(const View& x) { return x.ndim > 0 ? x.shape[x.ndim - 1] : 1; }
int64_t rows_of(const View& x, int64_t V) { return x.numel / (V > 0 ? V : 1); }

}  // namespace

void launch_cross_entropy(const View& logits, const int32_t* targets, const float* weights, int32_t ignore,
                          float* loss, float* lse) {
  const int64_t V = last_dim(logits), rows = rows_of(logits, V);
  if (rows == 0) return;
  with_float(logits.elem, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<grid_for(rows), row_threads(V), 0, stream()>>>(row_view(logits), targets, weights,
                                                                             ignore, loss, lse, rows, V);
  });
}

void launch_cross_entropy_total(const float* loss_rows, int64_t n, const int32_t* targets, const float* weights,
                                int32_t ignore, float normalizer, const View& loss, float* inv) {
  cross_entropy_total_kernel<<<1, kTotalThreads, 0, stream()>>>(loss_rows, n, targets, weights, ignore, normalizer,
                                                                loss.data, loss.elem, inv);
}

void launch_cross_entropy_backward(const View& logits, const int32_t* targets, const float* weights, int32_t ignore,
                                   const float* lse, const View& grad, const float* inv, const View& dlogits) {
  const int64_t V = last_dim(logits), rows = rows_of(logits, V);
  if (rows == 0) return;
  with_float(logits.elem, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<grid_for(rows), row_threads(V), 0, stream()>>>(
        row_view(logits), targets, weights, ignore, lse, grad.data, grad.elem, inv, row_view(dlogits), rows, V);
  });
}

}  // namespace toy::cuda
