// Sum and max over one axis of a strided tensor. The output's element t = (o, j) reduces the
// L elements at offset_of(x, o L inner + j) + r * stride[axis], r < L. Two shapes of work:
//  - inner == 1 (the reduced axis is the last logical one): a block per output, its threads
//    striding over r, then a block reduction;
//  - inner > 1: a 32 x 8 block per 32 neighbouring outputs (neighbouring j: coalesced loads
//    for a contiguous x), the 8 rows of threads striding over r, then the 8 partials combined
//    in row order through shared memory;
//  - a few long outputs (a whole-tensor sum: the gradient norm's sum of squares of each
//    parameter): one block would read millions of elements alone, so the axis is cut into
//    chunks of kSplitRows (a function of the shape alone), a block per (output, chunk) writes
//    a partial, and a second kernel combines each output's partials in chunk order;
//  - sums down long columns (a bias gradient: [16384, 768] summed over its rows) the same way:
//    a block per (32 outputs, kColChunkRows rows), partials combined in chunk order.
// Sums accumulate in double, as the CPU's do; max keeps the first maximum (NaN first).
#include <climits>
#include <cmath>

#include "toy/backend/cuda/block_reduce.cuh"
#include "toy/backend/cuda/reduce_launch.h"

namespace toy::cuda {

namespace {

using namespace red;

constexpr int kColTile = 32;  // outputs per block (x threads) in the column kernel
constexpr int kColRows = 8;   // thread rows striding over the reduced axis
// A split reduction's chunk (elements of the axis per block) and the most outputs it serves.
constexpr int64_t kSplitRows = 16384;
constexpr int64_t kSplitMaxOutputs = 64;
constexpr int64_t kColChunkRows = 1024;  // rows of the reduced axis per block of a split column sum

__device__ __forceinline__ MaxIdx no_max() { return MaxIdx{-INFINITY, INT_MAX}; }

template <class T>
__global__ void reduce_rows_kernel(RowView x, int64_t n_out, int64_t L, int64_t sa, bool is_max, T* out,
                                   int32_t* index) {
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* p = reinterpret_cast<const T*>(x.data) + (L > 0 ? offset_of(x, o * L) : 0);
    if (!is_max) {
      double acc = 0.0;
      for (int64_t r = threadIdx.x; r < L; r += blockDim.x) acc += double(to_f(p[r * sa]));
      acc = block_reduce(acc, AddOp{});
      if (threadIdx.x == 0) out[o] = from_f<T>(float(acc));
    } else {
      MaxIdx m = no_max();
      for (int64_t r = threadIdx.x; r < L; r += blockDim.x) m = FirstMaxOp{}(m, MaxIdx{to_f(p[r * sa]), int32_t(r)});
      m = block_reduce(m, FirstMaxOp{});
      if (threadIdx.x == 0) {
        out[o] = from_f<T>(m.v);  // (exact: m.v came from a T)
        if (index) index[o] = m.i;
      }
    }
  }
}

// One (output, chunk) per block: the chunk's partial (a double sum, or the first maximum with
// its position on the whole axis) into partial[o * chunks + c].
template <class T>
__global__ void reduce_chunks_kernel(RowView x, int64_t n_out, int64_t L, int64_t sa, int64_t chunks, bool is_max,
                                     double* sums, MaxIdx* maxes) {
  const int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks;
  if (o >= n_out) return;
  const T* p = reinterpret_cast<const T*>(x.data) + offset_of(x, o * L);
  const int64_t r0 = c * kSplitRows, r1 = r0 + kSplitRows < L ? r0 + kSplitRows : L;
  if (!is_max) {
    double acc = 0.0;
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) acc += double(to_f(p[r * sa]));
    acc = block_reduce(acc, AddOp{});
    if (threadIdx.x == 0) sums[blockIdx.x] = acc;
  } else {
    MaxIdx m = no_max();
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) m = FirstMaxOp{}(m, MaxIdx{to_f(p[r * sa]), int32_t(r)});
    m = block_reduce(m, FirstMaxOp{});
    if (threadIdx.x == 0) maxes[blockIdx.x] = m;
  }
}

// One output per block: its chunks' partials combined (a fixed tree over chunk order).
template <class T>
__global__ void reduce_combine_kernel(int64_t n_out, int64_t chunks, bool is_max, const double* sums,
                                      const MaxIdx* maxes, T* out, int32_t* index) {
  const int64_t o = blockIdx.x;
  if (!is_max) {
    double acc = 0.0;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) acc += sums[o * chunks + c];
    acc = block_reduce(acc, AddOp{});
    if (threadIdx.x == 0) out[o] = from_f<T>(float(acc));
  } else {
    MaxIdx m = no_max();
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) m = FirstMaxOp{}(m, maxes[o * chunks + c]);
    m = block_reduce(m, FirstMaxOp{});
    if (threadIdx.x == 0) {
      out[o] = from_f<T>(m.v);
      if (index) index[o] = m.i;
    }
  }
}

// Block (tile, chunk): the sums of 32 neighbouring outputs over rows [chunk * kColChunkRows, ...)
// into partial[chunk * n_out + t] (8 thread rows, combined in row order as reduce_cols_kernel).
template <class T>
__global__ void reduce_cols_chunks_kernel(RowView x, int64_t n_out, int64_t L, int64_t inner, int64_t sa,
                                          double* partial) {
  __shared__ double sums[kColRows][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles = (n_out + kColTile - 1) / kColTile;
  const int64_t c = blockIdx.x / tiles, t = (blockIdx.x % tiles) * kColTile + tx;
  const int64_t r0 = c * kColChunkRows, r1 = r0 + kColChunkRows < L ? r0 + kColChunkRows : L;
  double acc = 0.0;
  if (t < n_out) {
    const T* p = reinterpret_cast<const T*>(x.data) + offset_of(x, (t / inner) * L * inner + t % inner);
    for (int64_t r = r0 + ty; r < r1; r += kColRows) acc += double(to_f(p[r * sa]));
  }
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && t < n_out) {
    double s = sums[0][tx];
    for (int k = 1; k < kColRows; ++k) s += sums[k][tx];
    partial[c * n_out + t] = s;
  }
}

template <class T>
__global__ void reduce_cols_combine_kernel(int64_t n_out, int64_t chunks, const double* partial, T* out) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n_out; t += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * n_out + t];
    out[t] = from_f<T>(float(s));
  }
}

template <class T>
__global__ void reduce_cols_kernel(RowView x, int64_t n_out, int64_t L, int64_t inner, int64_t sa, bool is_max,
                                   T* out, int32_t* index) {
  __shared__ double sums[kColRows][kColTile];
  __shared__ MaxIdx maxes[kColRows][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t0 = int64_t(blockIdx.x) * kColTile; t0 < n_out; t0 += int64_t(gridDim.x) * kColTile) {
    const int64_t t = t0 + tx;
    const bool live = t < n_out && L > 0;
    const T* p = reinterpret_cast<const T*>(x.data);
    if (live) p += offset_of(x, (t / inner) * L * inner + t % inner);
    if (!is_max) {
      double acc = 0.0;
      if (live)
        for (int64_t r = ty; r < L; r += kColRows) acc += double(to_f(p[r * sa]));
      sums[ty][tx] = acc;
    } else {
      MaxIdx m = no_max();
      if (live)
        for (int64_t r = ty; r < L; r += kColRows) m = FirstMaxOp{}(m, MaxIdx{to_f(p[r * sa]), int32_t(r)});
      maxes[ty][tx] = m;
    }
    __syncthreads();
    if (ty == 0 && t < n_out) {
      if (!is_max) {
        double acc = sums[0][tx];
        for (int k = 1; k < kColRows; ++k) acc += sums[k][tx];
        out[t] = from_f<T>(float(acc));
      } else {
        MaxIdx m = maxes[0][tx];
        for (int k = 1; k < kColRows; ++k) m = FirstMaxOp{}(m, maxes[k][tx]);
        out[t] = from_f<T>(m.v);
        if (index) index[t] = m.i;
      }
    }
    __syncthreads();  // (the next tile overwrites the partials)
  }
}

}  // namespace

int64_t reduce_split_chunks(int op, const View& x, int axis) {
  int64_t n_out = 1, inner = 1;
  for (int d = 0; d < x.ndim; ++d)
    if (d != axis) n_out *= x.shape[d];
  for (int d = axis + 1; d < x.ndim; ++d) inner *= x.shape[d];
  const int64_t L = x.shape[axis];
  if (n_out == 0) return 0;
  if (inner > 1) return op == 0 && L >= 2 * kColChunkRows ? (L + kColChunkRows - 1) / kColChunkRows : 0;
  if (n_out > kSplitMaxOutputs || L < 2 * kSplitRows) return 0;
  return (L + kSplitRows - 1) / kSplitRows;
}

void launch_reduce(int op, const View& x, int axis, const View& out, int32_t* index, void* scratch) {
  if (out.numel == 0) return;
  int64_t L = x.shape[axis], inner = 1;
  for (int d = axis + 1; d < x.ndim; ++d) inner *= x.shape[d];
  const int64_t chunks = reduce_split_chunks(op, x, axis);
  if (chunks > 0 && inner > 1) {
    const RowView xv = row_view(x);
    const int64_t tiles = (out.numel + kColTile - 1) / kColTile;
    with_float(x.elem, [&](auto tag) {
      using T = decltype(tag);
      auto* partial = static_cast<double*>(scratch);
      reduce_cols_chunks_kernel<T><<<unsigned(tiles * chunks), dim3(kColTile, kColRows), 0, stream()>>>(
          xv, out.numel, L, inner, x.stride[axis], partial);
      reduce_cols_combine_kernel<T><<<grid_for((out.numel + 255) / 256), 256, 0, stream()>>>(
          out.numel, chunks, partial, static_cast<T*>(out.data));
    });
    return;
  }
  if (chunks > 0) {
    const int64_t sa = x.stride[axis];
    const bool is_max = op == 1;
    const RowView xv = row_view(x);
    with_float(x.elem, [&](auto tag) {
      using T = decltype(tag);
      auto* sums = static_cast<double*>(scratch);
      auto* maxes = static_cast<MaxIdx*>(scratch);
      reduce_chunks_kernel<T><<<unsigned(out.numel * chunks), 256, 0, stream()>>>(xv, out.numel, L, sa, chunks,
                                                                                   is_max, sums, maxes);
      reduce_combine_kernel<T><<<unsigned(out.numel), 256, 0, stream()>>>(
          out.numel, chunks, is_max, sums, maxes, static_cast<T*>(out.data), index);
    });
    return;
  }
  const int64_t sa = x.stride[axis];
  const bool is_max = op == 1;
  const RowView xv = row_view(x);
  with_float(x.elem, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.data);
    if (inner == 1) {
      reduce_rows_kernel<T><<<grid_for(out.numel), row_threads(L), 0, stream()>>>(xv, out.numel, L, sa, is_max, o,
                                                                                 index);
    } else {
      const dim3 block(kColTile, kColRows);
      reduce_cols_kernel<T><<<grid_for((out.numel + kColTile - 1) / kColTile), block, 0, stream()>>>(
          xv, out.numel, L, inner, sa, is_max, o, index);
    }
  });
}

}  // namespace toy::cuda
