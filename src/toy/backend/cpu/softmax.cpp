// Softmax / log-softmax over the last axis with scale and an additive mask, their backward,
// and the causal diag mask. x, y, g contiguous [rows, D]; the mask is any broadcast view.
// A row masked entirely (-inf everywhere) gives zeros rather than NaN.
#include <algorithm>
#include <cmath>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
template <class T>
void softmax_rows(const Tensor& x, const Tensor& mask, float scale, bool log, Tensor& y) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const float* pm = mask.defined() ? mask.data<float>() : nullptr;
  Shape mshape = x.shape();
  std::array<Strides, 1> mst{mask.defined() ? mask.strides() : Strides()};
  const int64_t m_inner = mask.defined() ? mask.stride(-1) : 0;
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    std::vector<float> z(static_cast<size_t>(D));
    for (int64_t r = b; r < e; ++r) {
      const T* xr = px + r * D;
      float* zr = z.data();
      const __m256 vs = _mm256_set1_ps(scale);
      __m256 vmax = _mm256_set1_ps(-INFINITY);
      int64_t j = 0;
      if (pm) {
        const float* mr = pm + row_offsets<1>(mshape, mst, r)[0];
        for (j = 0; j < D; ++j) zr[j] = to_f32(xr[j]) * scale + mr[j * m_inner];
        j = 0;
        for (; j + 8 <= D; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(zr + j));
      } else {
        for (; j + 8 <= D; j += 8) {
          __m256 v = _mm256_mul_ps(load8(xr + j), vs);
          _mm256_storeu_ps(zr + j, v);
          vmax = _mm256_max_ps(vmax, v);
        }
        for (int64_t k = j; k < D; ++k) zr[k] = to_f32(xr[k]) * scale;
      }
      float mx = hmax256(vmax);
      for (; j < D; ++j) mx = std::max(mx, zr[j]);
      T* yr = py + r * D;
      if (mx == -INFINITY) {  // fully masked row
        for (int64_t k = 0; k < D; ++k) yr[k] = from_f32<T>(log ? -INFINITY : 0.0f);
        continue;
      }
      const __m256 vmx = _mm256_set1_ps(mx);
      __m256 vsum = _mm256_setzero_ps();
      j = 0;
      if (log) {
        for (; j + 8 <= D; j += 8) vsum = _mm256_add_ps(vsum, exp256(_mm256_sub_ps(_mm256_loadu_ps(zr + j), vmx)));
      } else {
        for (; j + 8 <= D; j += 8) {
          __m256 ev = exp256(_mm256_sub_ps(_mm256_loadu_ps(zr + j), vmx));
          _mm256_storeu_ps(zr + j, ev);
          vsum = _mm256_add_ps(vsum, ev);
        }
      }
      float sum = hsum256(vsum);
      for (; j < D; ++j) {
        float ev = exp_scalar(zr[j] - mx);
        if (!log) zr[j] = ev;
        sum += ev;
      }
      j = 0;
      if (log) {
        const float shift = mx + std::log(sum);
        const __m256 vsh = _mm256_set1_ps(shift);
        for (; j + 8 <= D; j += 8) store8(yr + j, _mm256_sub_ps(_mm256_loadu_ps(zr + j), vsh));
        for (; j < D; ++j) yr[j] = from_f32<T>(zr[j] - shift);
      } else {
        const __m256 vinv = _mm256_set1_ps(1.0f / sum);
        for (; j + 8 <= D; j += 8) store8(yr + j, _mm256_mul_ps(_mm256_loadu_ps(zr + j), vinv));
        for (; j < D; ++j) yr[j] = from_f32<T>(zr[j] / sum);
      }
    }
  });
}
}  // namespace

void softmax(const Tensor& x, const Tensor& mask, float scale, bool log, Tensor& y) {
  dispatch_float(x.dtype(), "softmax",
                 [&]<class T>(std::type_identity<T>) { softmax_rows<T>(x, mask, scale, log, y); });
}

void softmax_backward(const Tensor& y, const Tensor& g, bool log, Tensor& dz) {
  const int64_t D = y.size(-1), rows = y.numel() / std::max<int64_t>(D, 1);
  dispatch_float(y.dtype(), "softmax_backward", [&]<class T>(std::type_identity<T>) {
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    T* pd = dz.data<T>();
    parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* yr = py + r * D;
        const T* gr = pg + r * D;
        T* dr = pd + r * D;
        __m256 acc = _mm256_setzero_ps();
        int64_t j = 0;
        if (log) {
          for (; j + 8 <= D; j += 8) acc = _mm256_add_ps(acc, load8(gr + j));
          float s = hsum256(acc);
          for (; j < D; ++j) s += to_f32(gr[j]);
          const __m256 vs = _mm256_set1_ps(s);
          j = 0;
          for (; j + 8 <= D; j += 8)
            store8(dr + j, _mm256_fnmadd_ps(exp256(load8(yr + j)), vs, load8(gr + j)));
          for (; j < D; ++j) dr[j] = from_f32<T>(to_f32(gr[j]) - exp_scalar(to_f32(yr[j])) * s);
        } else {
          for (; j + 8 <= D; j += 8) acc = _mm256_fmadd_ps(load8(gr + j), load8(yr + j), acc);
          float s = hsum256(acc);
          for (; j < D; ++j) s += to_f32(gr[j]) * to_f32(yr[j]);
          const __m256 vs = _mm256_set1_ps(s);
          j = 0;
          for (; j + 8 <= D; j += 8) store8(dr + j, _mm256_mul_ps(load8(yr + j), _mm256_sub_ps(load8(gr + j), vs)));
          for (; j < D; ++j) dr[j] = from_f32<T>(to_f32(yr[j]) * (to_f32(gr[j]) - s));
        }
      }
    });
  });
}

void diag_mask(const Tensor& x, int64_t n_past, float value, Tensor& y) {
  const int64_t Tk = x.size(-1), Tq = x.size(-2), rows = x.numel() / std::max<int64_t>(Tk, 1);
  dispatch_float(x.dtype(), "diag_mask_inf", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T fill = from_f32<T>(value);
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(Tk, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t i = r % Tq;
        const int64_t limit = std::clamp<int64_t>(n_past + i + 1, 0, Tk);  // columns < limit are kept
        for (int64_t j = 0; j < limit; ++j) py[r * Tk + j] = px[r * Tk + j];
        for (int64_t j = limit; j < Tk; ++j) py[r * Tk + j] = fill;
      }
    });
  });
}

}  // namespace toy::cpu
