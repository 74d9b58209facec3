// What the elementwise CUDA kernels (elementwise.cu, unary.cu) share: a View as a kernel
// argument walked by offset_of, f32 loads and stores of the element types, the launch shape
// of a grid-stride loop and the type dispatch. (All in an unnamed namespace: each .cu file
// gets its own copy.)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "toy/backend/cuda/cuda_launch.h"

namespace toy::cuda {
namespace {

// A View as a kernel argument (no pointer to host memory inside).
struct DeviceView {
  char* data;
  int32_t ndim;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];
  bool contiguous;
};

inline DeviceView device_view(const View& v) {
  DeviceView d{};
  d.data = static_cast<char*>(v.data);
  d.ndim = v.ndim;
  d.contiguous = v.contiguous;
  for (int i = 0; i < kMaxDims; ++i) d.shape[i] = v.shape[i], d.stride[i] = v.stride[i];
  return d;
}

// The element offset of element i of the row-major order (i itself when contiguous).
__device__ __forceinline__ int64_t offset_of(const DeviceView& v, int64_t i) {
  if (v.contiguous) return i;
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    const int64_t n = v.shape[d];
    off += (i % n) * v.stride[d];
    i /= n;
  }
  return off;
}

// Element `off` of a float view as f32, and an f32 stored there rounded to nearest even (as
// the CPU's from_f32).
// A value of a float element type as f32.
template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return float(x);
}
template <class T>
__device__ __forceinline__ float load_f(const DeviceView& v, int64_t off) {
  return to_float(reinterpret_cast<const T*>(v.data)[off]);
}
template <class T>
__device__ __forceinline__ T elem_of(float x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return T(x);
}
template <class T>
__device__ __forceinline__ void store_f(const DeviceView& v, int64_t off, float x) {
  reinterpret_cast<T*>(v.data)[off] = elem_of<T>(x);
}

// Grid-stride loops: kThreads per block, enough blocks for n (capped; the loop does the rest).
constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}
inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

// Calls f with a value of the C++ type of e.
template <class F>
void with_type(Elem e, F&& f) {
  switch (e) {
    case Elem::F32: f(float{}); break;
    case Elem::F16: f(__half{}); break;
    case Elem::BF16: f(__nv_bfloat16{}); break;
    case Elem::I32: f(int32_t{}); break;
  }
}

}  // namespace
}  // namespace toy::cuda
