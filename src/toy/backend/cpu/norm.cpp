// Norms over the last axis: rms_norm, layer_norm, l2_norm, forward and backward.
// Contract: x and g contiguous [rows, D]; y/dx "=" ; dw/db "+=" (summed over rows through
// per-task partial buffers folded in task order, so the result is fixed for a thread count).
// Statistics (rstd, mean, inverse norm) are F32 [rows]. Tolerance vs double loops: 1e-5 rel.
#include <cmath>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

template <class T>
inline float sum_row(const T* a, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= D; j += 8) acc = _mm256_add_ps(acc, load8(a + j));
  float s = hsum256(acc);
  for (; j < D; ++j) s += to_f32(a[j]);
  return s;
}

// The row chunks of a backward pass's per-chunk partial sums (the weight and bias gradients):
// a function of the shape alone, never of the thread count, so the sums and their folding
// order — the gradient's bits — are the same on 1 thread or 64 (a data-parallel run of
// one-thread processes then equals one process on many threads).
constexpr int64_t kMaxNormChunks = 64;
int64_t norm_chunks(int64_t rows, int64_t D) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(kMaxNormChunks, rows * D / 8192));
  return std::min(chunks, std::max<int64_t>(rows, 1));
}

// Runs fn(chunk, row_begin, row_end) over norm_chunks' fixed partition of the rows (spread
// over the threads), and returns the chunk count (for folding per-chunk partial sums).
template <class F>
int64_t chunked_rows(int64_t rows, int64_t D, F&& fn) {
  const int64_t chunks = norm_chunks(rows, D);
  parallel_tasks(chunks, [&](int64_t c) { fn(c, rows * c / chunks, rows * (c + 1) / chunks); });
  return chunks;
}

template <class T>
void fold_into(const std::vector<float>& partial, int64_t chunks, int64_t D, Tensor& out) {
  T* o = out.data<T>();
  for (int64_t j = 0; j < D; ++j) {
    float s = to_f32(o[j]);
    for (int64_t c = 0; c < chunks; ++c) s += partial[size_t(c * D + j)];
    o[j] = from_f32<T>(s);
  }
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "rms_norm", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    T* py = y.data<T>();
    float* pr = rstd.data<float>();
    bool stream = false;
    if constexpr (std::is_same_v<T, float>) stream = stream_rows(py, D, y.nbytes());
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * D;
        T* yr = py + r * D;
        float rs = 1.0f / std::sqrt(dot_row(xr, xr, D) / float(D) + eps);
        pr[r] = rs;
        __m256 vr = _mm256_set1_ps(rs);
        int64_t j = 0;
        for (; j + 8 <= D; j += 8) {
          __m256 v = _mm256_mul_ps(load8(xr + j), vr);
          if (pw) v = _mm256_mul_ps(v, load8(pw + j));
          if constexpr (std::is_same_v<T, float>)
            store8_f32(yr + j, v, stream);
          else
            store8(yr + j, v);
        }
        for (; j < D; ++j) yr[j] = from_f32<T>(to_f32(xr[j]) * rs * (pw ? to_f32(pw[j]) : 1.0f));
      }
      if (stream) _mm_sfence();
    });
  });
}

void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "rms_norm_backward", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const float* pr = rstd.data<float>();
    T* pdx = dx.data<T>();
    const bool want_dw = dw.defined();
    std::vector<float> partial;
    if (want_dw) partial.assign(size_t(norm_chunks(rows, D) * D), 0.0f);
    int64_t chunks = chunked_rows(rows, D, [&](int64_t c, int64_t b, int64_t e) {
      float* gw = scratch_floats(size_t(D), 0);
      float* acc = want_dw ? partial.data() + c * D : nullptr;
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * D;
        const T* gr = pg + r * D;
        const float rs = pr[r];
        // gw = g * w; s = sum(gw * x); dw += g * x * rstd
        __m256 vs = _mm256_setzero_ps();
        const __m256 vr = _mm256_set1_ps(rs);
        int64_t j = 0;
        for (; j + 8 <= D; j += 8) {
          const __m256 gv = load8(gr + j), xv = load8(xr + j);
          const __m256 gwv = pw ? _mm256_mul_ps(gv, load8(pw + j)) : gv;
          _mm256_storeu_ps(gw + j, gwv);
          vs = _mm256_fmadd_ps(gwv, xv, vs);
          if (acc) _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(_mm256_mul_ps(gv, xv), vr, _mm256_loadu_ps(acc + j)));
        }
        float s = hsum256(vs);
        for (; j < D; ++j) {
          const float gv = to_f32(gr[j]), xv = to_f32(xr[j]);
          gw[j] = gv * (pw ? to_f32(pw[j]) : 1.0f);
          s += gw[j] * xv;
          if (acc) acc[j] += gv * xv * rs;
        }
        // dx = rstd * gw - x * s * rstd^3 / D
        const float k = s * rs * rs * rs / float(D);
        const __m256 vk = _mm256_set1_ps(k);
        T* dr = pdx + r * D;
        j = 0;
        for (; j + 8 <= D; j += 8)
          store8(dr + j, _mm256_fnmadd_ps(vk, load8(xr + j), _mm256_mul_ps(vr, _mm256_loadu_ps(gw + j))));
        for (; j < D; ++j) dr[j] = from_f32<T>(rs * gw[j] - k * to_f32(xr[j]));
      }
    });
    if (want_dw) fold_into<T>(partial, chunks, D, dw);
  });
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "layer_norm", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const T* pb = b.defined() ? b.data<T>() : nullptr;
    T* py = y.data<T>();
    float* pm = mean.data<float>();
    float* pr = rstd.data<float>();
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        const T* xr = px + r * D;
        T* yr = py + r * D;
        const float mu = sum_row(xr, D) / float(D);
        // Two-pass variance (exact for rows with a large mean).
        __m256 vmu = _mm256_set1_ps(mu), acc = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= D; j += 8) {
          __m256 d = _mm256_sub_ps(load8(xr + j), vmu);
          acc = _mm256_fmadd_ps(d, d, acc);
        }
        float var = hsum256(acc);
        for (; j < D; ++j) var += (to_f32(xr[j]) - mu) * (to_f32(xr[j]) - mu);
        const float rs = 1.0f / std::sqrt(var / float(D) + eps);
        pm[r] = mu;
        pr[r] = rs;
        __m256 vr = _mm256_set1_ps(rs);
        j = 0;
        for (; j + 8 <= D; j += 8) {
          __m256 v = _mm256_mul_ps(_mm256_sub_ps(load8(xr + j), vmu), vr);
          if (pw) v = _mm256_mul_ps(v, load8(pw + j));
          if (pb) v = _mm256_add_ps(v, load8(pb + j));
          store8(yr + j, v);
        }
        for (; j < D; ++j) {
          float v = (to_f32(xr[j]) - mu) * rs;
          if (pw) v *= to_f32(pw[j]);
          if (pb) v += to_f32(pb[j]);
          yr[j] = from_f32<T>(v);
        }
      }
    });
  });
}

void layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& g,
                         Tensor& dx, Tensor& dw, Tensor& db) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "layer_norm_backward", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    const T* pw = w.defined() ? w.data<T>() : nullptr;
    const float* pm = mean.data<float>();
    const float* pr = rstd.data<float>();
    T* pdx = dx.data<T>();
    const bool want_dw = dw.defined(), want_db = db.defined();
    std::vector<float> pdw, pdb;
    if (want_dw) pdw.assign(size_t(norm_chunks(rows, D) * D), 0.0f);
    if (want_db) pdb.assign(size_t(norm_chunks(rows, D) * D), 0.0f);
    int64_t chunks = chunked_rows(rows, D, [&](int64_t c, int64_t b, int64_t e) {
      float* xhat = scratch_floats(size_t(D), 0);
      float* gw = scratch_floats(size_t(D), 1);
      float* aw = want_dw ? pdw.data() + c * D : nullptr;
      float* ab = want_db ? pdb.data() + c * D : nullptr;
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * D;
        const T* gr = pg + r * D;
        const float mu = pm[r], rs = pr[r];
        const __m256 vmu = _mm256_set1_ps(mu), vr = _mm256_set1_ps(rs);
        __m256 sgw = _mm256_setzero_ps(), sgwx = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= D; j += 8) {
          const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(load8(xr + j), vmu), vr);
          const __m256 gv = load8(gr + j);
          const __m256 gwv = pw ? _mm256_mul_ps(gv, load8(pw + j)) : gv;
          _mm256_storeu_ps(xhat + j, xh);
          _mm256_storeu_ps(gw + j, gwv);
          sgw = _mm256_add_ps(sgw, gwv);
          sgwx = _mm256_fmadd_ps(gwv, xh, sgwx);
          if (aw) _mm256_storeu_ps(aw + j, _mm256_fmadd_ps(gv, xh, _mm256_loadu_ps(aw + j)));
          if (ab) _mm256_storeu_ps(ab + j, _mm256_add_ps(gv, _mm256_loadu_ps(ab + j)));
        }
        float mean_gw = hsum256(sgw), mean_gwx = hsum256(sgwx);
        for (; j < D; ++j) {
          const float xh = (to_f32(xr[j]) - mu) * rs, gj = to_f32(gr[j]);
          const float gwj = gj * (pw ? to_f32(pw[j]) : 1.0f);
          xhat[j] = xh;
          gw[j] = gwj;
          mean_gw += gwj;
          mean_gwx += gwj * xh;
          if (aw) aw[j] += gj * xh;
          if (ab) ab[j] += gj;
        }
        mean_gw /= float(D);
        mean_gwx /= float(D);
        // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
        const __m256 vmg = _mm256_set1_ps(mean_gw), vmgx = _mm256_set1_ps(mean_gwx);
        T* dr = pdx + r * D;
        j = 0;
        for (; j + 8 <= D; j += 8) {
          const __m256 t = _mm256_fnmadd_ps(_mm256_loadu_ps(xhat + j), vmgx, _mm256_sub_ps(_mm256_loadu_ps(gw + j), vmg));
          store8(dr + j, _mm256_mul_ps(vr, t));
        }
        for (; j < D; ++j) dr[j] = from_f32<T>(rs * (gw[j] - mean_gw - xhat[j] * mean_gwx));
      }
    });
    if (want_dw) fold_into<T>(pdw, chunks, D, dw);
    if (want_db) fold_into<T>(pdb, chunks, D, db);
  });
}

void l2_norm(const Tensor& x, float eps, Tensor& y, Tensor& inv) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "l2_norm", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    float* pi = inv.data<float>();
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * D;
        float n = std::sqrt(dot_row(xr, xr, D));
        float iv = 1.0f / std::max(n, eps);
        pi[r] = iv;
        for (int64_t j = 0; j < D; ++j) py[r * D + j] = from_f32<T>(to_f32(xr[j]) * iv);
      }
    });
  });
}

void l2_norm_backward(const Tensor& x, const Tensor& y, const Tensor& inv, float eps, const Tensor& g, Tensor& dx) {
  const int64_t D = x.size(-1), rows = x.numel() / std::max<int64_t>(D, 1);
  dispatch_float(x.dtype(), "l2_norm_backward", [&]<class T>(std::type_identity<T>) {
    const T* py = y.data<T>();
    const T* pg = g.data<T>();
    const float* pi = inv.data<float>();
    T* pdx = dx.data<T>();
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float iv = pi[r];
        // Below eps the norm is the constant eps: the map is a plain scale.
        const bool clamped = iv >= 1.0f / eps;
        const float s = clamped ? 0.0f : dot_row(py + r * D, pg + r * D, D);
        for (int64_t j = 0; j < D; ++j)
          pdx[r * D + j] = from_f32<T>(iv * (to_f32(pg[r * D + j]) - to_f32(py[r * D + j]) * s));
      }
    });
  });
}

}  // namespace toy::cpu
