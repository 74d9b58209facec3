// Rotary position embedding, ggml's rope_ext semantics: "normal" rotates adjacent pairs
// (x[2i], x[2i+1]), "neox" rotates halves (x[i], x[i + n/2]); dims past n_dims are copied.
// theta_i = pos * base^(-2i/n_dims) / freq_factor[i], then YaRN's ramp between interpolated
// (freq_scale * theta) and extrapolated theta, with magnitude scale attn_factor (and
// 1 + 0.1 ln(1/freq_scale) when ext_factor != 0). The inverse (backward) rotates by -theta.
#include <cmath>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return float(n_dims) * std::log(float(n_ctx_orig) / (n_rot * 2.0f * float(M_PI))) / (2.0f * std::log(base));
}
}  // namespace

void rope(const Tensor& x, const Tensor& pos, const Tensor& freq_factors, const kern::RopeArgs& a, Tensor& y) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const int n_dims = a.n_dims;
  const int half = n_dims / 2;
  const int32_t* pp = pos.data<int32_t>();
  const bool pos_per_batch = pos.ndim() == 2;
  const float* ff = freq_factors.defined() ? freq_factors.data<float>() : nullptr;

  // Per-dimension inverse frequency and YaRN ramp, shared by every position.
  // Buffers kept between calls (rotating one token's heads allocates nothing), named by
  // reference so that the workers below read the calling thread's copies.
  thread_local std::vector<double> inv_freq_buffer;
  thread_local std::vector<float> ramp_buffer;
  std::vector<double>& inv_freq = inv_freq_buffer;
  std::vector<float>& ramp = ramp_buffer;
  inv_freq.assign(size_t(half), 0.0);
  ramp.assign(size_t(half), 0.0f);
  float corr0 = 0, corr1 = 0;
  if (a.ext_factor != 0.0f) {
    corr0 = std::max(0.0f, std::floor(yarn_corr_dim(n_dims, a.n_ctx_orig, a.beta_fast, a.freq_base)));
    corr1 = std::min(float(n_dims - 1), std::ceil(yarn_corr_dim(n_dims, a.n_ctx_orig, a.beta_slow, a.freq_base)));
  }
  for (int i = 0; i < half; ++i) {
    inv_freq[size_t(i)] = std::pow(double(a.freq_base), -2.0 * i / n_dims) / (ff ? double(ff[i]) : 1.0);
    if (a.ext_factor != 0.0f) {
      float yv = (float(i) - corr0) / std::max(0.001f, corr1 - corr0);
      ramp[size_t(i)] = (1.0f - std::min(1.0f, std::max(0.0f, yv))) * a.ext_factor;
    }
  }
  float mscale = a.attn_factor;
  if (a.ext_factor != 0.0f) mscale *= 1.0f + 0.1f * std::log(1.0f / a.freq_scale);
  const float sign = a.inverse ? -1.0f : 1.0f;

  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2), xs3 = x.stride(3);
  const int64_t heads_end = a.heads_end < 0 ? H : a.heads_end;
  dispatch_float(x.dtype(), "rope", [&]<class T_>(std::type_identity<T_>) {
    const T_* px = static_cast<const T_*>(x.raw_data());
    T_* py = y.data<T_>();
    parallel_for(0, B * T, std::max<int64_t>(1, 4096 / std::max<int64_t>(H * D, 1)), [&](int64_t b0, int64_t b1) {
      thread_local std::vector<float> cs, sn;
      cs.resize(size_t(half));
      sn.resize(size_t(half));
      for (int64_t bt = b0; bt < b1; ++bt) {
        const int64_t b = bt / T, t = bt % T;
        const double p = double(pos_per_batch ? pp[b * T + t] : pp[t]);
        for (int i = 0; i < half; ++i) {
          double theta_extrap = p * inv_freq[size_t(i)];
          double theta = a.freq_scale * theta_extrap;
          if (a.ext_factor != 0.0f) {
            double mix = ramp[size_t(i)];
            theta = theta * (1.0 - mix) + theta_extrap * mix;
          }
          cs[size_t(i)] = float(std::cos(theta)) * mscale;
          sn[size_t(i)] = float(std::sin(theta)) * mscale * sign;
        }
        for (int64_t h = 0; h < H; ++h) {
          const T_* xr = px + b * xs0 + t * xs1 + h * xs2;
          T_* yr = py + ((b * T + t) * H + h) * D;
          if (h < a.heads_begin || h >= heads_end) {  // not rotated: copied
            for (int64_t d = 0; d < D; ++d) yr[d] = xr[d * xs3];
            continue;
          }
          for (int i = 0; i < half; ++i) {
            const int64_t i0 = a.neox ? i : 2 * i, i1 = a.neox ? i + half : 2 * i + 1;
            const float x0 = to_f32(xr[i0 * xs3]), x1 = to_f32(xr[i1 * xs3]);
            yr[i0] = from_f32<T_>(x0 * cs[size_t(i)] - x1 * sn[size_t(i)]);
            yr[i1] = from_f32<T_>(x0 * sn[size_t(i)] + x1 * cs[size_t(i)]);
          }
          for (int64_t d = n_dims; d < D; ++d) yr[d] = xr[d * xs3];
        }
      }
    });
  });
}

}  // namespace toy::cpu
