// Optimizer steps, in place on contiguous F32 tensors. lr and the step count are read from
// scalar tensors (so a CUDA version can keep them on the device for graph replay).
#include <algorithm>
#include <cmath>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

void sgd(Tensor& param, const Tensor& grad, Tensor& buf, const Tensor& lr_t, const kern::SgdArgs& a) {
  const float lr = lr_t.data<float>()[0];
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = buf.defined() ? buf.data<float>() : nullptr;
  parallel_for(0, param.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float gi = g[i] + a.weight_decay * p[i];
      if (m) {
        m[i] = a.momentum * m[i] + gi;
        gi = a.nesterov ? gi + a.momentum * m[i] : m[i];
      }
      p[i] -= lr * gi;
    }
  });
}

namespace {

// AdamW's per-step constants (from lr, the step count and the betas).
struct AdamWStep {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2;
  AdamWStep(const Tensor& lr_t, const Tensor& step_t, const kern::AdamWArgs& a)
      : beta1(a.beta1), beta2(a.beta2), eps(a.eps), lr(lr_t.data<float>()[0]) {
    const double step = step_t.data<float>()[0];
    const float bc1 = float(1.0 - std::pow(double(a.beta1), step));
    const float bc2 = float(1.0 - std::pow(double(a.beta2), step));
    step_size = lr / bc1;
    inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  }
  float lr;
};

// Elements [b, e) of one parameter, weight decay wd. Each element gets the same bits whatever
// the span's bounds: the tail runs the vector loop's operations one at a time.
void adamw_span(float* p, const float* g, float* m, float* v, int64_t b, int64_t e, const AdamWStep& c, float wd) {
  const float decay = 1.0f - c.lr * wd;
  const __m256 vb1 = _mm256_set1_ps(c.beta1), vb2 = _mm256_set1_ps(c.beta2);
  const __m256 vc1 = _mm256_set1_ps(1.0f - c.beta1), vc2 = _mm256_set1_ps(1.0f - c.beta2);
  const __m256 vdecay = _mm256_set1_ps(decay), vstep = _mm256_set1_ps(c.step_size);
  const __m256 vibc2 = _mm256_set1_ps(c.inv_sqrt_bc2), veps = _mm256_set1_ps(c.eps);
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 mv = _mm256_fmadd_ps(vb1, _mm256_loadu_ps(m + i), _mm256_mul_ps(vc1, gv));
    __m256 vv = _mm256_fmadd_ps(vb2, _mm256_loadu_ps(v + i), _mm256_mul_ps(vc2, _mm256_mul_ps(gv, gv)));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), vibc2), veps);
    __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(p + i), vdecay);
    _mm256_storeu_ps(p + i, _mm256_sub_ps(pv, _mm256_div_ps(_mm256_mul_ps(vstep, mv), denom)));
  }
  for (; i < e; ++i) {
    m[i] = std::fma(c.beta1, m[i], (1.0f - c.beta1) * g[i]);
    v[i] = std::fma(c.beta2, v[i], (1.0f - c.beta2) * (g[i] * g[i]));
    const float denom = std::sqrt(v[i]) * c.inv_sqrt_bc2 + c.eps;
    p[i] = p[i] * decay - c.step_size * m[i] / denom;
  }
}

// adamw_span on 16 lanes, the AVX2 form's operations per element (so the same bits); the
// last fewer-than-16 elements go to it.
TOY_AVX512 void adamw_span512(float* p, const float* g, float* m, float* v, int64_t b, int64_t e, const AdamWStep& c,
                              float wd) {
  const __m512 vb1 = _mm512_set1_ps(c.beta1), vb2 = _mm512_set1_ps(c.beta2);
  const __m512 vc1 = _mm512_set1_ps(1.0f - c.beta1), vc2 = _mm512_set1_ps(1.0f - c.beta2);
  const __m512 vdecay = _mm512_set1_ps(1.0f - c.lr * wd), vstep = _mm512_set1_ps(c.step_size);
  const __m512 vibc2 = _mm512_set1_ps(c.inv_sqrt_bc2), veps = _mm512_set1_ps(c.eps);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 mv = _mm512_fmadd_ps(vb1, _mm512_loadu_ps(m + i), _mm512_mul_ps(vc1, gv));
    const __m512 vv = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(vc2, _mm512_mul_ps(gv, gv)));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vv), vibc2), veps);
    const __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(p + i), vdecay);
    _mm512_storeu_ps(p + i, _mm512_sub_ps(pv, _mm512_div_ps(_mm512_mul_ps(vstep, mv), denom)));
  }
  if (i < e) adamw_span(p, g, m, v, i, e, c, wd);
}

// The form the variant runs (variant.h).
void adamw_elements(float* p, const float* g, float* m, float* v, int64_t b, int64_t e, const AdamWStep& c, float wd) {
  if (avx512_forms())
    adamw_span512(p, g, m, v, b, e, c, wd);
  else
    adamw_span(p, g, m, v, b, e, c, wd);
}

}  // namespace

void adamw(Tensor& param, const Tensor& grad, Tensor& m_t, Tensor& v_t, const Tensor& lr_t, const Tensor& step_t,
           const kern::AdamWArgs& a) {
  const AdamWStep c(lr_t, step_t, a);
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = m_t.data<float>();
  float* v = v_t.data<float>();
  parallel_for(0, param.numel(), 1 << 14,
               [&](int64_t b, int64_t e) { adamw_elements(p, g, m, v, b, e, c, a.weight_decay); });
}

void optimizer_clock(Tensor& step_t, Tensor& lr_t, const Tensor& position, const LrSchedule& s) {
  step_t.data<float>()[0] += 1.0f;
  lr_t.data<float>()[0] = cosine_lr(int64_t(position.data<int32_t>()[0]), s);
}

void step_clock(Tensor& step) { step.data<int32_t>()[0] += 1; }

void adamw_ranges(Tensor& values, const Tensor& grads, Tensor& m_t, Tensor& v_t, const Tensor& lr_t,
                  const Tensor& step_t, const kern::AdamWArgs& a, const std::vector<kern::ArenaRange>& ranges) {
  if (ranges.empty()) return;
  const AdamWStep c(lr_t, step_t, a);
  float* p = values.data<float>();
  const float* g = grads.data<float>();
  float* m = m_t.data<float>();
  float* v = v_t.data<float>();
  // One parallel pass over the span the ranges cover; each chunk updates its part of each
  // range it meets.
  parallel_for(ranges.front().begin, ranges.back().end, 1 << 14, [&](int64_t b, int64_t e) {
    auto r = std::upper_bound(ranges.begin(), ranges.end(), b,
                              [](int64_t x, const kern::ArenaRange& q) { return x < q.end; });
    for (; r != ranges.end() && r->begin < e; ++r)
      adamw_elements(p, g, m, v, std::max(b, r->begin), std::min(e, r->end), c, r->decay ? a.weight_decay : 0.0f);
  });
}

}  // namespace toy::cpu
