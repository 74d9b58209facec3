// The sampler's chain on the GPU (kern::SampleToken), the CPU kernel's steps in its order:
// the first NaN logit (out = -1 - i), penalties, greedy, or temperature with the top-k cut
// over the candidates sorted by (logit descending, id ascending), softmax in double, min-p,
// top-p and the draw at r. Only `out` is written back; everything else stays on the device.
//
// Kernels (one stream, so each sees the previous one's writes; a NaN found first makes the
// later ones return at once, as `out` is then negative):
//  1. prepare (one block): z = logits in f32, the first NaN, the penalties (one thread, in
//     the list's order), and the sort's input pairs when a cut needs sorted candidates;
//  2. greedy (one block): the first maximum; or
//  2'. cub's stable radix sort of (logit, id) pairs, descending (-0 written as +0 so that
//     zeros tie and fall back to id order, as the CPU's comparator has them), then
//  3. chain (one block): softmax over the candidates, the cuts and the draw. Its sums are
//     block reductions and scans in a fixed order (deterministic, not the CPU's left-to-right
//     order: the double sums differ from it in the last bits, as exp itself may).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "toy/backend/cuda/train_launch.h"

namespace toy::cuda {

namespace {

using namespace tmath;

constexpr int kThreads = 1024;  // one block per row (a multiple of 32: the reductions need it)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// ---- block-wide reductions and scan (fixed order: every thread gets the same bits) ---------------

struct AddD {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MinI {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
// The larger value; of two zeros +0 (symmetric, so every lane of a butterfly agrees).
struct MaxF {
  __device__ float operator()(float a, float b) const {
    if (a == b) return signbit(a) ? b : a;
    return a > b ? a : b;
  }
};
// The first maximum: the larger value, of equal values the lower position; i = INT_MAX is
// "none yet".
struct ValIdx {
  float v;
  int i;
};
struct FirstMax {
  __device__ ValIdx operator()(ValIdx a, ValIdx b) const {
    if (a.i == INT_MAX) return b;
    if (b.i == INT_MAX) return a;
    if (a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
  }
};

__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ int shfl_xor(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ ValIdx shfl_xor(ValIdx v, int m) { return ValIdx{shfl_xor(v.v, m), shfl_xor(v.i, m)}; }

// Every thread must call it; every thread gets the result. Safe back to back (the first
// barrier waits for the readers of the previous call).
template <class T, class Op>
__device__ T block_all_reduce(T v, Op op) {
  __shared__ T part[32];
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, warps = int(blockDim.x) >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T r = part[0];
  for (int w = 1; w < warps; ++w) r = op(r, part[w]);
  return r;
}

// The inclusive prefix sum of x over the block's threads; total = the sum of all (the last
// thread's prefix, the same bits).
__device__ double block_inclusive_scan(double x, double& total) {
  __shared__ double warp_sums[32];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, warps = int(blockDim.x) >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  double before = 0;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  total = 0;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  return warp == 0 ? x : before + x;
}

// The first i < n whose running sum of p[0..i] satisfies pred (INT_MAX when none), tile by tile.
template <class Pred>
__device__ int first_cumulative(const double* p, int n, Pred pred) {
  double carry = 0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + int(threadIdx.x);
    double tile_total;
    const double inc = block_inclusive_scan(i < n ? p[i] : 0.0, tile_total);
    const double cum = base == 0 ? inc : carry + inc;
    const int f = block_all_reduce((i < n && pred(cum)) ? i : INT_MAX, MinI{});
    if (f != INT_MAX) return f;
    carry = base == 0 ? tile_total : carry + tile_total;
  }
  return INT_MAX;
}

// p[0..keep) /= their sum (the CPU's cut_to).
__device__ void renormalize(double* p, int keep) {
  double part = 0;
  for (int i = threadIdx.x; i < keep; i += blockDim.x) part += p[i];
  const double s = block_all_reduce(part, AddD{});
  for (int i = threadIdx.x; i < keep; i += blockDim.x) p[i] = p[i] / s;
  __syncthreads();
}

// ---- the kernels ---------------------------------------------------------------------------------

// One logit's penalty (llama.cpp's: repeat, then frequency and presence).
__device__ __forceinline__ float penalized_logit(float l, int32_t count, const SampleLaunch& a) {
  l = l > 0 ? div_rn(l, a.repeat_penalty) : mul_rn(l, a.repeat_penalty);
  return sub_rn(l, add_rn(mul_rn(float(count), a.frequency_penalty), a.presence_penalty));
}

template <class T>
__global__ void __launch_bounds__(kThreads) prepare_kernel(SampleLaunch a, SampleScratch s, int32_t* out, bool sorts) {
  const T* logits = static_cast<const T*>(a.logits);
  int first_nan = INT_MAX;
  for (int i = threadIdx.x; i < a.V; i += blockDim.x) {
    const float v = to_f(logits[i]);
    s.z[i] = v;
    if (first_nan == INT_MAX && isnan(v)) first_nan = i;
  }
  first_nan = block_all_reduce(first_nan, MinI{});  // (its barriers also publish z)
  if (first_nan != INT_MAX) {
    if (threadIdx.x == 0) *out = -1 - first_nan;
    return;
  }
  if (threadIdx.x == 0) {
    *out = 0;  // (no NaN: the later kernels go on)
    for (int64_t k = 0; k < a.n_penalized; ++k) {
      const int32_t id = a.penalized[2 * k], count = a.penalized[2 * k + 1];
      if (count == 0) continue;  // padding
      s.z[id] = penalized_logit(s.z[id], count, a);
    }
  }
  __syncthreads();
  if (!sorts) return;
  for (int i = threadIdx.x; i < a.V; i += blockDim.x) {
    const float v = s.z[i];
    s.keys_in[i] = v == 0.0f ? 0.0f : v;
    s.ids_in[i] = i;
  }
}

__global__ void __launch_bounds__(kThreads) greedy_kernel(const float* z, int V, int32_t* out) {
  if (*out < 0) return;  // a NaN logit
  ValIdx best{0.0f, INT_MAX};
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (best.i == INT_MAX || z[i] > best.v) best = ValIdx{z[i], i};
  best = block_all_reduce(best, FirstMax{});
  if (threadIdx.x == 0) *out = best.i;
}

// Candidates: cand[0..n) (sorted ids, already cut to k), or every id in id order (cand null).
__global__ void __launch_bounds__(kThreads) chain_kernel(SampleLaunch a, const float* z, const int32_t* cand, int n,
                                                         double* p, int32_t* out) {
  if (*out < 0) return;  // a NaN logit
  // Softmax at the temperature, in double, from the maximum of all logits.
  float m = -INFINITY;
  for (int i = threadIdx.x; i < a.V; i += blockDim.x) m = MaxF{}(m, z[i]);
  const double mx = block_all_reduce(m, MaxF{});
  const double temperature = a.temperature;
  double part = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const double e = ::exp((double(z[cand ? cand[i] : i]) - mx) / temperature);
    p[i] = e;
    part += e;
  }
  const double total = block_all_reduce(part, AddD{});
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = p[i] / total;
  __syncthreads();
  // Min-p: the prefix whose probabilities reach min_p times the first's (renormalised only
  // when it cuts).
  if (a.min_p > 0) {
    const double threshold = dmul_rn(double(a.min_p), p[0]);
    int f = INT_MAX;
    for (int i = 1 + int(threadIdx.x); i < n; i += blockDim.x)
      if (!(p[i] >= threshold)) {
        f = i;
        break;
      }
    f = block_all_reduce(f, MinI{});
    if (f != INT_MAX) {
      renormalize(p, f);
      n = f;
    }
  }
  // Top-p: the smallest prefix whose mass reaches top_p (always renormalised).
  if (a.top_p < 1.0f) {
    const double top_p = a.top_p;
    const int f = first_cumulative(p, n, [top_p](double c) { return c >= top_p; });
    const int keep = f == INT_MAX ? n : f + 1;
    renormalize(p, keep);
    n = keep;
  }
  // The draw: the first candidate whose running mass exceeds r (the last when none does).
  const double r = a.r;
  const int f = first_cumulative(p, n, [r](double c) { return r < c; });
  const int at = f == INT_MAX ? n - 1 : f;
  if (threadIdx.x == 0) *out = cand ? cand[at] : at;
}

cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

}  // namespace

size_t sample_sort_temp_bytes(int32_t V) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, static_cast<const float*>(nullptr),
                                            static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), int(V), 0, 32, stream());
  return bytes;
}

const char* launch_sample_token(const SampleLaunch& a, const SampleScratch& s, int32_t* out) {
  const bool sorts = sample_sorts(a);
  switch (a.elem) {
    case Elem::F32: prepare_kernel<float><<<1, kThreads, 0, stream()>>>(a, s, out, sorts); break;
    case Elem::F16: prepare_kernel<__half><<<1, kThreads, 0, stream()>>>(a, s, out, sorts); break;
    case Elem::BF16: prepare_kernel<__nv_bfloat16><<<1, kThreads, 0, stream()>>>(a, s, out, sorts); break;
    case Elem::I32: return "integer logits";  // (the glue refuses them first)
  }
  if (a.temperature == 0.0f) {
    greedy_kernel<<<1, kThreads, 0, stream()>>>(s.z, a.V, out);
    return "";
  }
  int n = a.V;
  const int32_t* cand = nullptr;
  if (sorts) {
    size_t bytes = s.temp_bytes;
    const cudaError_t e = cub::DeviceRadixSort::SortPairsDescending(s.temp, bytes, s.keys_in, s.keys_out, s.ids_in,
                                                                    s.ids_out, int(a.V), 0, 32, stream());
    if (e != cudaSuccess) return cudaGetErrorString(e);
    n = a.top_k > 0 && a.top_k < a.V ? a.top_k : a.V;
    cand = s.ids_out;
  }
  chain_kernel<<<1, kThreads, 0, stream()>>>(a, s.z, cand, n, s.p, out);
  return "";
}

}  // namespace toy::cuda
