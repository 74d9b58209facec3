// Optimizer steps and clocks on the GPU, in place on contiguous F32 arrays. lr and step are
// device scalars read by the kernels (never copied to the host), so a step launches with
// nothing of its values baked in. Each element gets the operations of the CPU kernel (the
// shared math in train_launch.h, explicitly rounded); AdamW's per-step constants are computed
// once per block from the two scalars.
#include <cuda_runtime.h>

#include <cstdint>

#include "toy/backend/cuda/train_launch.h"

namespace toy::cuda {

namespace {

using namespace tmath;

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}
cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

__global__ void sgd_kernel(float* p, const float* g, float* buf, const float* lr, int64_t n, float momentum,
                           float weight_decay, bool nesterov) {
  const float l = *lr;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float pi = p[i];
    sgd_element(pi, g[i], buf ? buf + i : nullptr, l, momentum, weight_decay, nesterov);
    p[i] = pi;
  }
}

// The step's constants, computed by thread 0 and shared with the block.
__device__ __forceinline__ AdamWConsts block_consts(const float* lr, const float* step, const AdamWHyper& h) {
  __shared__ AdamWConsts c;
  if (threadIdx.x == 0) c = adamw_consts(*lr, *step, h);
  __syncthreads();
  return c;
}

__device__ __forceinline__ void adamw_at(float* p, const float* g, float* m, float* v, int64_t i, const AdamWConsts& c,
                                         float decay) {
  float pi = p[i], mi = m[i], vi = v[i];
  adamw_element(pi, g[i], mi, vi, c, decay);
  p[i] = pi, m[i] = mi, v[i] = vi;
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, const float* lr, const float* step,
                             int64_t n, AdamWHyper h) {
  const AdamWConsts c = block_consts(lr, step, h);
  const float decay = adamw_decay(c, h.weight_decay);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    adamw_at(p, g, m, v, i, c, decay);
}

// Up to kAdamWRangesPerLaunch ranges, passed by value (kernel parameters: nothing to upload).
struct RangeChunk {
  int64_t begin[kAdamWRangesPerLaunch];
  int64_t end[kAdamWRangesPerLaunch];
  uint32_t decay[(kAdamWRangesPerLaunch + 31) / 32];  // bit r: range r decays
  int32_t count;
};

// Over the span the chunk's ranges cover; each element finds its range by binary search
// (the first range ending after it) and is left alone when it falls in a gap.
__global__ void adamw_ranges_kernel(float* p, const float* g, float* m, float* v, const float* lr, const float* step,
                                    RangeChunk rc, AdamWHyper h) {
  const AdamWConsts c = block_consts(lr, step, h);
  const float decay_on = adamw_decay(c, h.weight_decay), decay_off = adamw_decay(c, 0.0f);
  const int64_t lo = rc.begin[0], hi = rc.end[rc.count - 1];
  for (int64_t i = lo + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    int a = 0, b = rc.count - 1;
    while (a < b) {
      const int mid = (a + b) / 2;
      if (rc.end[mid] > i) b = mid; else a = mid + 1;
    }
    if (i < rc.begin[a]) continue;
    const bool d = (rc.decay[a / 32] >> (a % 32)) & 1u;
    adamw_at(p, g, m, v, i, c, d ? decay_on : decay_off);
  }
}

__global__ void optimizer_clock_kernel(float* step, float* lr, const int32_t* position, int64_t warmup, int64_t total,
                                       float lr_max, float min_lr) {
  *step = add_rn(*step, 1.0f);
  *lr = cosine_lr_hd(int64_t(*position), warmup, total, lr_max, min_lr);
}

__global__ void step_clock_kernel(int32_t* step) { *step += 1; }

}  // namespace

void launch_sgd(float* p, const float* g, float* buf, const float* lr, int64_t n, float momentum, float weight_decay,
                bool nesterov) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(p, g, buf, lr, n, momentum, weight_decay, nesterov);
}

void launch_adamw(float* p, const float* g, float* m, float* v, const float* lr, const float* step, int64_t n,
                  const AdamWHyper& h) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(p, g, m, v, lr, step, n, h);
}

void launch_adamw_ranges(float* p, const float* g, float* m, float* v, const float* lr, const float* step,
                         const ArenaSpan* ranges, int64_t count, const AdamWHyper& h) {
  for (int64_t first = 0; first < count; first += kAdamWRangesPerLaunch) {
    RangeChunk rc{};
    rc.count = int32_t(count - first < kAdamWRangesPerLaunch ? count - first : kAdamWRangesPerLaunch);
    for (int r = 0; r < rc.count; ++r) {
      rc.begin[r] = ranges[first + r].begin;
      rc.end[r] = ranges[first + r].end;
      if (ranges[first + r].decay) rc.decay[r / 32] |= 1u << (r % 32);
    }
    const int64_t span = rc.end[rc.count - 1] - rc.begin[0];
    if (span <= 0) continue;
    adamw_ranges_kernel<<<blocks_for(span), kThreads, 0, stream()>>>(p, g, m, v, lr, step, rc, h);
  }
}

void launch_optimizer_clock(float* step, float* lr, const int32_t* position, int64_t warmup, int64_t total,
                            float lr_max, float min_lr) {
  optimizer_clock_kernel<<<1, 1, 0, stream()>>>(step, lr, position, warmup, total, lr_max, min_lr);
}

void launch_step_clock(int32_t* step) { step_clock_kernel<<<1, 1, 0, stream()>>>(step); }

}  // namespace toy::cuda
