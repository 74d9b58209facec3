// Elementwise CUDA kernels: fill, copy (with conversion), binary. Each thread handles
// elements of the row-major order in a grid-stride loop and finds their offsets from the
// view's shape and strides, so any layout (broadcast zero strides included) works. The common
// layouts take flat forms, four elements a thread with one vector load and store: contiguous
// copies and casts, a row broadcast down a contiguous output (a bias), and binary ops on
// contiguous operands (the same values; only the memory traffic differs).
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
__device__ __forceinline__ D convert(S x) {
  if constexpr (std::is_same_v<S, D>)
    return x;
  else if constexpr (std::is_same_v<S, int32_t>)
    return static_cast<D>(float(x));
  else if constexpr (std::is_same_v<D, int32_t>)
    return int32_t(static_cast<float>(x));
  else
    return static_cast<D>(static_cast<float>(x));
}

template <class S, class D>
__global__ void copy_kernel(DeviceView src, DeviceView dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    reinterpret_cast<D*>(dst.data)[offset_of(dst, i)] =
        convert<S, D>(reinterpret_cast<const S*>(src.data)[offset_of(src, i)]);
}

// Four elements, loaded or stored as one (the pointer aligned to the whole).
template <class T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

// dst (contiguous, n4 groups of four) = src's group k % period4: a contiguous source
// (period4 = n4) or one row repeated down the output (a broadcast bias, period4 = row / 4).
template <class S, class D>
__global__ void copy_four_kernel(const Four<S>* src, Four<D>* dst, int64_t n4, int64_t period4) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n4; k += int64_t(gridDim.x) * blockDim.x) {
    const Four<S> a = src[period4 == n4 ? k : k % period4];
    Four<D> b;
#pragma unroll
    for (int j = 0; j < 4; ++j) b.v[j] = convert<S, D>(a.v[j]);
    dst[k] = b;
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

template <class T>
__global__ void binary_four_kernel(int op, const Four<T>* a, const Four<T>* b, Four<T>* out, int64_t n4) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n4; k += int64_t(gridDim.x) * blockDim.x) {
    const Four<T> x = a[k], y = b[k];
    Four<T> r;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p = static_cast<float>(x.v[j]), q = static_cast<float>(y.v[j]);
      r.v[j] = static_cast<T>(op == 0 ? p + q : op == 1 ? p - q : op == 2 ? p * q : p / q);
    }
    out[k] = r;
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The length of src's repeated row when src is a row (unit last stride) broadcast along every
// other dimension (stride 0), else 0.
int64_t broadcast_row(const View& src) {
  if (src.ndim == 0 || src.stride[src.ndim - 1] != 1) return 0;
  for (int d = 0; d < src.ndim - 1; ++d)
    if (src.stride[d] != 0 && src.shape[d] != 1) return 0;
  return src.shape[src.ndim - 1];
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
  const int64_t row = src.contiguous ? dst.numel : broadcast_row(src);
  with_type(src.elem, [&](auto s) {
    with_type(dst.elem, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      if (dst.contiguous && row > 0 && row % 4 == 0 && dst.numel % 4 == 0 && aligned(src.data, sizeof(Four<S>)) &&
          aligned(dst.data, sizeof(Four<D>))) {
        copy_four_kernel<S, D><<<blocks_for(dst.numel / 4), kThreads, 0, stream()>>>(
            static_cast<const Four<S>*>(src.data), static_cast<Four<D>*>(dst.data), dst.numel / 4, row / 4);
        return;
      }
      copy_kernel<S, D><<<blocks_for(dst.numel), kThreads, 0, stream()>>>(device_view(src), device_view(dst), dst.numel);
    });
  });
}

void launch_binary(int op, const View& a, const View& b, const View& out) {
  if (out.numel == 0) return;
  with_type(out.elem, [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, int32_t>) {
      if (a.contiguous && b.contiguous && a.numel == out.numel && b.numel == out.numel && out.numel % 4 == 0 &&
          aligned(a.data, sizeof(Four<T>)) && aligned(b.data, sizeof(Four<T>)) && aligned(out.data, sizeof(Four<T>))) {
        binary_four_kernel<T><<<blocks_for(out.numel / 4), kThreads, 0, stream()>>>(
            op, static_cast<const Four<T>*>(a.data), static_cast<const Four<T>*>(b.data), static_cast<Four<T>*>(out.data),
            out.numel / 4);
        return;
      }
      binary_kernel<T><<<blocks_for(out.numel), kThreads, 0, stream()>>>(op, device_view(a), device_view(b),
                                                                         static_cast<T*>(out.data), out.numel);
    }
  });
}

}  // namespace toy::cuda
