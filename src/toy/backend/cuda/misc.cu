// add_id, argsort, top_k and Gated DeltaNet's q/k/v split with its L2 norms (+ backward), as
// the CPU computes them (reduce.cpp, moe.cpp, gated_delta.cpp):
//  - add_id and the v copies: one thread per output element (grid-stride loops);
//  - argsort / top_k: a block per row sorts (key, position) pairs packed in 64 bits with a
//    bitonic network, in shared memory for rows of up to kSortSharedLen, in a global scratch
//    (one row's worth per block) beyond. The key orders the values as the CPU's
//    less_nan_last (NaN above +inf, -0 equal to +0; bit-flipped for descending) and the
//    position breaks ties, so every pair differs and the sorted order is the CPU's stable one;
//  - the split norms: a warp per (row, head, q or k): its lanes stride over the head's D
//    values, a butterfly sums the squares (or y . dy) in a fixed order, every lane gets the
//    same sum and writes its own elements.
#include <climits>

#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/misc_launch.h"

namespace toy::cuda {

namespace {

__device__ __forceinline__ int64_t first_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

template <class T>
__device__ __forceinline__ float at(const DeviceView& v, int64_t i) {
  return load_f<T>(v, offset_of(v, i));
}
__device__ __forceinline__ int32_t at_i32(const DeviceView& v, int64_t i) {
  return reinterpret_cast<const int32_t*>(v.data)[offset_of(v, i)];
}

// Calls f with a value of the C++ type of a float element type (the glue refuses others).
template <class F>
void with_float_type(Elem e, F&& f) {
  with_type(e, [&](auto t) {
    if constexpr (!std::is_same_v<decltype(t), int32_t>) f(t);
  });
}

// ---- add_id --------------------------------------------------------------------------------------

__global__ void add_id_kernel(DeviceView x, DeviceView b, DeviceView ids, float* out, int64_t N, int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_step()) {
    const int64_t n = i % N, pair = i / N;
    const int64_t e = at_i32(ids, pair);
    out[i] = at<float>(x, i) + at<float>(b, e * N + n);
  }
}

// ---- argsort / top_k -----------------------------------------------------------------------------

constexpr int kMaxSortThreads = 1024;
// Scratch rows in flight for long rows (pairs of 8 bytes): at most 64 MiB unless one row needs more.
constexpr int64_t kScratchPairs = int64_t(1) << 23;
constexpr int64_t kMaxGrid = int64_t(1) << 20;

// The smallest power of two >= n (1 for n <= 1).
inline int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
// Blocks of a sort launch: one per row, capped; rows past shared memory also by the scratch.
inline int64_t sort_blocks(int64_t rows, int64_t P) {
  int64_t b = rows < kMaxGrid ? rows : kMaxGrid;
  if (P > kSortSharedLen) {
    const int64_t cap = kScratchPairs / P > 0 ? kScratchPairs / P : 1;
    if (b > cap) b = cap;
  }
  return b > 0 ? b : 1;
}
inline int sort_threads(int64_t P) {
  const int64_t half = P / 2;
  return int(half < 32 ? 32 : (half > kMaxSortThreads ? kMaxSortThreads : half));
}

// An unsigned key ordered as the CPU's less_nan_last orders floats: every NaN above +inf and
// equal to the others, -0 equal to +0 (the order-preserving map of the IEEE bits otherwise).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0xFFFFFFFFu;
  uint32_t u = __float_as_uint(v);
  if ((u << 1) == 0) u = 0;  // -0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Sorts buf[0, P) ascending (P a power of two) with the whole block; ends with a barrier.
__device__ void bitonic_sort(uint64_t* buf, int64_t P) {
  for (int64_t k = 2; k <= P; k <<= 1)
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t p = threadIdx.x; p < P / 2; p += blockDim.x) {
        const int64_t i = (p / j) * 2 * j + p % j, l = i + j;  // the pair (i, i + j), i's bit j clear
        const uint64_t a = buf[i], b = buf[l];
        const bool up = (i & k) == 0;
        if (up ? a > b : a < b) buf[i] = b, buf[l] = a;
      }
      __syncthreads();
    }
}

// Sorts each row of x (length L, padded to P) and writes the first `count` positions to
// idx[row * count + j] and, when val is non-null, their values to val[row * count + j].
template <class T>
__global__ void sort_rows_kernel(DeviceView x, int64_t rows, int64_t L, int64_t P, bool descending,
                                 uint64_t* scratch, int64_t count, int32_t* idx, T* val) {
  __shared__ uint64_t tile[kSortSharedLen];
  uint64_t* buf = P <= kSortSharedLen ? tile : scratch + int64_t(blockIdx.x) * P;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
      uint64_t e = ~uint64_t(0);  // padding: after every real pair
      if (i < L) {
        const uint32_t key = order_key(at<T>(x, row * L + i));
        e = (uint64_t(descending ? ~key : key) << 32) | uint64_t(uint32_t(i));
      }
      buf[i] = e;
    }
    __syncthreads();
    bitonic_sort(buf, P);
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const int32_t pos = int32_t(uint32_t(buf[j] & 0xFFFFFFFFu));
      idx[row * count + j] = pos;
      if (val) val[row * count + j] = elem_of<T>(at<T>(x, row * L + pos));
    }
    __syncthreads();  // (the next row overwrites buf)
  }
}

template <class T>
void launch_sort(const View& x, bool descending, int64_t count, int32_t* idx, T* val, void* scratch) {
  const int64_t L = x.ndim > 0 ? x.shape[x.ndim - 1] : 1;
  const int64_t rows = L > 0 ? x.numel / L : 0;
  if (rows == 0 || count == 0) return;
  const int64_t P = pow2_at_least(L);
  sort_rows_kernel<T><<<unsigned(sort_blocks(rows, P)), sort_threads(P), 0, stream()>>>(
      device_view(x), rows, L, P, descending, static_cast<uint64_t*>(scratch), count, idx, val);
}

// ---- gdn split norm ------------------------------------------------------------------------------

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ int64_t first_warp() {
  return int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
}
__device__ __forceinline__ int64_t warp_step() { return int64_t(gridDim.x) * kWarpsPerBlock; }

// Item (r, h, part) per warp: y = x * inv (q: * q_scale), inv = 1 / max(|x|, eps), x the
// head's D values of row r of c (q heads first, then k heads).
__global__ void gdn_norm_kernel(DeviceView c, int64_t rows, int64_t Hk, int64_t D, int64_t C, float eps, float q_scale,
                                float* q, float* k, float* q_inv, float* k_inv) {
  const int lane = threadIdx.x & 31;
  for (int64_t item = first_warp(); item < rows * Hk * 2; item += warp_step()) {
    const int part = int(item % 2);
    const int64_t rh = item / 2, h = rh % Hk, r = rh / Hk;
    const int64_t base = r * C + (part * Hk + h) * D;
    float ss = 0.0f;
    for (int64_t j = lane; j < D; j += 32) {
      const float v = at<float>(c, base + j);
      ss += v * v;
    }
    ss = warp_sum(ss);
    const float norm = sqrtf(ss);
    const float inv = 1.0f / (norm < eps ? eps : norm);  // (std::max(norm, eps): NaN stays NaN)
    const float m = part ? inv : inv * q_scale;
    float* y = (part ? k : q) + rh * D;
    for (int64_t j = lane; j < D; j += 32) y[j] = at<float>(c, base + j) * m;
    if (lane == 0) (part ? k_inv : q_inv)[rh] = inv;
  }
}

// v[r, j] = c[r, 2 Hk D + j], j < Hv D.
__global__ void gdn_copy_v_kernel(DeviceView c, int64_t off, int64_t width, int64_t C, float* v, int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_step()) v[i] = at<float>(c, (i / width) * C + off + i % width);
}

// Item (r, h, part) per warp: y = s x inv with n = y / s the unit vector, so
// dx = s inv (dy - n (n . dy)) = s inv (dy - y (y . dy) / s^2), or s inv dy where the norm was
// clamped at eps.
__global__ void gdn_norm_backward_kernel(DeviceView q, DeviceView k, DeviceView q_inv, DeviceView k_inv,
                                         DeviceView dq, DeviceView dk, int64_t rows, int64_t Hk, int64_t D,
                                         int64_t C, float eps, float q_scale, float* dc) {
  const int lane = threadIdx.x & 31;
  for (int64_t item = first_warp(); item < rows * Hk * 2; item += warp_step()) {
    const int part = int(item % 2);
    const int64_t rh = item / 2, h = rh % Hk, r = rh / Hk;
    const DeviceView& y = part ? k : q;
    const DeviceView& dy = part ? dk : dq;
    const float inv = at<float>(part ? k_inv : q_inv, rh), s = part ? 1.0f : q_scale;
    const bool clamped = inv >= 1.0f / eps;  // (the same for every lane: the sum below is warp-wide)
    float proj = 0.0f;
    if (!clamped) {
      float d = 0.0f;
      for (int64_t j = lane; j < D; j += 32) d += at<float>(y, rh * D + j) * at<float>(dy, rh * D + j);
      proj = warp_sum(d) / (s * s);
    }
    float* dx = dc + r * C + (part * Hk + h) * D;
    for (int64_t j = lane; j < D; j += 32)
      dx[j] = s * inv * (at<float>(dy, rh * D + j) - at<float>(y, rh * D + j) * proj);
  }
}

// dc[r, 2 Hk D + j] = dv[r, j], j < Hv D.
__global__ void gdn_copy_dv_kernel(DeviceView dv, int64_t off, int64_t width, int64_t C, float* dc, int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_step()) dc[(i / width) * C + off + i % width] = at<float>(dv, i);
}

inline unsigned warp_blocks(int64_t items) {
  const int64_t b = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return unsigned(b < 1 ? 1 : (b > kMaxGrid ? kMaxGrid : b));
}

}  // namespace

void launch_add_id(const View& x, const View& b, const View& ids, const View& out) {
  if (out.numel == 0) return;
  const int64_t N = out.shape[out.ndim - 1];
  add_id_kernel<<<blocks_for(out.numel), kThreads, 0, stream()>>>(device_view(x), device_view(b), device_view(ids),
                                                                  static_cast<float*>(out.data), N, out.numel);
}

int64_t sort_scratch_words(int64_t rows, int64_t L) {
  const int64_t P = pow2_at_least(L);
  if (rows == 0 || P <= kSortSharedLen) return 0;
  return sort_blocks(rows, P) * P * 2;
}

void launch_argsort(const View& x, bool descending, const View& indices, void* scratch) {
  const int64_t L = x.ndim > 0 ? x.shape[x.ndim - 1] : 1;
  with_float_type(x.elem, [&](auto tag) {
    using T = decltype(tag);
    launch_sort<T>(x, descending, L, static_cast<int32_t*>(indices.data), static_cast<T*>(nullptr), scratch);
  });
}

void launch_top_k(const View& x, int64_t k, const View& values, const View& indices, void* scratch) {
  with_float_type(x.elem, [&](auto tag) {
    using T = decltype(tag);
    launch_sort<T>(x, true, k, static_cast<int32_t*>(indices.data), static_cast<T*>(values.data), scratch);
  });
}

void launch_gdn_split_norm(const View& c, int64_t Hk, int64_t Hv, int64_t D, float eps, float q_scale, const View& q,
                           const View& k, const View& v, const View& q_inv, const View& k_inv) {
  const int64_t rows = c.shape[0] * c.shape[1], C = c.shape[2];
  if (rows == 0) return;
  if (Hk * D > 0)
    gdn_norm_kernel<<<warp_blocks(rows * Hk * 2), 32 * kWarpsPerBlock, 0, stream()>>>(
        device_view(c), rows, Hk, D, C, eps, q_scale, static_cast<float*>(q.data), static_cast<float*>(k.data),
        static_cast<float*>(q_inv.data), static_cast<float*>(k_inv.data));
  if (v.numel > 0)
    gdn_copy_v_kernel<<<blocks_for(v.numel), kThreads, 0, stream()>>>(device_view(c), 2 * Hk * D, Hv * D, C,
                                                                      static_cast<float*>(v.data), v.numel);
}

void launch_gdn_split_norm_backward(const View& q, const View& k, const View& q_inv, const View& k_inv, float eps,
                                    float q_scale, const View& dq, const View& dk, const View& dv, const View& dc) {
  const int64_t rows = dc.shape[0] * dc.shape[1], C = dc.shape[2], Hk = q.shape[2], D = q.shape[3];
  const int64_t Hv = dv.shape[2];
  if (rows == 0) return;
  if (Hk * D > 0)
    gdn_norm_backward_kernel<<<warp_blocks(rows * Hk * 2), 32 * kWarpsPerBlock, 0, stream()>>>(
        device_view(q), device_view(k), device_view(q_inv), device_view(k_inv), device_view(dq), device_view(dk), rows,
        Hk, D, C, eps, q_scale, static_cast<float*>(dc.data));
  if (dv.numel > 0)
    gdn_copy_dv_kernel<<<blocks_for(dv.numel), kThreads, 0, stream()>>>(device_view(dv), 2 * Hk * D, Hv * D, C,
                                                                        static_cast<float*>(dc.data), dv.numel);
}

}  // namespace toy::cuda
