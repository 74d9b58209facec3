// The per-token expert matmul (mul_mat_id) on the GPU, first form, deterministic (no atomics):
//  - forward: a warp per output element (t, u, n), lanes striding over K (coalesced rows of
//    W[ids[t, u]] and x), a butterfly sum;
//  - dx: a thread per element (t, x-slot, k): per pair the sum over n of g W (coalesced over
//    k), summed over the slots sharing x in slot order, as the CPU;
//  - dW: the (t, u) pairs grouped by expert in pair order by one block (counts, offsets, then
//    the lists), then a thread per element (e, n, k) of dW adding its expert's pairs in order.
// W may be F32, F16 or BF16 (read as f32); everything else is F32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/scan_launch.h"

namespace toy::cuda {

namespace {

constexpr int kMoeWarps = 8;        // output elements (warps) per block of the forward
constexpr int kGroupThreads = 256;  // the grouping block
constexpr int kGroupTile = 1024;    // ids staged in shared memory at a time

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <class W>
__device__ __forceinline__ float to_f32(W w) {
  if constexpr (std::is_same_v<W, __half>)
    return __half2float(w);
  else if constexpr (std::is_same_v<W, __nv_bfloat16>)
    return __bfloat162float(w);
  else
    return w;
}

// The row of x that pair (t, u) reads.
__device__ __forceinline__ int64_t x_row(const MulMatIdGeometry& g, int64_t pair) {
  const int64_t t = pair / g.U, u = pair % g.U;
  return t * g.X + (g.X == 1 ? 0 : u);
}

template <class W>
__global__ void mul_mat_id_kernel(MulMatIdGeometry g, float* out) {
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kMoeWarps + threadIdx.x / 32;  // (pair, n)
  if (item >= g.T * g.U * g.N) return;
  const int64_t n = item % g.N, pair = item / g.N;
  const W* wr = static_cast<const W*>(g.w) + (int64_t(g.ids[pair]) * g.N + n) * g.K;
  const float* xr = g.x + x_row(g, pair) * g.K;
  float acc = 0.0f;
  for (int64_t k = lane; k < g.K; k += 32) acc += to_f32(wr[k]) * xr[k];
  acc = warp_sum(acc);
  if (lane == 0) out[item] = acc;
}

// dx[t, s, k] = sum over the pairs (t, u) reading x row (t, s), in u order, of sum_n g W.
template <class W>
__global__ void mul_mat_id_dx_kernel(MulMatIdGeometry g, const float* grad, float* dx) {
  const int64_t n_all = g.T * g.X * g.K;
  const W* w = static_cast<const W*>(g.w);
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n_all;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = idx % g.K, s = (idx / g.K) % g.X, t = idx / (g.K * g.X);
    const int64_t u0 = g.X == 1 ? 0 : s, u1 = g.X == 1 ? g.U : s + 1;
    float acc = 0.0f;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t pair = t * g.U + u;
      const W* wc = w + int64_t(g.ids[pair]) * g.N * g.K + k;
      const float* gr = grad + pair * g.N;
      float sum = 0.0f;
      for (int64_t n = 0; n < g.N; ++n) sum += gr[n] * to_f32(wc[n * g.K]);
      acc += sum;
    }
    dx[idx] = acc;
  }
}

// The pairs grouped by expert: offsets [E + 1], list [pairs] (each expert's pairs in order);
// cursor [E] is scratch. One block: each thread owns experts e = tid, tid + blockDim, ...
__global__ void group_by_expert_kernel(MulMatIdGeometry g, int32_t* offsets, int32_t* cursor, int32_t* list) {
  __shared__ int32_t tile[kGroupTile];
  const int64_t pairs = g.T * g.U;
  for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x) cursor[e] = 0;
  for (int pass = 0; pass < 2; ++pass) {  // counts, then the lists
    if (pass == 1) {
      __syncthreads();
      if (threadIdx.x == 0) {
        int32_t off = 0;
        for (int64_t e = 0; e < g.E; ++e) offsets[e] = off, off += cursor[e];
        offsets[g.E] = off;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x) cursor[e] = offsets[e];
    }
    for (int64_t base = 0; base < pairs; base += kGroupTile) {
      const int64_t m = pairs - base < kGroupTile ? pairs - base : kGroupTile;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < m; i += blockDim.x) tile[i] = g.ids[base + i];
      __syncthreads();
      for (int64_t e = threadIdx.x; e < g.E; e += blockDim.x) {
        int32_t c = cursor[e];
        for (int64_t i = 0; i < m; ++i)
          if (tile[i] == e) {
            if (pass == 1) list[c] = int32_t(base + i);
            ++c;
          }
        cursor[e] = c;
      }
    }
  }
}

// dw[e, n, k] += sum over expert e's pairs, in order, of g[pair, n] x[row(pair), k].
__global__ void mul_mat_id_dw_kernel(MulMatIdGeometry g, const float* grad, const int32_t* offsets,
                                     const int32_t* list, float* dw) {
  const int64_t n_all = g.E * g.N * g.K;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n_all;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = idx % g.K, n = (idx / g.K) % g.N, e = idx / (g.K * g.N);
    float acc = 0.0f;
    for (int32_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      const int64_t pair = list[i];
      acc += grad[pair * g.N + n] * g.x[x_row(g, pair) * g.K + k];
    }
    dw[idx] += acc;
  }
}

// Calls f with a value of W's C++ type (the glue refuses other element types).
template <class F>
void with_weight_type(Elem e, F&& f) {
  switch (e) {
    case Elem::F16: f(__half{}); break;
    case Elem::BF16: f(__nv_bfloat16{}); break;
    default: f(float{}); break;
  }
}

}  // namespace

void launch_mul_mat_id(const MulMatIdGeometry& g, float* out) {
  const int64_t items = g.T * g.U * g.N;
  if (items == 0) return;
  const unsigned blocks = unsigned((items + kMoeWarps - 1) / kMoeWarps);
  with_weight_type(g.w_elem, [&](auto w) {
    mul_mat_id_kernel<decltype(w)><<<blocks, kMoeWarps * 32, 0, stream()>>>(g, out);
  });
}

int64_t mul_mat_id_backward_scratch(const MulMatIdGeometry& g) { return 2 * g.E + 1 + g.T * g.U; }

void launch_mul_mat_id_backward(const MulMatIdGeometry& g, const float* grad, float* dx, float* dw,
                                int32_t* scratch) {
  const int64_t n_dx = g.T * g.X * g.K;
  if (dx && n_dx > 0)
    with_weight_type(g.w_elem, [&](auto w) {
      mul_mat_id_dx_kernel<decltype(w)><<<blocks_for(n_dx), kThreads, 0, stream()>>>(g, grad, dx);
    });
  const int64_t n_dw = g.E * g.N * g.K;
  if (!dw || n_dw == 0) return;
  int32_t *offsets = scratch, *cursor = scratch + g.E + 1, *list = cursor + g.E;
  group_by_expert_kernel<<<1, kGroupThreads, 0, stream()>>>(g, offsets, cursor, list);
  mul_mat_id_dw_kernel<<<blocks_for(n_dw), kThreads, 0, stream()>>>(g, grad, offsets, list, dw);
}

}  // namespace toy::cuda
