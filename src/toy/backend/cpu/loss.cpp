// Cross-entropy fused with log-softmax, per row of logits [N, V] (contiguous).
// Forward keeps only lse [N] and the per-row loss; the backward recomputes softmax from lse
// and may write dlogits over the logits themselves (the op passes the same buffer when no
// one else holds it), so training never needs a second logits-sized buffer.
#include <cmath>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
inline float row_weight(const int32_t* t, const float* w, int64_t i, int32_t ignore) {
  if (t[i] == ignore) return 0.0f;
  return w ? w[i] : 1.0f;
}
}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                   Tensor& loss, Tensor& lse) {
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  const int32_t* pt = targets.data<int32_t>();
  const float* pw = weights.defined() ? weights.data<float>() : nullptr;
  float* pl = loss.data<float>();
  float* ps = lse.data<float>();
  dispatch_float(logits.dtype(), "cross_entropy", [&]<class T>(std::type_identity<T>) {
    const T* pz = logits.data<T>();
    parallel_for(0, N, std::max<int64_t>(1, 8192 / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* z = pz + i * V;
        __m256 vmax = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= V; j += 8) vmax = _mm256_max_ps(vmax, load8(z + j));
        float mx = hmax256(vmax);
        for (; j < V; ++j) mx = std::max(mx, to_f32(z[j]));
        const __m256 vm = _mm256_set1_ps(mx);
        __m256 vs = _mm256_setzero_ps();
        j = 0;
        for (; j + 8 <= V; j += 8) vs = _mm256_add_ps(vs, exp256_nonpos(_mm256_sub_ps(load8(z + j), vm)));
        float s = hsum256(vs);
        for (; j < V; ++j) s += exp_nonpos_scalar(to_f32(z[j]) - mx);
        const float l = mx + std::log(s);
        ps[i] = l;
        const float w = row_weight(pt, pw, i, ignore_index);
        pl[i] = w != 0.0f ? w * (l - to_f32(z[pt[i]])) : 0.0f;
      }
    });
  });
}

void cross_entropy_total(const Tensor& loss_rows, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                         float normalizer, Tensor& loss, Tensor& inv) {
  const int64_t N = loss_rows.numel();
  const int32_t* pt = targets.data<int32_t>();
  const float* pw = weights.defined() ? weights.data<float>() : nullptr;
  double count = 0;
  for (int64_t i = 0; i < N; ++i)
    if (pt[i] != ignore_index) count += pw ? pw[i] : 1.0;
  const double denom = normalizer > 0.0f ? normalizer : count;
  const float k = denom > 0 ? float(1.0 / denom) : 0.0f;
  double total = 0;
  const float* pl = loss_rows.data<float>();
  for (int64_t i = 0; i < N; ++i) total += pl[i];
  *inv.data<float>() = k;
  dispatch_float(loss.dtype(), "cross_entropy_total",
                 [&]<class T>(std::type_identity<T>) { *loss.data<T>() = from_f32<T>(float(total * k)); });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& weights, int32_t ignore_index,
                            const Tensor& lse, const Tensor& grad, const Tensor& inv, Tensor& dlogits) {
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  float g = 0;
  dispatch_float(grad.dtype(), "cross_entropy_backward",
                 [&]<class T>(std::type_identity<T>) { g = to_f32(*grad.data<T>()); });
  const float scale = g * *inv.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  const float* pw = weights.defined() ? weights.data<float>() : nullptr;
  const float* ps = lse.data<float>();
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&]<class T>(std::type_identity<T>) {
    const T* pz = logits.data<T>();
    T* pd = dlogits.data<T>();
    parallel_for(0, N, std::max<int64_t>(1, 8192 / std::max<int64_t>(V, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T* z = pz + i * V;
        T* d = pd + i * V;
        const float w = row_weight(pt, pw, i, ignore_index) * scale;
        if (w == 0.0f) {
          for (int64_t j = 0; j < V; ++j) d[j] = from_f32<T>(0.0f);
          continue;
        }
        const __m256 vl = _mm256_set1_ps(ps[i]), vw = _mm256_set1_ps(w);
        int64_t j = 0;
        for (; j + 8 <= V; j += 8) store8(d + j, _mm256_mul_ps(exp256_nonpos(_mm256_sub_ps(load8(z + j), vl)), vw));
        for (; j < V; ++j) d[j] = from_f32<T>(exp_nonpos_scalar(to_f32(z[j]) - ps[i]) * w);
        d[pt[i]] = from_f32<T>(to_f32(d[pt[i]]) - w);
      }
    });
  });
}

}  // namespace toy::cpu
