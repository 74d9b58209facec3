// The launchers of the training-side CUDA kernels (rows.cu, rope.cu, optim.cu, sample.cu), in
// plain types (no toy or CUDA headers: the glue, glue_train.cpp, is compiled by the C++
// compiler), and the per-element math those kernels share with the host (TOY_HD, hd.h).
// The shared math is written with explicitly rounded operations: nvcc contracts a * b + c
// into one fma by default, the CPU kernels are meant not to (CMakeLists.txt), so every product
// and sum whose bits matter is spelled out (on the host the wrappers are plain operators: the
// glue and the tests are built without FMA). tests/gpu/host_train_math.cpp checks these
// functions, compiled for the host, against the CPU kernels: bit for bit when those are built
// without contraction (GCC fuses C++ under -mfma unless -ffp-contract=off), else within 1e-6.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "toy/backend/cuda/cuda_launch.h"
#include "toy/backend/cuda/hd.h"

namespace toy::cuda {

// (The shared math sits in namespace tmath, apart from other kernels' helpers of the same names.)
namespace tmath {

// ---- rounded arithmetic (one IEEE operation each, never contracted) -------------------------

TOY_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TOY_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TOY_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TOY_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TOY_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
TOY_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
TOY_HD double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TOY_HD double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

}  // namespace tmath

// ---- rows (rows.cu) --------------------------------------------------------------------------

// The scratch of a stable sort of (row id, position) pairs (the glue allocates it): keys_* and
// pos_* hold n elements, temp is cub's (temp_bytes, from row_sort_temp_bytes); ids < 2^end_bit.
struct RowSort {
  uint32_t* keys_in = nullptr;
  uint32_t* keys_out = nullptr;
  int32_t* pos_in = nullptr;
  int32_t* pos_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
  int end_bit = 32;
};
// cub's scratch bytes for sorting n pairs on end_bit bits (0 when n < 2: nothing is sorted).
size_t row_sort_temp_bytes(int64_t n, int end_bit);

// out[i, :] = table[ids[i], :] (table [V, D] float, any strides; ids I32 any layout; out
// contiguous, table's type): the elements' bits are copied.
void launch_get_rows(const View& table, const View& ids, const View& out);
// The same from a contiguous Q8_0 table (row_bytes per row) into f32 out [N, D].
void launch_get_rows_q8_0(const void* table, int64_t row_bytes, const View& ids, float* out, int64_t D);
// dtable[ids[i], :] += g[i, :], the rows of each id added in the order of i (deterministic:
// the pairs are sorted, one thread per (id, column) walks its run). Returns the sort's error
// ("" when none; the kernels' own launch errors are left for last_launch_error).
const char* launch_scatter_add_rows(const View& g, const View& ids, const View& dtable, const RowSort& s);
// dst[ids[i], :] = src[i, :] converted to dst's type; for a repeated id the last i wins.
// Returns the sort's error, as launch_scatter_add_rows.
const char* launch_set_rows(const View& dst, const View& ids, const View& src, const RowSort& s);

// ---- rope (rope.cu) --------------------------------------------------------------------------

inline constexpr int kRopeMaxPairs = 256;  // n_dims / 2 (heads of up to 512 rotated dims)

// What the CPU computes once per call: base^(-2i/n_dims) in double, YaRN's ramp per pair
// and the magnitude scale.
struct RopeTables {
  double base_pow[kRopeMaxPairs];
  float ramp[kRopeMaxPairs];
  float mscale;
};

namespace tmath {

// (Host only: called by the glue, with the CPU's expressions and libm.)
inline float rope_yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return float(n_dims) * std::log(float(n_ctx_orig) / (n_rot * 2.0f * float(3.14159265358979323846))) /
         (2.0f * std::log(base));
}
inline void rope_tables(int n_dims, float freq_base, float freq_scale, float ext_factor, float attn_factor,
                        float beta_fast, float beta_slow, int n_ctx_orig, RopeTables& t) {
  const int half = n_dims / 2;
  float corr0 = 0, corr1 = 0;
  if (ext_factor != 0.0f) {
    corr0 = std::max(0.0f, std::floor(rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base)));
    corr1 = std::min(float(n_dims - 1), std::ceil(rope_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base)));
  }
  for (int i = 0; i < half && i < kRopeMaxPairs; ++i) {
    t.base_pow[i] = std::pow(double(freq_base), -2.0 * i / n_dims);
    t.ramp[i] = 0.0f;
    if (ext_factor != 0.0f) {
      const float yv = (float(i) - corr0) / std::max(0.001f, corr1 - corr0);
      t.ramp[i] = (1.0f - std::min(1.0f, std::max(0.0f, yv))) * ext_factor;
    }
  }
  t.mscale = attn_factor;
  if (ext_factor != 0.0f) t.mscale *= 1.0f + 0.1f * std::log(1.0f / freq_scale);
}

// The angle of pair i at position pos: pos * base_pow / factor, blended by YaRN's ramp between
// the interpolated (freq_scale * theta) and the extrapolated angle.
TOY_HD double rope_theta(int32_t pos, double base_pow, const float* freq_factors, int i, float freq_scale,
                         float ext_factor, float ramp) {
  const double inv_freq = base_pow / (freq_factors ? double(freq_factors[i]) : 1.0);
  const double theta_extrap = dmul_rn(double(pos), inv_freq);
  double theta = dmul_rn(double(freq_scale), theta_extrap);
  if (ext_factor != 0.0f) {
    const double mix = ramp;
    theta = dadd_rn(dmul_rn(theta, 1.0 - mix), dmul_rn(theta_extrap, mix));
  }
  return theta;
}
// cos and sin (sin times sign: -1 for the inverse) in f32, scaled by mscale.
TOY_HD void rope_cos_sin(double theta, float mscale, float sign, float& cs, float& sn) {
  cs = mul_rn(float(::cos(theta)), mscale);
  sn = mul_rn(mul_rn(float(::sin(theta)), mscale), sign);
}
// The rotation of one pair.
TOY_HD float rope_first(float x0, float x1, float cs, float sn) { return sub_rn(mul_rn(x0, cs), mul_rn(x1, sn)); }
TOY_HD float rope_second(float x0, float x1, float cs, float sn) { return add_rn(mul_rn(x0, sn), mul_rn(x1, cs)); }

}  // namespace tmath

struct RopeLaunch {
  View x;  // [B, T, H, D], any strides
  const int32_t* pos = nullptr;  // [T] or [B, T], contiguous
  bool pos_per_batch = false;
  const float* freq_factors = nullptr;  // [n_dims / 2] or null
  int n_dims = 0;
  int64_t heads_begin = 0, heads_end = 0;  // [begin, end) rotate
  bool neox = false;
  float freq_scale = 1.0f, ext_factor = 0.0f;
  float sign = 1.0f;  // -1: the inverse rotation (backward)
  RopeTables tables;
};
// y (contiguous [B, T, H, D], x's type) = the rotation of x.
void launch_rope(const RopeLaunch& a, void* y);

// ---- optimizers (optim.cu) -------------------------------------------------------------------

struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};
// The per-step constants, as the CPU's AdamWStep computes them from lr and step.
struct AdamWConsts {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, lr;
};

namespace tmath {

// The warmup + cosine schedule, toy::cosine_lr (core/lr_schedule.h) operation for operation.
TOY_HD float cosine_lr_hd(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr) {
  if (step < warmup) return div_rn(mul_rn(lr, float(step + 1)), float(warmup + 1));
  if (step >= total) return min_lr;
  const int64_t span = total - warmup > 1 ? total - warmup : 1;
  const double ratio = double(step - warmup) / double(span);
  const double coeff = dmul_rn(0.5, dadd_rn(1.0, ::cos(dmul_rn(3.14159265358979323846, ratio))));
  return float(dadd_rn(double(min_lr), dmul_rn(coeff, double(sub_rn(lr, min_lr)))));
}

TOY_HD AdamWConsts adamw_consts(float lr, float step, const AdamWHyper& h) {
  AdamWConsts c;
  c.beta1 = h.beta1, c.beta2 = h.beta2, c.eps = h.eps, c.lr = lr;
  const double t = step;
  const float bc1 = float(1.0 - ::pow(double(h.beta1), t));
  const float bc2 = float(1.0 - ::pow(double(h.beta2), t));
  c.step_size = div_rn(lr, bc1);
  c.inv_sqrt_bc2 = div_rn(1.0f, sqrt_rn(bc2));
  return c;
}
TOY_HD float adamw_decay(const AdamWConsts& c, float weight_decay) { return sub_rn(1.0f, mul_rn(c.lr, weight_decay)); }
// One element, the operations of the CPU's vector loop (fused moments, the rest rounded).
TOY_HD void adamw_element(float& p, float g, float& m, float& v, const AdamWConsts& c, float decay) {
  m = fma_rn(c.beta1, m, mul_rn(sub_rn(1.0f, c.beta1), g));
  v = fma_rn(c.beta2, v, mul_rn(sub_rn(1.0f, c.beta2), mul_rn(g, g)));
  const float denom = add_rn(mul_rn(sqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  p = sub_rn(mul_rn(p, decay), div_rn(mul_rn(c.step_size, m), denom));
}
// One SGD element (m null without momentum).
TOY_HD void sgd_element(float& p, float g, float* m, float lr, float momentum, float weight_decay, bool nesterov) {
  float gi = add_rn(g, mul_rn(weight_decay, p));
  if (m) {
    *m = add_rn(mul_rn(momentum, *m), gi);
    gi = nesterov ? add_rn(gi, mul_rn(momentum, *m)) : *m;
  }
  p = sub_rn(p, mul_rn(lr, gi));
}

}  // namespace tmath

// p -= lr * (g + wd p) with momentum (buf null when momentum is 0); lr a device scalar.
void launch_sgd(float* p, const float* g, float* buf, const float* lr, int64_t n, float momentum, float weight_decay,
                bool nesterov);
// AdamW on n elements; lr and step device scalars.
void launch_adamw(float* p, const float* g, float* m, float* v, const float* lr, const float* step, int64_t n,
                  const AdamWHyper& h);
struct ArenaSpan {
  int64_t begin = 0, end = 0;
  bool decay = false;
};
// AdamW over sorted, disjoint ranges of the arrays (h.weight_decay where decay, else 0); the
// ranges travel as kernel parameters, up to kAdamWRangesPerLaunch per launch.
inline constexpr int kAdamWRangesPerLaunch = 192;
void launch_adamw_ranges(float* p, const float* g, float* m, float* v, const float* lr, const float* step,
                         const ArenaSpan* ranges, int64_t count, const AdamWHyper& h);
// step += 1, lr = cosine_lr(position, schedule), on the device.
void launch_optimizer_clock(float* step, float* lr, const int32_t* position, int64_t warmup, int64_t total,
                            float lr_max, float min_lr);
// step (I32) += 1.
void launch_step_clock(int32_t* step);

// ---- sampling (sample.cu) ---------------------------------------------------------------------

struct SampleLaunch {
  const void* logits = nullptr;  // [V], contiguous
  Elem elem = Elem::F32;
  int32_t V = 0;
  const int32_t* penalized = nullptr;  // [n, 2] (id, count), contiguous, or null
  int64_t n_penalized = 0;
  float temperature = 0;
  int32_t top_k = 0;
  float top_p = 1, min_p = 0;
  float repeat_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  double r = 0;
};
// The candidates are sorted (by logit, descending, ties by id) when a cut needs them, as the CPU.
inline bool sample_sorts(const SampleLaunch& a) {
  const bool k_cuts = a.top_k > 0 && a.top_k < a.V;
  return a.temperature != 0.0f && (k_cuts || a.top_p < 1.0f || a.min_p > 0);
}
// Device scratch (the glue allocates it): z [V] floats, p [V] doubles; when sample_sorts,
// also keys_in/keys_out [V] floats, ids_in/ids_out [V] and cub's temp (sample_sort_temp_bytes).
struct SampleScratch {
  float* z = nullptr;
  double* p = nullptr;
  float* keys_in = nullptr;
  float* keys_out = nullptr;
  int32_t* ids_in = nullptr;
  int32_t* ids_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
};
size_t sample_sort_temp_bytes(int32_t V);
// out (I32 [1], device) = the sampled token, or -1 - i for the first NaN logit i. Returns the
// sort's error ("" when none; launch errors are left for last_launch_error).
const char* launch_sample_token(const SampleLaunch& a, const SampleScratch& s, int32_t* out);

}  // namespace toy::cuda
