// Elementwise CUDA kernels: fill, copy (with conversion), binary. Each thread handles
// elements of the row-major order in a grid-stride loop and finds their offsets from the
// view's shape and strides, so any layout (broadcast zero strides included) works.
#include "toy/backend/cuda/cuda_launch.h"
#include "toy/backend/cuda/device_view.cuh"

namespace toy::cuda {

namespace {

template <class T>
__global__ void fill_kernel(DeviceView dst, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    reinterpret_cast<T*>(dst.data)[offset_of(dst, i)] = value;
}

template <class S, class D>
__global__ void copy_kernel(DeviceView src, DeviceView dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const S x = reinterpret_cast<const S*>(src.data)[offset_of(src, i)];
    D* out = reinterpret_cast<D*>(dst.data) + offset_of(dst, i);
    if constexpr (std::is_same_v<S, D>)
      *out = x;
    else if constexpr (std::is_same_v<S, int32_t>)
      *out = static_cast<D>(float(x));
    else if constexpr (std::is_same_v<D, int32_t>)
      *out = int32_t(static_cast<float>(x));
    else
      *out = static_cast<D>(static_cast<float>(x));
  }
}

template <class T>
__global__ void binary_kernel(int op, DeviceView a, DeviceView b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = static_cast<float>(reinterpret_cast<const T*>(a.data)[offset_of(a, i)]);
    const float y = static_cast<float>(reinterpret_cast<const T*>(b.data)[offset_of(b, i)]);
    const float r = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
    out[i] = static_cast<T>(r);
  }
}

}  // namespace

void* compute_stream() { return nullptr; }  // the legacy default stream: ordered with cudaMemcpy

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : cudaGetErrorString(e);
}

void launch_fill(const View& dst, double value) {
  if (dst.numel == 0) return;
  with_type(dst.elem, [&](auto t) {
    using T = decltype(t);
    T v;
    if constexpr (std::is_same_v<T, int32_t>) v = int32_t(value); else v = static_cast<T>(float(value));
    fill_kernel<T><<<blocks_for(dst.numel), kThreads, 0, stream()>>>(device_view(dst), dst.numel, v);
  });
}

void launch_copy(const View& src, const View& dst) {
  if (dst.numel == 0) return;
  with_type(src.elem, [&](auto s) {
    with_type(dst.elem, [&](auto d) {
      copy_kernel<decltype(s), decltype(d)>
          <<<blocks_for(dst.numel), kThreads, 0, stream()>>>(device_view(src), device_view(dst), dst.numel);
    });
  });
}

void launch_binary(int op, const View& a, const View& b, const View& out) {
  if (out.numel == 0) return;
  with_type(out.elem, [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, int32_t>)
      binary_kernel<T><<<blocks_for(out.numel), kThreads, 0, stream()>>>(op, device_view(a), device_view(b),
                                                                         static_cast<T*>(out.data), out.numel);
  });
}

}  // namespace toy::cuda
