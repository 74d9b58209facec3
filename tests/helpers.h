// Test helpers: seeded random tensors, closeness checks that print the worst element.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "toy/autograd/backward.h"
#include "toy/autograd/gradcheck.h"
#include "toy/core/rng.h"
#include "toy/core/thread_pool.h"
#include "toy/ops/ops.h"

namespace toy::test {

// The message of the toy::Error f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline Tensor randn_t(const Shape& s, uint64_t seed, float scale = 1.0f, DType dt = DType::F32) {
  Generator g(seed);
  Tensor t = randn(s, g, 0.0f, scale);
  return dt == DType::F32 ? t : cast(t, dt);
}

inline Tensor rand_t(const Shape& s, uint64_t seed, float lo, float hi) {
  Generator g(seed);
  return rand(s, g, lo, hi);
}

inline Tensor param(Tensor t) {
  t.requires_grad_();
  return t;
}

// max |a - b| <= atol + rtol * |b| elementwise; reports the worst element.
inline ::testing::AssertionResult close(const std::vector<float>& a, const std::vector<double>& b, double atol,
                                        double rtol) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
  double worst = 0;
  size_t wi = 0;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    const bool nan_match = std::isnan(a[i]) && std::isnan(b[i]);
    const bool inf_match = std::isinf(a[i]) && std::isinf(b[i]) && (a[i] > 0) == (b[i] > 0);
    if (nan_match || inf_match) continue;
    if (!(d <= atol + rtol * std::fabs(b[i]))) {
      ok = false;
      if (d > worst || std::isnan(d)) worst = d, wi = i;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << wi << ": got " << a[wi] << " expected " << b[wi]
                                       << " (|diff| " << worst << ")";
}

inline ::testing::AssertionResult close(const Tensor& a, const std::vector<double>& b, double atol = 1e-5,
                                        double rtol = 1e-5) {
  return close(a.to_f32_vector(), b, atol, rtol);
}

inline ::testing::AssertionResult close(const Tensor& a, const Tensor& b, double atol = 1e-5, double rtol = 1e-5) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shape " << a.shape().str() << " vs " << b.shape().str();
  std::vector<float> bv = b.to_f32_vector();
  return close(a.to_f32_vector(), std::vector<double>(bv.begin(), bv.end()), atol, rtol);
}

inline std::vector<double> to_double(const Tensor& t) {
  std::vector<float> v = t.to_f32_vector();
  return {v.begin(), v.end()};
}

// gradcheck with a readable failure.
inline ::testing::AssertionResult grad_ok(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                          const std::vector<Tensor>& inputs, GradcheckOptions o = {}) {
  GradcheckResult r = gradcheck(f, inputs, o);
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gradcheck failed (max abs err " << r.max_abs_error << ")\n" << r.report;
}

// A strided (non-contiguous) copy of t: the transpose of a transposed contiguous copy.
inline Tensor noncontig(const Tensor& t) {
  NoGradGuard ng;
  if (t.ndim() < 2) {
    Tensor big = repeat(unsqueeze(t, -1), {1, 2});  // [n, 2]: every value twice
    return squeeze(slice(big, 1, 0, 1), 1);          // [n] with stride 2
  }
  Tensor tt = contiguous(transpose(t, -1, -2));
  return transpose(tt, -1, -2);
}

}  // namespace toy::test
