// im2col / col2im for conv2d, and the depthwise causal conv over time (ssm_conv) with its
// backward. Backward loops are partitioned so that each output element has one writer.
#include <algorithm>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/scratch.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

namespace {
struct ConvGeom {
  int64_t N, C, H, W, OH, OW, KK;
};
ConvGeom conv_geom(const Shape& x, const kern::Im2ColArgs& a) {
  ConvGeom g{x[0], x[1], x[2], x[3], 0, 0, 0};
  g.OH = (g.H + 2 * a.ph - a.dh * (a.kh - 1) - 1) / a.sh + 1;
  g.OW = (g.W + 2 * a.pw - a.dw * (a.kw - 1) - 1) / a.sw + 1;
  g.KK = g.C * a.kh * a.kw;
  return g;
}
}  // namespace

void im2col(const Tensor& x, const kern::Im2ColArgs& a, Tensor& cols) {
  const ConvGeom g = conv_geom(x.shape(), a);
  dispatch_float(x.dtype(), "im2col", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();  // contiguous
    T* pc = cols.data<T>();
    parallel_for(0, g.N * g.OH, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t n = t / g.OH, oh = t % g.OH;
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          T* row = pc + ((n * g.OH + oh) * g.OW + ow) * g.KK;
          for (int64_t c = 0; c < g.C; ++c)
            for (int64_t kh = 0; kh < a.kh; ++kh) {
              const int64_t ih = oh * a.sh - a.ph + kh * a.dh;
              for (int64_t kw = 0; kw < a.kw; ++kw) {
                const int64_t iw = ow * a.sw - a.pw + kw * a.dw;
                const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
                row[(c * a.kh + kh) * a.kw + kw] = in ? px[((n * g.C + c) * g.H + ih) * g.W + iw] : from_f32<T>(0.0f);
              }
            }
        }
      }
    });
  });
}

void col2im(const Tensor& cols, const kern::Im2ColArgs& a, Tensor& dx) {
  const ConvGeom g = conv_geom(dx.shape(), a);
  dispatch_float(dx.dtype(), "col2im", [&]<class T>(std::type_identity<T>) {
    const T* pc = cols.data<T>();
    T* pd = dx.data<T>();
    // One (n, c) plane per task: every dx element has a single writer.
    parallel_for(0, g.N * g.C, 1, [&](int64_t b, int64_t e) {
      std::vector<float> plane(size_t(g.H * g.W));
      for (int64_t t = b; t < e; ++t) {
        const int64_t n = t / g.C, c = t % g.C;
        std::fill(plane.begin(), plane.end(), 0.0f);
        for (int64_t oh = 0; oh < g.OH; ++oh)
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const T* row = pc + ((n * g.OH + oh) * g.OW + ow) * g.KK + c * a.kh * a.kw;
            for (int64_t kh = 0; kh < a.kh; ++kh) {
              const int64_t ih = oh * a.sh - a.ph + kh * a.dh;
              if (ih < 0 || ih >= g.H) continue;
              for (int64_t kw = 0; kw < a.kw; ++kw) {
                const int64_t iw = ow * a.sw - a.pw + kw * a.dw;
                if (iw < 0 || iw >= g.W) continue;
                plane[size_t(ih * g.W + iw)] += to_f32(row[kh * a.kw + kw]);
              }
            }
          }
        T* out = pd + (n * g.C + c) * g.H * g.W;
        for (int64_t i = 0; i < g.H * g.W; ++i) out[i] = from_f32<T>(plane[size_t(i)]);
      }
    });
  });
}

// The depthwise conv over time, y[b, t, c] = sum_k w[c, k] x[b, t + k, c]: rows of channels
// are contiguous, so every loop runs over c innermost with the taps transposed to [K, C]
// first (a strided walk down one channel's time axis would touch a cache line per element).
void ssm_conv(const Tensor& x, const Tensor& w, Tensor& y) {
  const int64_t B = y.size(0), T = y.size(1), C = y.size(2), K = w.size(1), TX = T + K - 1;
  dispatch_float(x.dtype(), "ssm_conv", [&]<class F>(std::type_identity<F>) {
    const F* px = x.data<F>();  // [B, T+K-1, C] contiguous
    const F* pw = w.data<F>();  // [C, K]
    F* py = y.data<F>();
    std::vector<float> wt(static_cast<size_t>(K * C));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < K; ++k) wt[size_t(k * C + c)] = to_f32(pw[c * K + k]);
    parallel_for(0, B * T, std::max<int64_t>(1, 16384 / std::max<int64_t>(C * K, 1)), [&](int64_t b0, int64_t b1) {
      float* acc = scratch_floats(size_t(C), 0);
      for (int64_t bt = b0; bt < b1; ++bt) {
        const int64_t b = bt / T, t = bt % T;
        std::fill_n(acc, C, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const F* xr = px + (b * TX + t + k) * C;
          const float* wk = wt.data() + k * C;
          for (int64_t c = 0; c < C; ++c) acc[c] += wk[c] * to_f32(xr[c]);
        }
        F* yr = py + bt * C;
        for (int64_t c = 0; c < C; ++c) yr[c] = from_f32<F>(acc[c]);
      }
    });
  });
}

// dx[b, s, c] = sum_k g[b, s - k, c] w[c, k] (0 <= s - k < T), by rows of dx; dw[c, k] +=
// sum_{b,t} g[b, t, c] x[b, t + k, c], by blocks of channels (one writer each).
void ssm_conv_backward(const Tensor& x, const Tensor& w, const Tensor& g, Tensor& dx, Tensor& dw) {
  const int64_t B = g.size(0), T = g.size(1), C = g.size(2), K = w.size(1), TX = T + K - 1;
  dispatch_float(x.dtype(), "ssm_conv_backward", [&]<class F>(std::type_identity<F>) {
    const F* px = x.data<F>();
    const F* pw = w.data<F>();
    const F* pg = g.data<F>();
    F* pdx = dx.data<F>();
    F* pdw = dw.defined() ? dw.data<F>() : nullptr;
    std::vector<float> wt(static_cast<size_t>(K * C));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < K; ++k) wt[size_t(k * C + c)] = to_f32(pw[c * K + k]);
    parallel_for(0, B * TX, std::max<int64_t>(1, 16384 / std::max<int64_t>(C * K, 1)), [&](int64_t r0, int64_t r1) {
      float* acc = scratch_floats(size_t(C), 0);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / TX, s = r % TX;
        std::fill_n(acc, C, 0.0f);
        for (int64_t k = 0; k < K; ++k) {
          const int64_t t = s - k;
          if (t < 0 || t >= T) continue;
          const F* gr = pg + (b * T + t) * C;
          const float* wk = wt.data() + k * C;
          for (int64_t c = 0; c < C; ++c) acc[c] += wk[c] * to_f32(gr[c]);
        }
        F* dr = pdx + r * C;
        for (int64_t c = 0; c < C; ++c) dr[c] = from_f32<F>(acc[c]);
      }
    });
    if (!pdw) return;
    constexpr int64_t kBlock = 64;
    parallel_for(0, (C + kBlock - 1) / kBlock, 1, [&](int64_t q0, int64_t q1) {
      float* acc = scratch_floats(size_t(K * kBlock), 1);
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t c0 = q * kBlock, n = std::min(kBlock, C - c0);
        std::fill_n(acc, K * kBlock, 0.0f);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) {
            const F* gr = pg + (b * T + t) * C + c0;
            for (int64_t k = 0; k < K; ++k) {
              const F* xr = px + (b * TX + t + k) * C + c0;
              float* ak = acc + k * kBlock;
              for (int64_t j = 0; j < n; ++j) ak[j] += to_f32(gr[j]) * to_f32(xr[j]);
            }
          }
        for (int64_t j = 0; j < n; ++j)
          for (int64_t k = 0; k < K; ++k) {
            F& d = pdw[(c0 + j) * K + k];
            d = from_f32<F>(to_f32(d) + acc[k * kBlock + j]);
          }
      }
    });
  });
}

}  // namespace toy::cpu
