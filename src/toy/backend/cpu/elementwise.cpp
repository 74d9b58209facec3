// Elementwise CPU kernels: unary ops and their backward, binary ops with broadcasting,
// swiglu, dropout, copy/cast and fill. Every float element goes through the same 8-wide
// vector function whatever its position (tails and strided runs are staged through a small
// buffer), so results do not depend on layout or thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/backend/cpu/simd.h"
#include "toy/backend/cpu/simd512.h"
#include "toy/backend/cpu/variant.h"
#include "toy/core/quant.h"
#include "toy/core/rng.h"
#include "toy/core/strided.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

using kern::BinaryOp;
using kern::UnaryArgs;
using kern::UnaryOp;

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per task: enough to amortize a wake-up

// ---- vector forms of the unary functions --------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = c (x + k x^3); the
// sigmoid form needs one exp and one division and no cancellation near 0.
inline __m256 gelu_u2(__m256 x) {  // 2u
  const __m256 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
  return _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(k, x), _mm256_mul_ps(x, x), x));
}
inline __m256 gelu_tanh8(__m256 x) { return _mm256_mul_ps(x, sigmoid256(gelu_u2(x))); }

// The standard normal CDF Φ(x) = erfc(-x / √2) / 2, erfc from Numerical Recipes' Chebyshev
// fit (relative error below 1.2e-7 for every argument), so both tails keep full precision:
// exact GELU is x Φ(x), and its derivative Φ(x) + x φ(x).
inline __m256 normal_cdf8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  const __m256 v = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(half, a, one));
  __m256 p = _mm256_set1_ps(0.17087277f);
  for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f, 0.09678418f, 0.37409196f,
                  1.00002368f, -1.26551223f})
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
  const __m256 erfc_a = _mm256_mul_ps(t, exp256_nonpos(_mm256_min_ps(_mm256_setzero_ps(), _mm256_fnmadd_ps(a, a, p))));
  const __m256 h = _mm256_mul_ps(half, erfc_a);
  // v < 0: Φ = erfc(|v|)/2; v >= 0: 1 - erfc(v)/2.
  return _mm256_blendv_ps(_mm256_sub_ps(one, h), h, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ));
}

template <class F>
inline __m256 scalar8(__m256 x, F f) {
  alignas(32) float t[8];
  _mm256_store_ps(t, x);
  for (float& v : t) v = f(v);
  return _mm256_load_ps(t);
}

inline __m256 unary8(UnaryOp op, __m256 x, const UnaryArgs& a) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  switch (op) {
    case UnaryOp::Neg: return _mm256_sub_ps(zero, x);
    case UnaryOp::Exp: return exp256(x);
    case UnaryOp::Log: return log256(x);
    case UnaryOp::Sqrt: return _mm256_sqrt_ps(x);
    case UnaryOp::Rsqrt: return _mm256_div_ps(one, _mm256_sqrt_ps(x));
    case UnaryOp::Square: return _mm256_mul_ps(x, x);
    case UnaryOp::Abs: return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    case UnaryOp::Tanh: return tanh256(x);
    case UnaryOp::Sigmoid: return sigmoid256(x);
    case UnaryOp::Relu: return _mm256_max_ps(zero, x);  // operand order keeps NaN
    case UnaryOp::Silu: return _mm256_mul_ps(x, sigmoid256(x));
    case UnaryOp::GeluTanh: return gelu_tanh8(x);
    case UnaryOp::GeluErf: return _mm256_mul_ps(x, normal_cdf8(x));
    case UnaryOp::Scale: return _mm256_mul_ps(x, _mm256_set1_ps(a.alpha));
    case UnaryOp::Clamp: return _mm256_min_ps(_mm256_set1_ps(a.hi), _mm256_max_ps(_mm256_set1_ps(a.lo), x));  // keeps NaN
    case UnaryOp::Softplus:  // log(1 + e^x); x itself above 20 (as PyTorch and ggml)
      return scalar8(x, [](float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); });
  }
  return x;
}

inline __m256 unary_grad8(UnaryOp op, __m256 x, __m256 y, __m256 g, const UnaryArgs& a) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
  switch (op) {
    case UnaryOp::Neg: return _mm256_sub_ps(zero, g);
    case UnaryOp::Exp: return _mm256_mul_ps(g, y);
    case UnaryOp::Log: return _mm256_div_ps(g, x);
    case UnaryOp::Sqrt: return _mm256_div_ps(_mm256_mul_ps(g, half), y);
    case UnaryOp::Rsqrt:  // d/dx x^-1/2 = -1/2 y^3
      return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_set1_ps(-0.5f)), _mm256_mul_ps(_mm256_mul_ps(y, y), y));
    case UnaryOp::Square: return _mm256_mul_ps(g, _mm256_add_ps(x, x));
    case UnaryOp::Abs: {
      __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), one);
      __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), one);
      return _mm256_mul_ps(g, _mm256_sub_ps(pos, neg));
    }
    case UnaryOp::Tanh: return _mm256_mul_ps(g, _mm256_fnmadd_ps(y, y, one));
    case UnaryOp::Sigmoid: {
      __m256 sv, cv;
      sigmoid_pair256(x, &sv, &cv);
      return _mm256_mul_ps(g, _mm256_mul_ps(sv, cv));
    }
    case UnaryOp::Relu: return _mm256_and_ps(g, _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
    case UnaryOp::Silu: {
      __m256 sv, cv;  // s and 1 - s
      sigmoid_pair256(x, &sv, &cv);
      return _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(x, sv), cv, sv));  // s + x s (1 - s)
    }
    case UnaryOp::GeluTanh: {
      // d/dx [x s(2u)] = s + x s (1 - s) 2u',  2u' = 2c (1 + 3k x^2)
      __m256 s, c;  // s and 1 - s, each exact in its own tail
      sigmoid_pair256(gelu_u2(x), &s, &c);
      const __m256 du2 = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f),
                                       _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), _mm256_mul_ps(x, x), one));
      const __m256 xs1s = _mm256_mul_ps(_mm256_mul_ps(x, s), c);
      return _mm256_mul_ps(g, _mm256_fmadd_ps(xs1s, du2, s));
    }
    case UnaryOp::GeluErf: {
      const __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(0.3989422804014327f),
                                       exp256_nonpos(_mm256_mul_ps(_mm256_set1_ps(-0.5f), _mm256_mul_ps(x, x))));
      return _mm256_mul_ps(g, _mm256_fmadd_ps(x, pdf, normal_cdf8(x)));
    }
    case UnaryOp::Scale: return _mm256_mul_ps(g, _mm256_set1_ps(a.alpha));
    case UnaryOp::Clamp: {
      __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(a.lo), _CMP_GE_OQ),
                                _mm256_cmp_ps(x, _mm256_set1_ps(a.hi), _CMP_LE_OQ));
      return _mm256_and_ps(g, in);
    }
    case UnaryOp::Softplus: {  // sigmoid(x); 1 above the threshold, where softplus is x
      const __m256 s = sigmoid256(x);
      return _mm256_mul_ps(g, _mm256_blendv_ps(s, one, _mm256_cmp_ps(x, _mm256_set1_ps(20.0f), _CMP_GT_OQ)));
    }
  }
  return g;
}

// K vector registers passed to an elementwise function (std::array<__m256> would drop the
// type's alignment attribute).
template <int K>
struct Lanes {
  __m256 v[K];
  __m256& operator[](int i) { return v[i]; }
  const __m256& operator[](int i) const { return v[i]; }
};

// Elements [b, e) of K contiguous inputs into o, 8 at a time; the last fewer than 8 padded.
template <class T, int K, class F>
void map_span(const std::array<const T*, K>& base, T* o, int64_t b, int64_t e, F& f) {
  int64_t i = b;
  Lanes<K> v;
  for (; i + 8 <= e; i += 8) {
    for (int k = 0; k < K; ++k) v[k] = load8(base[k] + i);
    store8(o + i, f(v));
  }
  if (i < e) {
    alignas(32) float buf[K][8] = {};
    alignas(32) float res[8];
    for (int64_t j = i; j < e; ++j)
      for (int k = 0; k < K; ++k) buf[k][j - i] = to_f32(base[k][j]);
    for (int k = 0; k < K; ++k) v[k] = _mm256_load_ps(buf[k]);
    _mm256_store_ps(res, f(v));
    for (int64_t j = i; j < e; ++j) o[j] = from_f32<T>(res[j - i]);
  }
}

// Applies f to K inputs (any layout, same shape as contiguous out) 8 at a time.
// f: (const Lanes<K>&) -> __m256.
template <class T, int K, class F>
void map_elements(const std::array<const Tensor*, K>& in, Tensor& out, F f) {
  const int64_t n = out.numel();
  if (n == 0) return;
  T* o = out.data<T>();
  std::array<const T*, K> base;
  bool all_contig = true;
  for (int k = 0; k < K; ++k) {
    base[k] = static_cast<const T*>(in[k]->raw_data());
    all_contig = all_contig && in[k]->is_contiguous();
  }
  if (all_contig) {
    parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { map_span<T, K>(base, o, b, e, f); });
    return;
  }
  // Strided: rows of the (coalesced) innermost dim, staged 8 at a time.
  Shape shape = out.shape();
  std::array<Strides, K> st;
  for (int k = 0; k < K; ++k) st[k] = in[k]->strides();
  coalesce<K>(shape, st);
  if (shape.ndim() == 0) shape.push_back(1), [&] { for (auto& s : st) s.push_back(1); }();
  const int64_t inner = shape.back();
  const int64_t rows = n / inner;
  std::array<int64_t, K> istride;
  for (int k = 0; k < K; ++k) istride[k] = st[k].back();
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)), [&](int64_t rb, int64_t re) {
    alignas(32) float buf[K][8];
    alignas(32) float res[8];
    Lanes<K> v;
    for (int64_t r = rb; r < re; ++r) {
      auto off = row_offsets<K>(shape, st, r);
      T* orow = o + r * inner;
      for (int64_t j0 = 0; j0 < inner; j0 += 8) {
        int64_t m = std::min<int64_t>(8, inner - j0);
        for (int k = 0; k < K; ++k) {
          for (int64_t j = 0; j < m; ++j) buf[k][j] = to_f32(base[k][off[k] + (j0 + j) * istride[k]]);
          for (int64_t j = m; j < 8; ++j) buf[k][j] = 0;
          v[k] = _mm256_load_ps(buf[k]);
        }
        _mm256_store_ps(res, f(v));
        for (int64_t j = 0; j < m; ++j) orow[j0 + j] = from_f32<T>(res[j]);
      }
    }
  });
}

}  // namespace

// ---- AVX-512 forms (variant.h) of the activations training and inference spend time in ----
// Sigmoid, SiLU, GELU (tanh) and their gradients, SwiGLU, on contiguous f32: 16 lanes, each
// lane the 8-lane form's operations in the same order, so the same bits; the elements past
// the last 16 go through the 8-lane form.
namespace {

// The activations: what the 16-lane forms cover, and what the 8-lane forms run with the op
// fixed at compile time.
bool is_activation(UnaryOp op) { return op == UnaryOp::Sigmoid || op == UnaryOp::Silu || op == UnaryOp::GeluTanh; }

// f.template operator()<op>() for an activation: the op a compile-time constant, so that the
// switch of unary8 and unary_grad8 folds away inside the element loop.
template <class F>
void with_activation(UnaryOp op, F&& f) {
  if (op == UnaryOp::Sigmoid) f.template operator()<UnaryOp::Sigmoid>();
  if (op == UnaryOp::Silu) f.template operator()<UnaryOp::Silu>();
  if (op == UnaryOp::GeluTanh) f.template operator()<UnaryOp::GeluTanh>();
}

TOY_AVX512 inline __m512 gelu_u2_512(__m512 x) {
  const __m512 c2 = _mm512_set1_ps(2.0f * 0.7978845608028654f), k = _mm512_set1_ps(0.044715f);
  return _mm512_mul_ps(c2, _mm512_fmadd_ps(_mm512_mul_ps(k, x), _mm512_mul_ps(x, x), x));
}

TOY_AVX512 inline __m512 sigmoid512(__m512 x) {
  __m512 s, c;
  sigmoid_pair512(x, &s, &c);
  return s;
}

template <UnaryOp kOp>
TOY_AVX512 inline __m512 unary16(__m512 x) {
  if constexpr (kOp == UnaryOp::Sigmoid) return sigmoid512(x);
  if constexpr (kOp == UnaryOp::Silu) return _mm512_mul_ps(x, sigmoid512(x));
  return _mm512_mul_ps(x, sigmoid512(gelu_u2_512(x)));  // GeluTanh
}

template <UnaryOp kOp>
TOY_AVX512 inline __m512 unary_grad16(__m512 x, __m512 g) {
  __m512 s, c;  // s and 1 - s
  if constexpr (kOp == UnaryOp::Sigmoid) {
    sigmoid_pair512(x, &s, &c);
    return _mm512_mul_ps(g, _mm512_mul_ps(s, c));
  }
  if constexpr (kOp == UnaryOp::Silu) {
    sigmoid_pair512(x, &s, &c);
    return _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(x, s), c, s));
  }
  sigmoid_pair512(gelu_u2_512(x), &s, &c);  // GeluTanh
  const __m512 du2 = _mm512_mul_ps(_mm512_set1_ps(2.0f * 0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_set1_ps(3.0f * 0.044715f), _mm512_mul_ps(x, x),
                                                   _mm512_set1_ps(1.0f)));
  const __m512 xs1s = _mm512_mul_ps(_mm512_mul_ps(x, s), c);
  return _mm512_mul_ps(g, _mm512_fmadd_ps(xs1s, du2, s));
}

TOY_AVX512 inline __m512 swiglu16(__m512 a, __m512 b) { return _mm512_mul_ps(_mm512_mul_ps(a, sigmoid512(a)), b); }

TOY_AVX512 inline void swiglu_grad16(__m512 a, __m512 b, __m512 g, __m512* da, __m512* db) {
  __m512 s, c;
  sigmoid_pair512(a, &s, &c);
  const __m512 dsilu = _mm512_fmadd_ps(_mm512_mul_ps(a, s), c, s);
  *da = _mm512_mul_ps(_mm512_mul_ps(g, b), dsilu);
  *db = _mm512_mul_ps(g, _mm512_mul_ps(a, s));
}

// Elements [b, e) 16 at a time; each returns where the 8-lane form takes over.
template <UnaryOp kOp>
TOY_AVX512 int64_t unary_span512(const float* x, float* y, int64_t b, int64_t e) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16) _mm512_storeu_ps(y + i, unary16<kOp>(_mm512_loadu_ps(x + i)));
  return i;
}

template <UnaryOp kOp>
TOY_AVX512 int64_t unary_grad_span512(const float* x, const float* g, float* dx, int64_t b, int64_t e) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16)
    _mm512_storeu_ps(dx + i, unary_grad16<kOp>(_mm512_loadu_ps(x + i), _mm512_loadu_ps(g + i)));
  return i;
}

// stream: o is 32-byte aligned and takes non-temporal stores (as store8_f32).
TOY_AVX512 int64_t swiglu_span512(const float* a, const float* u, float* o, int64_t b, int64_t e, bool stream = false) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 v = swiglu16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(u + i));
    if (stream) {
      _mm256_stream_ps(o + i, low256(v));
      _mm256_stream_ps(o + i + 8, high256(v));
    } else {
      _mm512_storeu_ps(o + i, v);
    }
  }
  return i;
}

TOY_AVX512 int64_t swiglu_grad_span512(const float* a, const float* u, const float* g, float* da, float* du, int64_t b,
                                       int64_t e) {
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    __m512 va, vu;
    swiglu_grad16(_mm512_loadu_ps(a + i), _mm512_loadu_ps(u + i), _mm512_loadu_ps(g + i), &va, &vu);
    _mm512_storeu_ps(da + i, va);
    _mm512_storeu_ps(du + i, vu);
  }
  return i;
}

// Whether the 16-lane forms take these f32 tensors (all contiguous).
template <class T>
bool wide_f32(std::initializer_list<const Tensor*> ts) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (!avx512_forms()) return false;
    for (const Tensor* t : ts)
      if (!t->is_contiguous()) return false;
    return true;
  }
}

}  // namespace

void unary(UnaryOp op, const Tensor& x, Tensor& y, const UnaryArgs& a) {
  dispatch_float(x.dtype(), "unary", [&]<class T>(std::type_identity<T>) {
    // The activations with the op fixed at compile time (the switch in unary8 is not hoisted
    // out of the loop: SiLU ran at about 0.6 of the speed), 16 lanes where the variant has them.
    if (is_activation(op))
      return with_activation(op, [&]<UnaryOp kOp>() {
        auto f = [&](const Lanes<1>& v) { return unary8(kOp, v[0], a); };
        if constexpr (std::is_same_v<T, float>) {
          if (wide_f32<T>({&x, &y})) {
            const float* px = x.data<float>();
            float* py = y.data<float>();
            parallel_for(0, y.numel(), kGrain, [&](int64_t b, int64_t e) {
              map_span<float, 1>({px}, py, unary_span512<kOp>(px, py, b, e), e, f);
            });
            return;
          }
        }
        map_elements<T, 1>({&x}, y, f);
      });
    map_elements<T, 1>({&x}, y, [&](const Lanes<1>& v) { return unary8(op, v[0], a); });
  });
}

void unary_backward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& g, Tensor& dx, const UnaryArgs& a) {
  dispatch_float(x.dtype(), "unary_backward", [&]<class T>(std::type_identity<T>) {
    if (is_activation(op))  // as in unary
      return with_activation(op, [&]<UnaryOp kOp>() {
        auto f = [&](const Lanes<3>& v) { return unary_grad8(kOp, v[0], v[1], v[2], a); };
        if constexpr (std::is_same_v<T, float>) {
          if (wide_f32<T>({&x, &y, &g, &dx})) {
            const float *px = x.data<float>(), *py = y.data<float>(), *pg = g.data<float>();
            float* pd = dx.data<float>();
            parallel_for(0, dx.numel(), kGrain, [&](int64_t b, int64_t e) {
              map_span<float, 3>({px, py, pg}, pd, unary_grad_span512<kOp>(px, pg, pd, b, e), e, f);
            });
            return;
          }
        }
        map_elements<T, 3>({&x, &y, &g}, dx, f);
      });
    map_elements<T, 3>({&x, &y, &g}, dx, [&](const Lanes<3>& v) { return unary_grad8(op, v[0], v[1], v[2], a); });
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_float(a.dtype(), "binary", [&]<class T>(std::type_identity<T>) {
    auto f = [op](const Lanes<2>& v) {
      switch (op) {
        case BinaryOp::Add: return _mm256_add_ps(v[0], v[1]);
        case BinaryOp::Sub: return _mm256_sub_ps(v[0], v[1]);
        case BinaryOp::Mul: return _mm256_mul_ps(v[0], v[1]);
        case BinaryOp::Div: return _mm256_div_ps(v[0], v[1]);
      }
      return v[0];
    };
    // Fast path for F32 with a broadcast row operand (bias adds, per-channel scales):
    // rows of `out` combine a contiguous row of a with a contiguous row of b.
    if constexpr (std::is_same_v<T, float>) {
      const int nd = out.ndim();
      if (nd >= 1 && a.is_contiguous() && b.stride(-1) == 1 && out.size(-1) >= 8) {
        bool row_bcast = true;
        for (int d = 0; d < nd - 1; ++d) row_bcast = row_bcast && b.stride(d) == 0;
        if (row_bcast) {
          const int64_t D = out.size(-1), rows = out.numel() / D;
          const float* pa = a.data<float>();
          const float* pb = b.data<float>();
          float* po = out.data<float>();
          parallel_for(0, rows, std::max<int64_t>(1, kGrain / D), [&](int64_t rb, int64_t re) {
            for (int64_t r = rb; r < re; ++r) {
              int64_t j = 0;
              for (; j + 8 <= D; j += 8)
                _mm256_storeu_ps(po + r * D + j, f({_mm256_loadu_ps(pa + r * D + j), _mm256_loadu_ps(pb + j)}));
              for (; j < D; ++j) {
                float x = pa[r * D + j], y = pb[j];
                po[r * D + j] = op == BinaryOp::Add ? x + y : op == BinaryOp::Sub ? x - y
                                : op == BinaryOp::Mul ? x * y : x / y;
              }
            }
          });
          return;
        }
      }
    }
    map_elements<T, 2>({&a, &b}, out, f);
  });
}

namespace {
// silu(a) * b and its two partial derivatives, 8 lanes.
inline __m256 swiglu8(__m256 a, __m256 b) { return _mm256_mul_ps(_mm256_mul_ps(a, sigmoid256(a)), b); }
inline void swiglu_grad8(__m256 a, __m256 b, __m256 g, __m256* da, __m256* db) {
  __m256 s, c;
  sigmoid_pair256(a, &s, &c);
  const __m256 dsilu = _mm256_fmadd_ps(_mm256_mul_ps(a, s), c, s);
  *da = _mm256_mul_ps(_mm256_mul_ps(g, b), dsilu);
  *db = _mm256_mul_ps(g, _mm256_mul_ps(a, s));
}
// Loads n <= 8 elements (zero padded) so row tails go through the same vector math.
template <class T>
inline __m256 load_tail(const T* p, int64_t n) {
  alignas(32) float t[8] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = to_f32(p[i]);
  return _mm256_load_ps(t);
}
template <class T>
inline void store_tail(T* p, __m256 v, int64_t n) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int64_t i = 0; i < n; ++i) p[i] = from_f32<T>(t[i]);
}
}  // namespace

void swiglu(const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_float(a.dtype(), "swiglu", [&]<class T>(std::type_identity<T>) {
    auto f = [](const Lanes<2>& v) { return _mm256_mul_ps(_mm256_mul_ps(v[0], sigmoid256(v[0])), v[1]); };
    if constexpr (std::is_same_v<T, float>) {
      if (wide_f32<T>({&a, &b, &out})) {
        const float *pa = a.data<float>(), *pb = b.data<float>();
        float* po = out.data<float>();
        parallel_for(0, out.numel(), kGrain, [&](int64_t s, int64_t e) {
          map_span<float, 2>({pa, pb}, po, swiglu_span512(pa, pb, po, s, e), e, f);
        });
        return;
      }
    }
    map_elements<T, 2>({&a, &b}, out, f);
  });
}

void swiglu_backward(const Tensor& a, const Tensor& b, const Tensor& g, Tensor& da, Tensor& db) {
  dispatch_float(a.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    auto fa = [&](const Lanes<3>& v) {
      __m256 da8, db8;
      swiglu_grad8(v[0], v[1], v[2], &da8, &db8);
      return da8;
    };
    // db = g * silu(a): swiglu_grad8's db in the operations' order (g * (a * s)).
    auto fb = [](const Lanes<2>& v) { return _mm256_mul_ps(v[1], _mm256_mul_ps(v[0], sigmoid256(v[0]))); };
    if constexpr (std::is_same_v<T, float>) {
      if (wide_f32<T>({&a, &b, &g, &da, &db})) {
        const float *pa = a.data<float>(), *pb = b.data<float>(), *pg = g.data<float>();
        float *pda = da.data<float>(), *pdb = db.data<float>();
        parallel_for(0, da.numel(), kGrain, [&](int64_t s, int64_t e) {
          const int64_t i = swiglu_grad_span512(pa, pb, pg, pda, pdb, s, e);
          map_span<float, 3>({pa, pb, pg}, pda, i, e, fa);
          map_span<float, 2>({pa, pg}, pdb, i, e, fb);
        });
        return;
      }
    }
    map_elements<T, 3>({&a, &b, &g}, da, fa);
    map_elements<T, 2>({&a, &g}, db, fb);
  });
}

void swiglu_packed(const Tensor& x, Tensor& out) {
  const int64_t F = out.size(-1), rows = out.numel() / std::max<int64_t>(F, 1);
  dispatch_float(x.dtype(), "swiglu", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const bool wide = wide_f32<T>({});  // (x and out are contiguous here)
    // A large output streams past the caches (no read for ownership; rows whole vectors).
    bool stream = false;
    if constexpr (std::is_same_v<T, float>) stream = stream_rows(po, F, out.nbytes());
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* a = px + r * 2 * F;
        const T* g = a + F;
        T* o = po + r * F;
        int64_t j = 0;
        if constexpr (std::is_same_v<T, float>)
          if (wide) j = swiglu_span512(a, g, o, 0, F, stream);
        for (; j + 8 <= F; j += 8) {
          if constexpr (std::is_same_v<T, float>)
            store8_f32(o + j, swiglu8(load8(a + j), load8(g + j)), stream);
          else
            store8(o + j, swiglu8(load8(a + j), load8(g + j)));
        }
        if (j < F) store_tail(o + j, swiglu8(load_tail(a + j, F - j), load_tail(g + j, F - j)), F - j);
      }
      if (stream) _mm_sfence();
    });
  });
}

void swiglu_packed_backward(const Tensor& x, const Tensor& grad, Tensor& dx) {
  const int64_t F = grad.size(-1), rows = grad.numel() / std::max<int64_t>(F, 1);
  dispatch_float(x.dtype(), "swiglu_backward", [&]<class T>(std::type_identity<T>) {
    const T* px = x.data<T>();
    const T* pg = grad.data<T>();
    T* pd = dx.data<T>();
    const bool wide = wide_f32<T>({});  // (x, grad and dx are contiguous here)
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* a = px + r * 2 * F;
        const T* u = a + F;
        const T* g = pg + r * F;
        T* da = pd + r * 2 * F;
        T* du = da + F;
        __m256 va, vu;
        int64_t j = 0;
        if constexpr (std::is_same_v<T, float>)
          if (wide) j = swiglu_grad_span512(a, u, g, da, du, 0, F);
        for (; j + 8 <= F; j += 8) {
          swiglu_grad8(load8(a + j), load8(u + j), load8(g + j), &va, &vu);
          store8(da + j, va);
          store8(du + j, vu);
        }
        if (j < F) {
          const int64_t n = F - j;
          swiglu_grad8(load_tail(a + j, n), load_tail(u + j, n), load_tail(g + j, n), &va, &vu);
          store_tail(da + j, va, n);
          store_tail(du + j, vu, n);
        }
      }
    });
  });
}

void dropout(const Tensor& x, Tensor& y, const kern::DropoutArgs& a) {
  dispatch_float(x.dtype(), "dropout", [&]<class T>(std::type_identity<T>) {
    // x is contiguous here (the op makes it so): element i uses word i % 4 of block i / 4.
    const T* xd = x.data<T>();
    T* yd = y.data<T>();
    const float keep_scale = 1.0f / (1.0f - a.p);
    const uint32_t threshold = uint32_t(std::min(4294967295.0, double(a.p) * 4294967296.0));
    const uint64_t counter = a.counter + (a.step ? uint64_t(uint32_t(a.step->data<int32_t>()[0])) << 32 : 0);
    parallel_for(0, (x.numel() + 3) / 4, kGrain / 4, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        auto u = philox4x32(a.seed, a.stream, counter + uint64_t(blk));
        for (int j = 0; j < 4; ++j) {
          int64_t i = blk * 4 + j;
          if (i >= x.numel()) break;
          yd[i] = u[j] >= threshold ? from_f32<T>(to_f32(xd[i]) * keep_scale) : from_f32<T>(0.0f);
        }
      }
    });
  });
}

// ---- copy / cast / fill ---------------------------------------------------------------------

namespace {
template <class S, class D>
inline D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else if constexpr (std::is_same_v<D, int32_t>) {
    return int32_t(to_f32(v));
  } else if constexpr (std::is_same_v<S, int32_t>) {
    return from_f32<D>(float(v));
  } else {
    return from_f32<D>(to_f32(v));
  }
}

template <class F>
void dispatch_plain(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(std::type_identity<float>{}); break;
    case DType::F16: f(std::type_identity<f16>{}); break;
    case DType::BF16: f(std::type_identity<bf16>{}); break;
    case DType::I32: f(std::type_identity<int32_t>{}); break;
    default: fail("[copy] unexpected dtype {}", name(t));
  }
}
}  // namespace

namespace {
// f32 -> bf16 as f32_to_bf16 rounds (nearest even on the bits, NaNs quieted), 16 at a time:
// mixed precision casts every weight, activation and gradient it multiplies (the loop the
// compiler makes of the scalar form keeps the NaN test per element).
void f32_to_bf16_span(const float* s, bf16* d, int64_t n) {
  int64_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x400000);
  auto round8 = [&](const float* p) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(p));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, _mm256_or_si256(u, quiet), nan), 16);
  };
  for (; i + 16 <= n; i += 16) {
    const __m256i packed = _mm256_packus_epi32(round8(s + i), round8(s + i + 8));  // lanes 0-3, 8-11, 4-7, 12-15
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
  for (; i < n; ++i) d[i] = bf16{f32_to_bf16(s[i])};
}
}  // namespace

void copy(const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (is_block(src.dtype()) || is_block(dst.dtype())) {
    // Block data: rows of the last dim, via f32.
    TOY_CHECK(src.is_contiguous() && dst.is_contiguous(), "[copy] block-typed tensors must be contiguous");
    const int64_t D = dst.size(-1), rows = n / D;
    parallel_for(0, rows, std::max<int64_t>(1, kGrain / D), [&](int64_t rb, int64_t re) {
      std::vector<float> row(size_t(D), 0.0f);
      for (int64_t r = rb; r < re; ++r) {
        if (is_block(src.dtype())) {
          dequantize_row(src.dtype(), static_cast<const char*>(src.raw_data()) + row_bytes(src.dtype(), r * D),
                         row.data(), D);
        } else {
          dispatch_plain(src.dtype(), [&]<class S>(std::type_identity<S>) {
            const S* in = static_cast<const S*>(src.raw_data()) + r * D;
            for (int64_t j = 0; j < D; ++j) row[size_t(j)] = convert<S, float>(in[j]);
          });
        }
        if (is_block(dst.dtype())) {
          quantize_row(dst.dtype(), row.data(), static_cast<char*>(dst.raw_data()) + row_bytes(dst.dtype(), r * D), D);
        } else {
          dispatch_plain(dst.dtype(), [&]<class D_>(std::type_identity<D_>) {
            D_* o = static_cast<D_*>(dst.raw_data()) + r * D;
            for (int64_t j = 0; j < D; ++j) o[j] = convert<float, D_>(row[size_t(j)]);
          });
        }
      }
    });
    return;
  }
  dispatch_plain(src.dtype(), [&]<class S>(std::type_identity<S>) {
    dispatch_plain(dst.dtype(), [&]<class D_>(std::type_identity<D_>) {
      const S* s = static_cast<const S*>(src.raw_data());
      D_* d = static_cast<D_*>(dst.raw_data());
      if (src.is_contiguous() && dst.is_contiguous()) {
        if constexpr (std::is_same_v<S, D_>) {
          parallel_for(0, n, 1 << 18, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, size_t(e - b) * sizeof(S)); });
        } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D_, bf16>) {
          parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { f32_to_bf16_span(s + b, d + b, e - b); });
        } else {
          parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) d[i] = convert<S, D_>(s[i]);
          });
        }
        return;
      }
      Shape shape = dst.shape();
      std::array<Strides, 2> st{src.strides(), dst.strides()};
      coalesce<2>(shape, st);
      if (shape.ndim() == 0) {
        d[0] = convert<S, D_>(s[0]);
        return;
      }
      const int64_t inner = shape.back(), rows = n / inner;
      const int64_t is = st[0].back(), id = st[1].back();
      parallel_for(0, rows, std::max<int64_t>(1, kGrain / inner), [&](int64_t rb, int64_t re) {
        for (int64_t r = rb; r < re; ++r) {
          auto off = row_offsets<2>(shape, st, r);
          const S* sp = s + off[0];
          D_* dp = d + off[1];
          if (is == 1 && id == 1) {
            for (int64_t j = 0; j < inner; ++j) dp[j] = convert<S, D_>(sp[j]);
          } else {
            for (int64_t j = 0; j < inner; ++j) dp[j * id] = convert<S, D_>(sp[j * is]);
          }
        }
      });
    });
  });
}

void fill(Tensor& dst, double value) {
  dispatch_plain(dst.dtype(), [&]<class D_>(std::type_identity<D_>) {
    D_ v;
    if constexpr (std::is_same_v<D_, int32_t>)
      v = int32_t(value);
    else
      v = from_f32<D_>(float(value));
    D_* d = static_cast<D_*>(dst.raw_data());
    if (dst.is_contiguous()) {
      parallel_for(0, dst.numel(), 1 << 16, [&](int64_t b, int64_t e) { std::fill(d + b, d + e, v); });
      return;
    }
    Shape shape = dst.shape();
    std::array<Strides, 1> st{dst.strides()};
    coalesce<1>(shape, st);
    for_each_strided_run<1>(shape, {&st[0]}, [&](auto off, int64_t m, auto inner) {
      for (int64_t j = 0; j < m; ++j) d[off[0] + j * inner[0]] = v;
    });
  });
}

}  // namespace toy::cpu
