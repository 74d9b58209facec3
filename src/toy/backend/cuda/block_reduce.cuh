// What the row kernels (reduce.cu, softmax.cu, norm.cu, loss.cu) share: a strided view walked
// by offset_of, f32 loads and stores of the float types, deterministic warp and block
// reductions, and the launch shapes. The reductions combine in a fixed order (a butterfly in
// each warp, then the warps' partials read in warp order by every thread), so a result never
// depends on timing and every thread of a block gets the same bits.
// (Everything sits in an unnamed namespace inside toy::cuda::red: each .cu file gets its own
// copy, and the names cannot clash with another file's helpers.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "toy/backend/cuda/cuda_launch.h"
#include "toy/backend/cuda/device_view.cuh"

namespace toy::cuda::red {
namespace {

// ---- views ---------------------------------------------------------------------------------------

// The strided view of device_view.cuh (DeviceView, offset_of), under the name these files use.
using RowView = DeviceView;
inline RowView row_view(const View& v) { return device_view(v); }

// The stride of the last dimension (0 for a scalar).
__device__ __forceinline__ int64_t last_stride(const RowView& v) {
  if (v.contiguous) return 1;
  return v.ndim > 0 ? v.stride[v.ndim - 1] : 0;
}

// ---- f32 loads and stores ------------------------------------------------------------------------

__host__ __device__ __forceinline__ float to_f(float x) { return x; }
__host__ __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round to nearest even, as the CPU's from_f32 does (on the host too: fill values).
template <class T>
__host__ __device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

// Element i (row-major) of v, as f32.
template <class T>
__device__ __forceinline__ float load(const RowView& v, int64_t i) {
  return to_f(reinterpret_cast<const T*>(v.data)[offset_of(v, i)]);
}
template <class T>
__device__ __forceinline__ void store(const RowView& v, int64_t i, float x) {
  reinterpret_cast<T*>(v.data)[offset_of(v, i)] = from_f<T>(x);
}

// A scalar of a runtime float type (device scalars of the loss's dtype).
__device__ __forceinline__ float load_scalar(const void* p, Elem e) {
  switch (e) {
    case Elem::F16: return __half2float(*static_cast<const __half*>(p));
    case Elem::BF16: return __bfloat162float(*static_cast<const __nv_bfloat16*>(p));
    case Elem::I32: return float(*static_cast<const int32_t*>(p));
    default: return *static_cast<const float*>(p);
  }
}
__device__ __forceinline__ void store_scalar(void* p, Elem e, float x) {
  switch (e) {
    case Elem::F16: *static_cast<__half*>(p) = __float2half_rn(x); break;
    case Elem::BF16: *static_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(x); break;
    case Elem::I32: *static_cast<int32_t*>(p) = int32_t(x); break;
    default: *static_cast<float*>(p) = x; break;
  }
}

// exp(x) for x <= 0 as the CPU's exp_nonpos: 0 below -87.3365 (no subnormal results), so
// tiny probabilities flush exactly as they do there.
__device__ __forceinline__ float exp_nonpos(float x) { return x < -87.3365402f ? 0.0f : expf(x); }

// ---- reductions ----------------------------------------------------------------------------------

// The value and position of a maximum; i = INT32_MAX marks "none yet".
struct MaxIdx {
  float v;
  int32_t i;
};

struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ double operator()(double a, double b) const { return a + b; }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
  __device__ __forceinline__ double2 operator()(double2 a, double2 b) const {
    return make_double2(a.x + b.x, a.y + b.y);
  }
};

// max that propagates NaN (a row holding NaN gives NaN, as the CPU's rows do).
struct MaxNanOp {
  __device__ __forceinline__ float operator()(float a, float b) const {
    if (isnan(a)) return a;
    if (isnan(b)) return b;
    return b > a ? b : a;
  }
};

// The first maximum: NaN beats every number (the first NaN wins, as the CPU's scan stops at
// it), then the larger value, then the lower position. Symmetric, so the order of a tree
// of combines does not change the result.
struct FirstMaxOp {
  __device__ __forceinline__ MaxIdx operator()(MaxIdx a, MaxIdx b) const {
    const bool na = isnan(a.v), nb = isnan(b.v);
    if (na != nb) return na ? a : b;
    if (!na && a.v != b.v) return a.v > b.v ? a : b;
    return a.i <= b.i ? a : b;
  }
};

__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int m) { return make_float2(shfl_xor(v.x, m), shfl_xor(v.y, m)); }
__device__ __forceinline__ double2 shfl_xor(double2 v, int m) {
  return make_double2(shfl_xor(v.x, m), shfl_xor(v.y, m));
}
__device__ __forceinline__ MaxIdx shfl_xor(MaxIdx v, int m) {
  return MaxIdx{shfl_xor(v.v, m), __shfl_xor_sync(0xffffffffu, v.i, m)};
}

// A butterfly over the 32 lanes (all must be active).
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  return v;
}

// Over the whole (1-D, a multiple of 32 threads) block; every thread must call it, and every
// thread gets lane 0's warp results combined in warp order. Safe to call back to back (the
// first barrier waits for the readers of the previous call).
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op) {
  __shared__ T part[32];
  v = warp_reduce(v, op);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, warps = int(blockDim.x) >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < warps; ++w) r = op(r, part[w]);
  return r;
}

// ---- launch shapes -------------------------------------------------------------------------------

constexpr int kMaxRowThreads = 512;  // threads of a row's block (longer rows loop)
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // blocks of a grid (more rows loop)

// A block for rows of n: n rounded up to a warp, at most kMaxRowThreads.
inline int row_threads(int64_t n) {
  const int64_t t = (n + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > kMaxRowThreads ? kMaxRowThreads : t));
}
inline unsigned grid_for(int64_t blocks) {
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}
// (stream(): device_view.cuh's)

// Calls f with a value of the C++ type of a float Elem (the glue refuses the others first).
template <class F>
void with_float(Elem e, F&& f) {
  switch (e) {
    case Elem::F32: f(float{}); break;
    case Elem::F16: f(__half{}); break;
    case Elem::BF16: f(__nv_bfloat16{}); break;
    case Elem::I32: break;
  }
}

}  // namespace
}  // namespace toy::cuda::red
