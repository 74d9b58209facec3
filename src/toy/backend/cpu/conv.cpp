// im2col / col2im for conv2d, and the depthwise causal conv over time (ssm_conv) with its
// backward. Backward loops are partitioned so that each output element has one writer.
#include <algorithm>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
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

void ssm_conv(const Tensor& x, const Tensor& w, Tensor& y) {
  const int64_t B = y.size(0), T = y.size(1), C = y.size(2), K = w.size(1);
  dispatch_float(x.dtype(), "ssm_conv", [&]<class F>(std::type_identity<F>) {
    const F* px = x.data<F>();  // [B, T+K-1, C] contiguous
    const F* pw = w.data<F>();  // [C, K]
    F* py = y.data<F>();
    parallel_for(0, B * T, std::max<int64_t>(1, 4096 / std::max<int64_t>(C * K, 1)), [&](int64_t b0, int64_t b1) {
      for (int64_t bt = b0; bt < b1; ++bt) {
        const int64_t b = bt / T, t = bt % T;
        for (int64_t c = 0; c < C; ++c) {
          float s = 0;
          for (int64_t k = 0; k < K; ++k) s += to_f32(pw[c * K + k]) * to_f32(px[(b * (T + K - 1) + t + k) * C + c]);
          py[bt * C + c] = from_f32<F>(s);
        }
      }
    });
  });
}

void ssm_conv_backward(const Tensor& x, const Tensor& w, const Tensor& g, Tensor& dx, Tensor& dw) {
  const int64_t B = g.size(0), T = g.size(1), C = g.size(2), K = w.size(1), TX = T + K - 1;
  dispatch_float(x.dtype(), "ssm_conv_backward", [&]<class F>(std::type_identity<F>) {
    const F* px = x.data<F>();
    const F* pw = w.data<F>();
    const F* pg = g.data<F>();
    F* pdx = dx.data<F>();
    F* pdw = dw.defined() ? dw.data<F>() : nullptr;
    // Channels are independent: one channel range per task.
    parallel_for(0, C, 8, [&](int64_t c0, int64_t c1) {
      std::vector<float> col(static_cast<size_t>(TX));
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t b = 0; b < B; ++b) {
          std::fill(col.begin(), col.end(), 0.0f);
          for (int64_t t = 0; t < T; ++t) {
            const float gv = to_f32(pg[(b * T + t) * C + c]);
            for (int64_t k = 0; k < K; ++k) col[size_t(t + k)] += gv * to_f32(pw[c * K + k]);
          }
          for (int64_t t = 0; t < TX; ++t) pdx[(b * TX + t) * C + c] = from_f32<F>(col[size_t(t)]);
        }
        if (pdw) {
          for (int64_t k = 0; k < K; ++k) {
            float s = 0;
            for (int64_t b = 0; b < B; ++b)
              for (int64_t t = 0; t < T; ++t)
                s += to_f32(pg[(b * T + t) * C + c]) * to_f32(px[(b * TX + t + k) * C + c]);
            pdw[c * K + k] = from_f32<F>(to_f32(pdw[c * K + k]) + s);
          }
        }
      }
    });
  });
}

}  // namespace toy::cpu
