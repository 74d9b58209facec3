// Rotary position embedding on the GPU, the CPU kernel's semantics and arithmetic (ggml's
// rope_ext: normal or neox pairs, freq factors, YaRN, a heads range, the inverse). The host
// computes what the CPU computes once per call (base^(-2i/n), the YaRN ramp, mscale: with the
// same libm, so the same bits) and passes it in the launch; each block takes one (b, t) row:
// its threads first compute the row's cos/sin per pair (train_launch.h's shared math), then
// write the row's H*D outputs (copies for unrotated heads and dims past n_dims).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "toy/backend/cuda/train_launch.h"

namespace toy::cuda {

namespace {

using namespace tmath;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeLaunch a, T* y) {
  __shared__ float cs[kRopeMaxPairs], sn[kRopeMaxPairs];
  const int64_t B = a.x.shape[0], T_ = a.x.shape[1], H = a.x.shape[2], D = a.x.shape[3];
  const int64_t xs0 = a.x.stride[0], xs1 = a.x.stride[1], xs2 = a.x.stride[2], xs3 = a.x.stride[3];
  const int half = a.n_dims / 2;
  const T* x = static_cast<const T*>(a.x.data);
  for (int64_t bt = blockIdx.x; bt < B * T_; bt += gridDim.x) {
    const int64_t b = bt / T_, t = bt % T_;
    const int32_t p = a.pos[a.pos_per_batch ? b * T_ + t : t];
    __syncthreads();  // (the previous row's readers are done with cs and sn)
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      const double theta =
          rope_theta(p, a.tables.base_pow[i], a.freq_factors, i, a.freq_scale, a.ext_factor, a.tables.ramp[i]);
      rope_cos_sin(theta, a.tables.mscale, a.sign, cs[i], sn[i]);
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < H * D; e += blockDim.x) {
      const int64_t h = e / D, d = e % D;
      const T* xr = x + b * xs0 + t * xs1 + h * xs2;
      T* yr = y + (bt * H + h) * D;
      if (h < a.heads_begin || h >= a.heads_end || d >= a.n_dims) {  // not rotated: copied
        yr[d] = xr[d * xs3];
        continue;
      }
      // The pair (i0, i1) that d belongs to, and which of the two d is.
      const int i = a.neox ? int(d < half ? d : d - half) : int(d / 2);
      const int64_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
      const float x0 = to_f(xr[i0 * xs3]), x1 = to_f(xr[i1 * xs3]);
      yr[d] = from_f<T>(d == i0 ? rope_first(x0, x1, cs[i], sn[i]) : rope_second(x0, x1, cs[i], sn[i]));
    }
  }
}

}  // namespace

void launch_rope(const RopeLaunch& a, void* y) {
  const int64_t rows = a.x.shape[0] * a.x.shape[1];
  if (rows == 0 || a.x.numel == 0) return;
  const unsigned grid = unsigned(rows < (int64_t(1) << 20) ? rows : (int64_t(1) << 20));
  cudaStream_t s = static_cast<cudaStream_t>(compute_stream());
  switch (a.x.elem) {
    case Elem::F32: rope_kernel<float><<<grid, kThreads, 0, s>>>(a, static_cast<float*>(y)); break;
    case Elem::F16: rope_kernel<__half><<<grid, kThreads, 0, s>>>(a, static_cast<__half*>(y)); break;
    case Elem::BF16: rope_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(a, static_cast<__nv_bfloat16*>(y)); break;
    case Elem::I32: break;  // (the glue refuses it)
  }
}

}  // namespace toy::cuda
