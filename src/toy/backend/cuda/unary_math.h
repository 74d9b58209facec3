// The per-element math of the unary, swiglu, dropout and random-fill CUDA kernels (unary.cu),
// as TOY_HD functions: nvcc compiles them into the kernels, the C++ compiler into a host test
// (tests/gpu/host_unary_math.cpp) that checks them against the CPU kernels on any machine.
//
// The unary functions follow the CPU's formulas (backend/cpu/elementwise.cpp, simd.h) step by
// step, so NaN, ±inf and signed zeros come out as they do there: relu and clamp keep NaN (the
// operand order of max_ps/min_ps; relu(-0) = -0), neg is 0 - x (+0 for ±0), the masked
// gradients (relu, clamp) give +0 where the mask is off even for a NaN or infinite g, silu and
// gelu give NaN at -inf (-inf * 0) and their gradients NaN at ±inf (inf * 0), and e^x below
// -87.34 inside sigmoid and the GELUs is 0 as the CPU's exp_nonpos flushes it. The CPU's vector
// exp/log become the accurate expf/logf/tanhf/log1pf (the reciprocal in sigmoid is an exact
// division on both), so finite results differ from the CPU's by a few ulp. The exact GELU keeps
// the CPU's erfc fit (Numerical Recipes' erfcc) and its flush.
//
// The random numbers: Philox4x32-10 (core/rng.cpp) and the uniform and dropout transforms give
// the CPU's bits; Box-Muller (backend/cpu/random.cpp) takes its log and cos in double precision
// rounded once, within an ulp or two of the CPU's C-library logf/cosf (log_for_draw). No f32 product feeding a sum may be contracted into an FMA (the CPU file is
// built without FMA): on the device those steps use __fmul_rn/__fadd_rn.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "toy/backend/cuda/hd.h"

namespace toy::cuda::umath {

// kern::UnaryOp's order (glue_unary.cpp asserts it).
enum class Op : int {
  Neg, Exp, Log, Sqrt, Rsqrt, Square, Abs, Tanh, Sigmoid, Relu, Silu, GeluTanh, GeluErf, Scale, Clamp, Softplus,
};
inline constexpr int kNumOps = 16;

struct Params {
  float alpha = 1.0f;  // Scale
  float lo = 0.0f, hi = 0.0f;  // Clamp
};

// ---- primitives: the device's float functions under nvcc, std:: on the host -----------------

TOY_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
TOY_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

#if defined(__CUDA_ARCH__)
TOY_HD float f_exp(float x) { return expf(x); }
TOY_HD float f_log(float x) { return logf(x); }
TOY_HD float f_sqrt(float x) { return sqrtf(x); }
TOY_HD float f_tanh(float x) { return tanhf(x); }
TOY_HD float f_log1p(float x) { return log1pf(x); }
TOY_HD float f_fma(float a, float b, float c) { return fmaf(a, b, c); }
TOY_HD double d_fma(double a, double b, double c) { return fma(a, b, c); }
// Rounded products and sums that nvcc may not contract into an FMA.
TOY_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
TOY_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
TOY_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
#else
TOY_HD float f_exp(float x) { return std::exp(x); }
TOY_HD float f_log(float x) { return std::log(x); }
TOY_HD float f_sqrt(float x) { return std::sqrt(x); }
TOY_HD float f_tanh(float x) { return std::tanh(x); }
TOY_HD float f_log1p(float x) { return std::log1p(x); }
TOY_HD float f_fma(float a, float b, float c) { return std::fma(a, b, c); }
TOY_HD double d_fma(double a, double b, double c) { return std::fma(a, b, c); }
// (The host build is baseline x86-64, no FMA to contract into.)
TOY_HD float mul_rn(float a, float b) { return a * b; }
TOY_HD float add_rn(float a, float b) { return a + b; }
TOY_HD float sub_rn(float a, float b) { return a - b; }
#endif

// max_ps(a, x) and min_ps(a, x) as the CPU has them: the second operand when unordered.
TOY_HD float max_ps(float a, float x) { return a > x ? a : x; }
TOY_HD float min_ps(float a, float x) { return a < x ? a : x; }
TOY_HD bool sign_set(float x) { return (bits_of(x) >> 31) != 0; }

// e^x for x <= 0 as the CPU's exp_nonpos: exactly 0 below -87.3365 (and at -inf); NaN stays.
TOY_HD float exp_nonpos(float x) { return x < -87.3365402f ? 0.0f : f_exp(x); }

// sigmoid(x) and 1 - sigmoid(x), each without cancellation (simd.h's sigmoid_pair256):
// t = e^-|x|, r = 1/(1+t); (r, t r) for x >= 0, (t r, r) when x's sign bit is set.
struct SigmoidPair {
  float s, c;
};
TOY_HD SigmoidPair sigmoid_pair(float x) {
  const float t = exp_nonpos(float_of(bits_of(x) | 0x80000000u));  // e^-|x| (NaN stays NaN)
  const float r = 1.0f / (1.0f + t);
  const float tr = t * r;
  return sign_set(x) ? SigmoidPair{tr, r} : SigmoidPair{r, tr};
}
TOY_HD float sigmoid(float x) { return sigmoid_pair(x).s; }

// GELU (tanh form) as x sigmoid(2u): 2u = 2c (x + k x^3), evaluated as the CPU does.
TOY_HD float gelu_u2(float x) { return (2.0f * 0.7978845608028654f) * f_fma(0.044715f * x, x * x, x); }

// The standard normal CDF from the erfc fit the CPU uses (Numerical Recipes' erfcc, relative
// error below 1.2e-7), with the same flush to 0 where its exponent passes -87.34.
TOY_HD float normal_cdf(float x) {
  const float v = x * 0.70710678118654752f;
  const float a = float_of(bits_of(v) & 0x7fffffffu);
  const float t = 1.0f / f_fma(0.5f, a, 1.0f);
  float p = 0.17087277f;
  p = f_fma(p, t, -0.82215223f);
  p = f_fma(p, t, 1.48851587f);
  p = f_fma(p, t, -1.13520398f);
  p = f_fma(p, t, 0.27886807f);
  p = f_fma(p, t, -0.18628806f);
  p = f_fma(p, t, 0.09678418f);
  p = f_fma(p, t, 0.37409196f);
  p = f_fma(p, t, 1.00002368f);
  p = f_fma(p, t, -1.26551223f);
  const float erfc_a = t * exp_nonpos(min_ps(0.0f, f_fma(-a, a, p)));
  const float h = 0.5f * erfc_a;
  return v < 0.0f ? h : sub_rn(1.0f, h);
}

// ---- the unary ops ----------------------------------------------------------------------------

TOY_HD float unary_forward(Op op, float x, const Params& a) {
  switch (op) {
    case Op::Neg: return sub_rn(0.0f, x);  // 0 - x: -0 and +0 both give +0, as on the CPU
    case Op::Exp: return f_exp(x);
    case Op::Log: return f_log(x);
    case Op::Sqrt: return f_sqrt(x);
    case Op::Rsqrt: return 1.0f / f_sqrt(x);
    case Op::Square: return x * x;
    case Op::Abs: return float_of(bits_of(x) & 0x7fffffffu);
    case Op::Tanh: return f_tanh(x);
    case Op::Sigmoid: return sigmoid(x);
    case Op::Relu: return max_ps(0.0f, x);  // keeps NaN; relu(-0) = -0
    case Op::Silu: return x * sigmoid(x);
    case Op::GeluTanh: return x * sigmoid(gelu_u2(x));
    case Op::GeluErf: return x * normal_cdf(x);
    case Op::Scale: return x * a.alpha;
    case Op::Clamp: return min_ps(a.hi, max_ps(a.lo, x));  // keeps NaN
    case Op::Softplus: return x > 20.0f ? x : f_log1p(f_exp(x));  // x itself above 20
  }
  return x;
}

// dx = g op'(x); y = op(x) where the CPU uses it (exp, sqrt, rsqrt, tanh).
TOY_HD float unary_backward(Op op, float x, float y, float g, const Params& a) {
  switch (op) {
    case Op::Neg: return sub_rn(0.0f, g);
    case Op::Exp: return g * y;
    case Op::Log: return g / x;
    case Op::Sqrt: return (g * 0.5f) / y;
    case Op::Rsqrt: return (g * -0.5f) * ((y * y) * y);  // d/dx x^-1/2 = -1/2 y^3
    case Op::Square: return g * (x + x);
    case Op::Abs: return g * ((x > 0.0f ? 1.0f : 0.0f) - (x < 0.0f ? 1.0f : 0.0f));
    case Op::Tanh: return g * f_fma(-y, y, 1.0f);
    case Op::Sigmoid: {
      const SigmoidPair p = sigmoid_pair(x);
      return g * (p.s * p.c);
    }
    case Op::Relu: return x > 0.0f ? g : 0.0f;  // a mask: 0 even where g is NaN
    case Op::Silu: {
      const SigmoidPair p = sigmoid_pair(x);
      return g * f_fma(x * p.s, p.c, p.s);  // s + x s (1 - s)
    }
    case Op::GeluTanh: {
      // d/dx [x s(2u)] = s + x s (1 - s) 2u', 2u' = 2c (1 + 3k x^2)
      const SigmoidPair p = sigmoid_pair(gelu_u2(x));
      const float du2 = (2.0f * 0.7978845608028654f) * f_fma(3.0f * 0.044715f, x * x, 1.0f);
      return g * f_fma((x * p.s) * p.c, du2, p.s);
    }
    case Op::GeluErf: {
      const float pdf = 0.3989422804014327f * exp_nonpos(-0.5f * (x * x));
      return g * f_fma(x, pdf, normal_cdf(x));  // Phi(x) + x phi(x)
    }
    case Op::Scale: return g * a.alpha;
    case Op::Clamp: return (x >= a.lo && x <= a.hi) ? g : 0.0f;
    case Op::Softplus: return g * (x > 20.0f ? 1.0f : sigmoid(x));
  }
  return g;
}

// ---- swiglu: silu(a) * b ------------------------------------------------------------------------

TOY_HD float swiglu_forward(float a, float b) { return (a * sigmoid(a)) * b; }

struct SwigluGrads {
  float da, db;
};
TOY_HD SwigluGrads swiglu_backward(float a, float b, float g) {
  const SigmoidPair p = sigmoid_pair(a);
  const float dsilu = f_fma(a * p.s, p.c, p.s);
  return {(g * b) * dsilu, g * (a * p.s)};
}

// ---- Philox4x32-10 (core/rng.cpp) ----------------------------------------------------------------

struct Philox4 {
  uint32_t w[4];
};

TOY_HD Philox4 philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32);
  uint32_t c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = uint32_t(p1);
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = uint32_t(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

// ---- log and cos for Box-Muller ---------------------------------------------------------------------

// log and cos of a float in double precision, rounded once: the correctly rounded float almost
// always. The CPU's Box-Muller calls the C library's float logf/cosf, which glibc does not
// round correctly for about 1% of arguments, so a normal draw here can differ from the CPU's by
// an ulp or two (uniform draws and dropout masks are exact).
TOY_HD float log_for_draw(float x) {
#if defined(__CUDA_ARCH__)
  return float(log(double(x)));
#else
  return float(std::log(double(x)));
#endif
}
TOY_HD float cos_for_draw(float x) {
#if defined(__CUDA_ARCH__)
  return float(cos(double(x)));
#else
  return float(std::cos(double(x)));
#endif
}

// ---- random transforms (backend/cpu/random.cpp, core/rng.h) ---------------------------------------

// Uniform in [0, 1) from 24 random bits (exact).
TOY_HD float uniform01(uint32_t u) { return float(u >> 8) * (1.0f / 16777216.0f); }

// lo + (hi - lo) u, rounded step by step.
TOY_HD float uniform_draw(uint32_t u, float lo, float hi) { return add_rn(lo, mul_rn(sub_rn(hi, lo), uniform01(u))); }

// Box-Muller from two words: mean + std sqrt(-2 log u1) cos(2 pi u2), u1 in (0, 1].
TOY_HD float normal_draw(uint32_t w1, uint32_t w2, float mean, float std) {
  const float u1 = (float(w1 >> 8) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = uniform01(w2);
  const float radius = f_sqrt(-2.0f * log_for_draw(u1));
  const float angle = cos_for_draw(mul_rn(6.2831853071795864f, u2));
  return add_rn(mean, mul_rn(mul_rn(std, radius), angle));
}

// Element i of a random fill: Philox block counter + i / per (per 2 normal, 4 uniform).
TOY_HD float random_element(const Philox4& u, int64_t i, bool normal, float a, float b) {
  if (normal) {
    const int w = int(i % 2) * 2;
    return normal_draw(u.w[w], u.w[w + 1], a, b);
  }
  return uniform_draw(u.w[i % 4], a, b);
}

// Dropout keeps an element when its word >= p 2^32 (saturated), and scales it by 1 / (1 - p).
TOY_HD uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return uint32_t(t < 4294967295.0 ? t : 4294967295.0);
}
TOY_HD float dropout_scale(float p) { return 1.0f / (1.0f - p); }
TOY_HD float dropout_element(float x, uint32_t word, uint32_t threshold, float scale) {
  return word >= threshold ? mul_rn(x, scale) : 0.0f;
}
// The first counter: counter, plus step * 2^32 when a step is given.
TOY_HD uint64_t dropout_counter(uint64_t counter, bool has_step, int32_t step) {
  return counter + (has_step ? uint64_t(uint32_t(step)) << 32 : 0);
}

}  // namespace toy::cuda::umath
