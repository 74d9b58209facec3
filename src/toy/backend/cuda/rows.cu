// Row gather and scatter on the GPU: get_rows (float tables copied bit for bit, Q8_0 tables
// dequantized), its backward scatter-add and set_rows. Both writers are deterministic without
// atomics: the (id, position) pairs are sorted stably (cub's radix sort), so each id's
// positions form one run in increasing order, and one thread per (run, column) does what the
// CPU does for that element: adds the run's rows in order (rounding to the table's type after
// each add), or writes the run's last row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cstdint>
#include <type_traits>

#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/train_launch.h"

namespace toy::cuda {

namespace {


__device__ __forceinline__ int32_t id_at(const DeviceView& ids, int64_t i) {
  return reinterpret_cast<const int32_t*>(ids.data)[offset_of(ids, i)];
}

// A [rows, cols] matrix's element (r, c), by its two strides.
struct Mat {
  char* data;
  int64_t s0, s1;
};
Mat mat(const View& v) { return Mat{static_cast<char*>(v.data), v.stride[0], v.ndim > 1 ? v.stride[1] : 1}; }

template <class F>
void with_float(Elem e, F&& f) {
  switch (e) {
    case Elem::F32: f(float{}); break;
    case Elem::F16: f(__half{}); break;
    case Elem::BF16: f(__nv_bfloat16{}); break;
    case Elem::I32: break;  // (the glue refuses it)
  }
}

// ---- get_rows --------------------------------------------------------------------------------

// U: an unsigned type of the element's size (the bits are copied, as the CPU's memcpy).
template <class U>
__global__ void get_rows_kernel(Mat table, DeviceView ids, U* out, int64_t N, int64_t D) {
  const U* t = reinterpret_cast<const U*>(table.data);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < N * D; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / D, c = e % D;
    out[e] = t[int64_t(id_at(ids, i)) * table.s0 + c * table.s1];
  }
}

// Q8_0 blocks: a half scale d (little-endian) and 32 int8 q; x = d * q.
__global__ void get_rows_q8_0_kernel(const uint8_t* table, int64_t row_bytes, DeviceView ids, float* out, int64_t N,
                                     int64_t D) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < N * D; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / D, c = e % D;
    const uint8_t* b = table + int64_t(id_at(ids, i)) * row_bytes + (c / 32) * 34;
    const unsigned short bits = static_cast<unsigned short>(b[0] | (b[1] << 8));
    const float d = __half2float(__ushort_as_half(bits));
    out[e] = d * float(reinterpret_cast<const int8_t*>(b + 2)[c % 32]);
  }
}

// ---- the sort of (id, position) pairs ---------------------------------------------------------

__global__ void pairs_kernel(DeviceView ids, int64_t N, uint32_t* keys, int32_t* pos) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = uint32_t(id_at(ids, i));
    pos[i] = int32_t(i);
  }
}

// The pairs of ids, sorted (stable: equal ids keep their positions' order) when there are two
// or more: keys/pos point at the sorted pairs; error is cub's ("" when none).
struct Sorted {
  const uint32_t* keys;
  const int32_t* pos;
  const char* error;
};
Sorted sort_pairs(const View& ids, const RowSort& s) {
  const int64_t N = ids.numel;
  pairs_kernel<<<blocks_for(N), kThreads, 0, stream()>>>(device_view(ids), N, s.keys_in, s.pos_in);
  if (N < 2) return {s.keys_in, s.pos_in, ""};
  size_t bytes = s.temp_bytes;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(s.temp, bytes, s.keys_in, s.keys_out, s.pos_in, s.pos_out,
                                                        int(N), 0, s.end_bit, stream());
  return {s.keys_out, s.pos_out, e == cudaSuccess ? "" : cudaGetErrorString(e)};
}

// ---- get_rows_backward ------------------------------------------------------------------------

// Thread (s, c) with s the first of a run of equal ids: dtable[id, c] += g[pos, c] for the
// run's positions in order, rounding to T after each add (the CPU's from_f32(to_f32 + to_f32)).
template <class T>
__global__ void scatter_add_kernel(const uint32_t* keys, const int32_t* pos, int64_t N, int64_t D, Mat g, Mat dt) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < N * D; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = e / D, c = e % D;
    const uint32_t id = keys[s];
    if (s > 0 && keys[s - 1] == id) continue;
    T* dst = reinterpret_cast<T*>(dt.data) + int64_t(id) * dt.s0 + c * dt.s1;
    const T* gp = reinterpret_cast<const T*>(g.data);
    T acc = *dst;
    for (int64_t j = s; j < N && keys[j] == id; ++j) acc = elem_of<T>(to_float(acc) + to_float(gp[pos[j] * g.s0 + c * g.s1]));
    *dst = acc;
  }
}

// ---- set_rows ---------------------------------------------------------------------------------

// Thread (s, c) with s the last of a run: dst[id, c] = src[pos, c] converted (the last write
// of the CPU's loop).
template <class S, class T>
__global__ void set_rows_kernel(const uint32_t* keys, const int32_t* pos, int64_t N, int64_t D, Mat src, Mat dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < N * D; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = e / D, c = e % D;
    const uint32_t id = keys[s];
    if (s + 1 < N && keys[s + 1] == id) continue;
    const S x = reinterpret_cast<const S*>(src.data)[pos[s] * src.s0 + c * src.s1];
    T* out = reinterpret_cast<T*>(dst.data) + int64_t(id) * dst.s0 + c * dst.s1;
    if constexpr (std::is_same_v<S, T>)
      *out = x;
    else
      *out = elem_of<T>(to_float(x));
  }
}

}  // namespace

size_t row_sort_temp_bytes(int64_t n, int end_bit) {
  if (n < 2) return 0;
  size_t bytes = 0;
  const uint32_t* keys = nullptr;
  const int32_t* pos = nullptr;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, const_cast<uint32_t*>(keys), pos, const_cast<int32_t*>(pos),
                                  int(n), 0, end_bit, stream());
  return bytes;
}

void launch_get_rows(const View& table, const View& ids, const View& out) {
  const int64_t N = ids.numel, D = table.shape[1];
  if (N * D == 0) return;
  const Mat t = mat(table);
  if (table.elem == Elem::F32)
    get_rows_kernel<uint32_t><<<blocks_for(N * D), kThreads, 0, stream()>>>(t, device_view(ids),
                                                                           static_cast<uint32_t*>(out.data), N, D);
  else
    get_rows_kernel<uint16_t><<<blocks_for(N * D), kThreads, 0, stream()>>>(t, device_view(ids),
                                                                           static_cast<uint16_t*>(out.data), N, D);
}

void launch_get_rows_q8_0(const void* table, int64_t row_bytes, const View& ids, float* out, int64_t D) {
  const int64_t N = ids.numel;
  if (N * D == 0) return;
  get_rows_q8_0_kernel<<<blocks_for(N * D), kThreads, 0, stream()>>>(static_cast<const uint8_t*>(table), row_bytes,
                                                                     device_view(ids), out, N, D);
}

const char* launch_scatter_add_rows(const View& g, const View& ids, const View& dtable, const RowSort& s) {
  const int64_t N = ids.numel, D = dtable.shape[1];
  if (N * D == 0) return "";
  const Sorted p = sort_pairs(ids, s);
  if (*p.error) return p.error;
  with_float(dtable.elem, [&](auto t) {
    using T = decltype(t);
    scatter_add_kernel<T><<<blocks_for(N * D), kThreads, 0, stream()>>>(p.keys, p.pos, N, D, mat(g), mat(dtable));
  });
  return "";
}

const char* launch_set_rows(const View& dst, const View& ids, const View& src, const RowSort& s) {
  const int64_t N = ids.numel, D = dst.shape[1];
  if (N * D == 0) return "";
  const Sorted p = sort_pairs(ids, s);
  if (*p.error) return p.error;
  with_float(src.elem, [&](auto sv) {
    with_float(dst.elem, [&](auto dv) {
      set_rows_kernel<decltype(sv), decltype(dv)>
          <<<blocks_for(N * D), kThreads, 0, stream()>>>(p.keys, p.pos, N, D, mat(src), mat(dst));
    });
  });
  return "";
}

}  // namespace toy::cuda
