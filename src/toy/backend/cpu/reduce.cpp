// Reductions along one axis (sum, max with first-max index), argsort and top-k.
// Sums accumulate in double (long reductions of equal values would drift in f32).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {

Tensor contiguous_f(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor c = empty(x.shape(), x.dtype());
  copy(x, c);
  return c;
}

// Lanes accumulate in double: summing equal values in f32 lanes drifts systematically. With
// kSquares, each value's square (rounded to f32, as the Square kernel gives it) instead.
template <class T, bool kSquares = false>
double sum_contig(const T* p, int64_t n) {
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = load8(p + i);
    if constexpr (kSquares) v = _mm256_mul_ps(v, v);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  double total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    float x = to_f32(p[i]);
    if constexpr (kSquares) x = x * x;
    total += double(x);
  }
  return total;
}

}  // namespace

void square_norms_ranges(const Tensor& x, const std::vector<ArenaRange>& ranges, Tensor& out) {
  const float* p = x.data<float>();
  float* po = out.data<float>();
  // (each range one thread's, in Reduce's order: the bits of sum(square(range)))
  parallel_for(0, int64_t(ranges.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const ArenaRange& r = ranges[size_t(i)];
      po[i] = float(sum_contig<float, true>(p + r.begin, r.end - r.begin));
    }
  });
}

void reduce(kern::ReduceOp op, const Tensor& x_in, int axis, Tensor& out, Tensor* index) {
  Tensor x = contiguous_f(x_in);
  const Shape& s = x.shape();
  int64_t outer = 1, L = s[axis], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (int d = axis + 1; d < s.ndim(); ++d) inner *= s[d];
  dispatch_float(x.dtype(), "reduce", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int32_t* pi = index ? index->data<int32_t>() : nullptr;
    if (op == kern::ReduceOp::Sum) {
      if (inner == 1) {
        parallel_for(0, outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(L, 1)), [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) po[o] = from_f32<T>(float(sum_contig(px + o * L, L)));
        });
        return;
      }
      // Sum over a middle axis: accumulate whole rows of `inner` elements, in double.
      const int64_t chunk = 256;
      const int64_t n_chunks = (inner + chunk - 1) / chunk;
      parallel_for(0, outer * n_chunks, 1, [&](int64_t b, int64_t e) {
        std::vector<double> acc(static_cast<size_t>(chunk));
        std::vector<float> part(static_cast<size_t>(chunk));
        for (int64_t t = b; t < e; ++t) {
          int64_t o = t / n_chunks, j0 = (t % n_chunks) * chunk, m = std::min(chunk, inner - j0);
          std::fill(acc.begin(), acc.begin() + m, 0.0);
          const T* base = px + o * L * inner + j0;
          for (int64_t r0 = 0; r0 < L; r0 += 64) {
            std::fill(part.begin(), part.begin() + m, 0.0f);
            int64_t r1 = std::min(L, r0 + 64);
            for (int64_t r = r0; r < r1; ++r) {
              const T* row = base + r * inner;
              int64_t j = 0;
              for (; j + 8 <= m; j += 8)
                _mm256_storeu_ps(part.data() + j, _mm256_add_ps(_mm256_loadu_ps(part.data() + j), load8(row + j)));
              for (; j < m; ++j) part[size_t(j)] += to_f32(row[j]);
            }
            for (int64_t j = 0; j < m; ++j) acc[size_t(j)] += part[size_t(j)];
          }
          for (int64_t j = 0; j < m; ++j) po[o * inner + j0 + j] = from_f32<T>(float(acc[size_t(j)]));
        }
      });
      return;
    }
    // Max (and its first index), NaN-propagating like PyTorch.
    parallel_for(0, outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(L, 1)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / inner, j = t % inner;
        const T* base = px + o * L * inner + j;
        float best = -INFINITY;
        int32_t bi = 0;
        for (int64_t r = 0; r < L; ++r) {
          float v = to_f32(base[r * inner]);
          if (std::isnan(v)) {
            best = v;
            bi = int32_t(r);
            break;
          }
          if (v > best || r == 0) {
            best = v;
            bi = int32_t(r);
          }
        }
        po[t] = from_f32<T>(best);
        if (pi) pi[t] = bi;
      }
    });
  });
}

namespace {
template <class F>
void per_row(const Tensor& x_in, F&& f) {
  Tensor x = contiguous_f(x_in);
  const int64_t L = x.ndim() ? x.size(-1) : 1;
  const int64_t rows = L ? x.numel() / L : 0;
  dispatch_float(x.dtype(), "sort", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    parallel_for(0, rows, std::max<int64_t>(1, 2048 / std::max<int64_t>(L, 1)), [&](int64_t b, int64_t e) {
      std::vector<float> vals(static_cast<size_t>(L));
      std::vector<int32_t> idx(static_cast<size_t>(L));
      for (int64_t r = b; r < e; ++r) {
        for (int64_t j = 0; j < L; ++j) vals[size_t(j)] = to_f32(px[r * L + j]);
        std::iota(idx.begin(), idx.end(), 0);
        f(r, vals, idx);
      }
    });
  });
}
}  // namespace

// Orders with NaN above every number (as PyTorch does), so the comparators stay strict weak
// orderings when a row holds NaN.
inline bool less_nan_last(float a, float b) { return !std::isnan(a) && (std::isnan(b) || a < b); }

void argsort(const Tensor& x, bool descending, Tensor& indices) {
  const int64_t L = x.ndim() ? x.size(-1) : 1;
  int32_t* out = indices.data<int32_t>();
  per_row(x, [&](int64_t r, std::vector<float>& v, std::vector<int32_t>& idx) {
    if (descending)
      std::stable_sort(idx.begin(), idx.end(),
                       [&](int32_t a, int32_t b) { return less_nan_last(v[size_t(b)], v[size_t(a)]); });
    else
      std::stable_sort(idx.begin(), idx.end(),
                       [&](int32_t a, int32_t b) { return less_nan_last(v[size_t(a)], v[size_t(b)]); });
    std::copy(idx.begin(), idx.end(), out + r * L);
  });
}

void top_k(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  int32_t* oi = indices.data<int32_t>();
  dispatch_float(values.dtype(), "top_k", [&]<class T>(std::type_identity<T>) {
    T* ov = values.data<T>();
    per_row(x, [&](int64_t r, std::vector<float>& v, std::vector<int32_t>& idx) {
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        const float va = v[size_t(a)], vb = v[size_t(b)];
        if (less_nan_last(vb, va)) return true;
        if (less_nan_last(va, vb)) return false;
        return a < b;  // ties (and NaN pairs): lower index first
      });
      for (int64_t j = 0; j < k; ++j) {
        oi[r * k + j] = idx[size_t(j)];
        ov[r * k + j] = from_f32<T>(v[size_t(idx[size_t(j)])]);
      }
    });
  });
}

}  // namespace toy::cpu
