// Softmax / log-softmax over the last axis with scale and an additive mask, their backward,
// and the causal diag mask. x, y, g contiguous [rows, D]; the mask is any broadcast view.
// A row masked entirely (-inf everywhere) gives zeros rather than NaN.
#include <algorithm>
#include <cmath>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

// One f32 row: y = softmax(z * scale) or log_softmax(z * scale), three passes over a row that
// stays in L1 (max; exp and sum; normalize). `e` is scratch of D floats (may be y itself when
// not streaming; may be z itself when z is scratch). Plain loops with local accumulators:
// this is the hot path of the softmax benchmark.
// `next` (may be null) is the next row's input: it is prefetched a line per 16 elements while
// this row computes, so the next max pass reads from cache instead of waiting on memory.
void softmax_row_f32(const float* z, float scale, bool log, float* y, float* e, int64_t D, bool stream,
                     const float* next) {
  const __m256 vs = _mm256_set1_ps(scale);
  // max(z * scale) = max(z) * scale for scale > 0 (rounding is monotone): the scale costs
  // one multiply per row. Other scales (rare) take a scalar loop.
  float mx = -INFINITY;
  if (scale > 0.0f) {
    mx = max_row(z, D, -INFINITY) * scale;
  } else {
    for (int64_t k = 0; k < D; ++k) mx = std::max(mx, z[k] * scale);
  }
  if (mx == -INFINITY) {  // fully masked row
    for (int64_t k = 0; k < D; ++k) y[k] = log ? -INFINITY : 0.0f;
    return;
  }
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t j = 0;
  for (; j + 16 <= D; j += 16) {
    if (next) _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T0);
    __m256 a = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j), vs, vmx));
    __m256 b = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j + 8), vs, vmx));
    if (!log) {
      _mm256_storeu_ps(e + j, a);
      _mm256_storeu_ps(e + j + 8, b);
    }
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  for (; j + 8 <= D; j += 8) {
    __m256 a = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j), vs, vmx));
    if (!log) _mm256_storeu_ps(e + j, a);
    s0 = _mm256_add_ps(s0, a);
  }
  float sum = hsum256(_mm256_add_ps(s0, s1));
  for (; j < D; ++j) {
    float ev = exp_nonpos_scalar(std::fma(z[j], scale, -mx));
    if (!log) e[j] = ev;
    sum += ev;
  }
  j = 0;
  if (log) {
    const float shift = mx + std::log(sum);
    const __m256 vsh = _mm256_set1_ps(shift);
    for (; j + 8 <= D; j += 8) store8_f32(y + j, _mm256_fmsub_ps(_mm256_loadu_ps(z + j), vs, vsh), stream);
    for (; j < D; ++j) y[j] = std::fma(z[j], scale, -shift);
  } else {
    const float inv = 1.0f / sum;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (; j + 8 <= D; j += 8) store8_f32(y + j, _mm256_mul_ps(_mm256_loadu_ps(e + j), vinv), stream);
    for (; j < D; ++j) y[j] = e[j] * inv;
  }
}

// One row of the streaming softmax: cur = exp(z * scale - mx), returning their sum, while
// the row before it goes out to memory: pending_y = prev * inv through streaming stores
// (pending_y null: none). `next` (may be null) is prefetched. D % 8 == 0.
float exps_beside_stores(const float* z, float scale, float mx, float* cur, const float* next, const float* prev,
                         float inv, float* pending_y, int64_t D) {
  const __m256 vs = _mm256_set1_ps(scale), vmx = _mm256_set1_ps(mx), vinv = _mm256_set1_ps(inv);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  int64_t j = 0;
  for (; j + 16 <= D; j += 16) {
    if (next) _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T1);
    const __m256 a = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j), vs, vmx));
    const __m256 c = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j + 8), vs, vmx));
    _mm256_storeu_ps(cur + j, a);
    _mm256_storeu_ps(cur + j + 8, c);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, c);
    if (pending_y) {
      _mm256_stream_ps(pending_y + j, _mm256_mul_ps(_mm256_loadu_ps(prev + j), vinv));
      _mm256_stream_ps(pending_y + j + 8, _mm256_mul_ps(_mm256_loadu_ps(prev + j + 8), vinv));
    }
  }
  if (j < D) {  // the last 8
    const __m256 a = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j), vs, vmx));
    _mm256_storeu_ps(cur + j, a);
    s0 = _mm256_add_ps(s0, a);
    if (pending_y) _mm256_stream_ps(pending_y + j, _mm256_mul_ps(_mm256_loadu_ps(prev + j), vinv));
  }
  return hsum256(_mm256_add_ps(s0, s1));
}

// The same on 16 lanes (the same bits: simd512.h).
TOY_AVX512 float exps_beside_stores512(const float* z, float scale, float mx, float* cur, const float* next,
                                       const float* prev, float inv, float* pending_y, int64_t D) {
  const __m512 vs = _mm512_set1_ps(scale), vmx = _mm512_set1_ps(mx), vinv = _mm512_set1_ps(inv);
  __m512 s = _mm512_setzero_ps();
  // 512-bit streaming stores need 64-byte alignment; rows are only sure of 32 (D % 16 == 8).
  const bool aligned64 = (reinterpret_cast<uintptr_t>(pending_y) & 63) == 0;
  int64_t j = 0;
  for (; j + 16 <= D; j += 16) {
    if (next) _mm_prefetch(reinterpret_cast<const char*>(next + j), _MM_HINT_T1);
    const __m512 a = exp512_nonpos(_mm512_fmsub_ps(_mm512_loadu_ps(z + j), vs, vmx));
    _mm512_storeu_ps(cur + j, a);
    s = _mm512_add_ps(s, a);
    if (pending_y) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(prev + j), vinv);
      if (aligned64) {
        _mm512_stream_ps(pending_y + j, v);
      } else {
        _mm256_stream_ps(pending_y + j, low256(v));
        _mm256_stream_ps(pending_y + j + 8, high256(v));
      }
    }
  }
  __m256 s0 = low256(s);
  if (j < D) {  // the last 8
    const __m256 a = exp256_nonpos(_mm256_fmsub_ps(_mm256_loadu_ps(z + j), low256(vs), low256(vmx)));
    _mm256_storeu_ps(cur + j, a);
    s0 = _mm256_add_ps(s0, a);
    if (pending_y) _mm256_stream_ps(pending_y + j, _mm256_mul_ps(_mm256_loadu_ps(prev + j), low256(vinv)));
  }
  return hsum256(_mm256_add_ps(s0, high256(s)));
}

// Softmax rows [b, e) of f32 x into y through streaming stores, software-pipelined: row r's
// normalized values go out to memory while row r + 1's exps are computed, so the stores
// (bound by memory) overlap the arithmetic instead of following it. Same operations, in the
// same order per row, as softmax_row_f32: the same bits. D % 8 == 0 (stream_rows).
void softmax_stream_rows_f32(const float* x, float scale, float* y, int64_t D, int64_t b, int64_t e) {
  const bool wide = avx512_forms();
  float* ebuf[2] = {scratch_floats(size_t(D), 0), scratch_floats(size_t(D), 1)};
  float* pending_y = nullptr;  // the row whose exps wait in ebuf[1] for their normalized stores
  float pending_inv = 0.0f;
  auto flush_pending = [&] {
    if (!pending_y) return;
    const __m256 vinv = _mm256_set1_ps(pending_inv);
    for (int64_t j = 0; j < D; j += 8) _mm256_stream_ps(pending_y + j, _mm256_mul_ps(_mm256_loadu_ps(ebuf[1] + j), vinv));
    pending_y = nullptr;
  };
  for (int64_t r = b; r < e; ++r) {
    const float* z = x + r * D;
    float mx = -INFINITY;
    if (scale > 0.0f) {
      mx = (wide ? max_row512(z, D, -INFINITY) : max_row(z, D, -INFINITY)) * scale;
    } else {
      for (int64_t k = 0; k < D; ++k) mx = std::max(mx, z[k] * scale);
    }
    if (mx == -INFINITY) {  // fully masked row: zeros
      flush_pending();
      for (int64_t j = 0; j < D; j += 8) _mm256_stream_ps(y + r * D + j, _mm256_setzero_ps());
      continue;
    }
    const float* next = r + 1 < e ? z + D : nullptr;
    const float sum = wide ? exps_beside_stores512(z, scale, mx, ebuf[0], next, ebuf[1], pending_inv, pending_y, D)
                           : exps_beside_stores(z, scale, mx, ebuf[0], next, ebuf[1], pending_inv, pending_y, D);
    pending_y = y + r * D;
    pending_inv = 1.0f / sum;
    std::swap(ebuf[0], ebuf[1]);
  }
  flush_pending();
  _mm_sfence();
}

// Rows of x (any float dtype) with an optional broadcast mask. f32 rows without a mask go
// straight through softmax_row_f32 (softmax_stream_rows_f32 when the output streams: large,
// not log); others stage z = x * scale + mask in f32 first.
template <class T>
void softmax_rows(const Tensor& x, const Tensor& mask, float scale, bool log, Tensor& y) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const float* pm = mask.defined() ? mask.data<float>() : nullptr;
  Shape mshape = x.shape();
  std::array<Strides, 1> mst{mask.defined() ? mask.strides() : Strides()};
  const int64_t m_inner = mask.defined() ? mask.stride(-1) : 0;
  constexpr bool kF32 = std::is_same_v<T, float>;
  bool stream = false;
  if constexpr (kF32) stream = stream_rows(py, D, y.nbytes());
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
    // Row buffers only where used: staged inputs (a mask, or not f32) and scratch for exps that
    // cannot live in the output row.
    const bool staged = pm || !kF32;
    if constexpr (kF32) {
      if (stream && !pm && !log) return softmax_stream_rows_f32(px, scale, py, D, b, e);
    }
    std::vector<float> zbuf(staged ? size_t(D) : 0), ebuf(staged || stream ? size_t(D) : 0), obuf(kF32 ? 0 : size_t(D));
    for (int64_t r = b; r < e; ++r) {
      const T* xr = px + r * D;
      const float* z;
      float sc = scale;
      if constexpr (kF32) z = xr;
      if (pm || !kF32) {
        const float* mr = pm ? pm + row_offsets<1>(mshape, mst, r)[0] : nullptr;
        for (int64_t j = 0; j < D; ++j) zbuf[size_t(j)] = to_f32(xr[j]) * scale + (mr ? mr[j * m_inner] : 0.0f);
        z = zbuf.data();
        sc = 1.0f;
      }
      if constexpr (kF32) {
        float* yr = py + r * D;
        const float* next = (!pm && r + 1 < e) ? xr + D : nullptr;
        softmax_row_f32(z, sc, log, yr, stream || z != xr ? ebuf.data() : yr, D, stream, next);
      } else {
        softmax_row_f32(z, sc, log, obuf.data(), ebuf.data(), D, false, nullptr);
        T* yr = py + r * D;
        for (int64_t j = 0; j < D; ++j) yr[j] = from_f32<T>(obuf[size_t(j)]);
      }
    }
    if (stream) _mm_sfence();
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
            store8(dr + j, _mm256_fnmadd_ps(exp256_nonpos(load8(yr + j)), vs, load8(gr + j)));
          for (; j < D; ++j) dr[j] = from_f32<T>(to_f32(gr[j]) - exp_nonpos_scalar(to_f32(yr[j])) * s);
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
