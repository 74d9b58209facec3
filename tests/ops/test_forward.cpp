// Forward results of every op against plain loops in double (the slow twins), across
// dtypes, broadcasting, strided views and odd sizes that exercise vector tails.
#include <gtest/gtest.h>

#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/backend/cpu/kquant_products.h"
#include "toy/backend/cpu/variant.h"

#include <cstring>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "helpers.h"

#include <fmt/core.h>

using namespace toy;
using namespace toy::test;

namespace {
// A weight of block type dt: quantized from normal values, or, for the types toy reads but
// does not write (Q2_K, Q3_K), blocks of seeded random bytes with finite scales (every byte
// pattern is a valid block but for the f16 scales at the end).
Tensor stored_weight(DType dt, int64_t out, int64_t K, uint64_t seed, float scale) {
  if (dt != DType::Q3_K && dt != DType::Q2_K) return cast(randn_t(Shape{out, K}, seed, scale), dt);
  Tensor w = empty(Shape{out, K}, dt);
  auto* p = static_cast<uint8_t*>(w.raw_data());
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < w.nbytes(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = uint8_t(state >> 56);
  }
  const f16 d = from_f32<f16>(scale * 0.02f), dmin = from_f32<f16>(scale * 0.01f);
  const size_t block = dt == DType::Q3_K ? 110 : 84;  // Q3_K: d last; Q2_K: d, dmin last
  for (size_t b = 0; b < w.nbytes(); b += block) {
    std::memcpy(p + b + block - (dt == DType::Q3_K ? 2 : 4), &d.bits, 2);
    if (dt == DType::Q2_K) std::memcpy(p + b + 82, &dmin.bits, 2);
  }
  return w;
}
}  // namespace

namespace {
std::vector<double> map(const Tensor& x, double (*f)(double)) {
  std::vector<double> r = to_double(x);
  for (auto& v : r) v = f(v);
  return r;
}
double gelu_tanh_ref(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
}  // namespace

TEST(Forward, UnaryOpsMatchLibm) {
  // 1003 elements: vector body plus a tail; wide range including extremes.
  Tensor x = rand_t(Shape{1003}, 1, -12.0f, 12.0f);
  Tensor pos = rand_t(Shape{1003}, 2, 1e-3f, 50.0f);
  const double tol = 2e-6;
  EXPECT_TRUE(close(exp(x), map(x, [](double v) { return std::exp(v); }), 0, tol));
  EXPECT_TRUE(close(log(pos), map(pos, [](double v) { return std::log(v); }), 1e-6, tol));
  EXPECT_TRUE(close(sqrt(pos), map(pos, [](double v) { return std::sqrt(v); }), 0, tol));
  EXPECT_TRUE(close(rsqrt(pos), map(pos, [](double v) { return 1 / std::sqrt(v); }), 0, tol));
  EXPECT_TRUE(close(tanh(x), map(x, [](double v) { return std::tanh(v); }), 1e-7, tol));
  EXPECT_TRUE(close(sigmoid(x), map(x, sigmoid_ref), 1e-7, tol));
  EXPECT_TRUE(close(silu(x), map(x, [](double v) { return v * sigmoid_ref(v); }), 1e-6, tol));
  EXPECT_TRUE(close(gelu(x), map(x, gelu_tanh_ref), 1e-6, tol));
  EXPECT_TRUE(close(gelu(x, GeluApprox::None), map(x, gelu_erf_ref), 1e-6, tol));
  EXPECT_TRUE(close(relu(x), map(x, [](double v) { return std::max(v, 0.0); }), 0, 0));
  EXPECT_TRUE(close(abs(x), map(x, [](double v) { return std::fabs(v); }), 0, 0));
  EXPECT_TRUE(close(square(x), map(x, [](double v) { return v * v; }), 0, tol));
  EXPECT_TRUE(close(neg(x), map(x, [](double v) { return -v; }), 0, 0));
  EXPECT_TRUE(close(clamp(x, -1, 2), map(x, [](double v) { return std::clamp(v, -1.0, 2.0); }), 0, 0));
  EXPECT_TRUE(close(scale(x, 0.25f), map(x, [](double v) { return v * 0.25; }), 0, 0));
}

TEST(Forward, ExpAndLogHandleSpecialValues) {
  Tensor x = from_vector(std::vector<float>{-INFINITY, INFINITY, NAN, -200, 100, 0, -87.5f, -100}, Shape{8});
  std::vector<float> e = exp(x).to_f32_vector();
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_TRUE(std::isinf(e[1]));
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_TRUE(std::isinf(e[4]));
  EXPECT_EQ(e[5], 1.0f);
  EXPECT_NEAR(e[6] / std::exp(-87.5f), 1.0f, 1e-5);
  EXPECT_NEAR(e[7] / std::exp(-100.0f), 1.0f, 1e-3);  // subnormal result
  Tensor y = from_vector(std::vector<float>{0, -1, INFINITY, 1e-40f, 1, 2, 3, 4}, Shape{8});
  std::vector<float> l = log(y).to_f32_vector();
  EXPECT_TRUE(std::isinf(l[0]) && l[0] < 0);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_TRUE(std::isinf(l[2]) && l[2] > 0);
  EXPECT_NEAR(l[3], std::log(1e-40), 1e-4);
  EXPECT_EQ(l[4], 0.0f);
}

TEST(Forward, ExpIsWithinOneUlpAcrossTheFloatRange) {
  // 2^20 floats spread over every exponent (negative and positive), against libm in double.
  std::vector<float> xs;
  for (uint32_t i = 0; i < (1u << 20); ++i) {
    const uint32_t bits = i * 4096u + (i % 4093u);
    float v;
    std::memcpy(&v, &bits, 4);
    if (std::isfinite(v) && v > -104.0f && v < 88.72f) xs.push_back(v);
  }
  xs.push_back(88.5f);  // regression: exp saturated to inf from 88.38 on
  xs.push_back(88.7228f);
  std::vector<float> e = exp(from_vector(xs, Shape{int64_t(xs.size())})).to_f32_vector();
  int64_t worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float want = float(std::exp(double(xs[i])));
    int32_t a, b;
    std::memcpy(&a, &e[i], 4);
    std::memcpy(&b, &want, 4);
    if (std::llabs(int64_t(a) - int64_t(b)) > worst) worst = std::llabs(int64_t(a) - int64_t(b)), worst_x = xs[i];
  }
  EXPECT_LE(worst, 1) << "at x = " << worst_x;
  // A NaN keeps being a NaN whatever its payload (the scaled paths must not turn it finite).
  const uint32_t payload_nan = 0x7FC001FFu;
  float pn;
  std::memcpy(&pn, &payload_nan, 4);
  Tensor n = from_vector(std::vector<float>(9, pn), Shape{9});
  for (float v : exp(n).to_f32_vector()) EXPECT_TRUE(std::isnan(v));
  for (float v : sigmoid(n).to_f32_vector()) EXPECT_TRUE(std::isnan(v));
}

TEST(Forward, UnaryOnHalfTypesAndStridedViews) {
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor x = randn_t(Shape{5, 13}, 3, 1.0f, dt);
    std::vector<double> ref = map(x, [](double v) { return std::tanh(v); });
    Tensor y = tanh(x);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(close(y, ref, 1e-2, 1e-2));
  }
  Tensor x = randn_t(Shape{6, 9}, 4);
  Tensor t = transpose(x);
  EXPECT_TRUE(close(exp(t), map(contiguous(t), [](double v) { return std::exp(v); }), 0, 2e-6));
}

TEST(Forward, BinaryBroadcastingMatchesLoops) {
  Tensor a = randn_t(Shape{2, 3, 17}, 5), b = randn_t(Shape{3, 1}, 6), c = randn_t(Shape{17}, 7);
  std::vector<double> av = to_double(a), bv = to_double(b), cv = to_double(c);
  std::vector<double> r1(av.size()), r2(av.size()), r3(av.size()), r4(av.size());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 17; ++k) {
        size_t idx = size_t((i * 3 + j) * 17 + k);
        r1[idx] = av[idx] + bv[size_t(j)];
        r2[idx] = av[idx] - cv[size_t(k)];
        r3[idx] = av[idx] * cv[size_t(k)];
        r4[idx] = bv[size_t(j)] / av[idx];
      }
  EXPECT_TRUE(close(add(a, b), r1, 1e-6, 1e-6));
  EXPECT_TRUE(close(sub(a, c), r2, 1e-6, 1e-6));
  EXPECT_TRUE(close(mul(a, c), r3, 1e-6, 1e-6));
  EXPECT_TRUE(close(div(b, a), r4, 1e-6, 1e-6));
  EXPECT_TRUE(close(add(noncontig(a), c), to_double(add(a, c)), 0, 0));
  Tensor h = cast(a, DType::BF16);
  EXPECT_TRUE(close(mul(h, cast(c, DType::BF16)), r3, 2e-2, 2e-2));
}

TEST(Forward, SwigluAndDropout) {
  Tensor a = randn_t(Shape{4, 9}, 8), b = randn_t(Shape{4, 9}, 9);
  std::vector<double> av = to_double(a), bv = to_double(b), ref(av.size());
  for (size_t i = 0; i < av.size(); ++i) ref[i] = av[i] * sigmoid_ref(av[i]) * bv[i];
  EXPECT_TRUE(close(swiglu(a, b), ref, 1e-6, 2e-6));
  EXPECT_TRUE(close(swiglu(concat({a, b}, 1)), ref, 1e-6, 2e-6));
  // Dropout: kept elements scaled by 1/(1-p), keep rate ~ 1-p, deterministic per generator.
  Tensor x = ones(Shape{100000});
  Generator g1(3), g2(3);
  std::vector<float> d1 = dropout(x, 0.25f, true, g1).to_f32_vector();
  std::vector<float> d2 = dropout(x, 0.25f, true, g2).to_f32_vector();
  EXPECT_EQ(d1, d2);
  size_t kept = 0;
  for (float v : d1) {
    ASSERT_TRUE(v == 0.0f || std::fabs(v - 1.0f / 0.75f) < 1e-6);
    kept += v != 0.0f;
  }
  EXPECT_NEAR(double(kept) / 100000.0, 0.75, 0.01);
  EXPECT_TRUE(dropout(x, 0.5f, false).is_same(x));
  EXPECT_EQ(sum(dropout(x, 1.0f)).item(), 0.0);
}

namespace {
std::vector<double> matmul_ref(const Tensor& a, const Tensor& b) {
  // a [M, K] b [K, N] (any strides) in double.
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<double> av = to_double(a), bv = to_double(b), c(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) c[size_t(i * N + j)] += av[size_t(i * K + k)] * bv[size_t(k * N + j)];
  return c;
}
}  // namespace

TEST(Forward, MatmulShapesTransposesAndDtypes) {
  for (auto [M, K, N] : {std::tuple{1, 1, 1}, {3, 5, 7}, {67, 129, 33}, {128, 64, 256}, {1, 300, 1}}) {
    Tensor a = randn_t(Shape{M, K}, 10), b = randn_t(Shape{K, N}, 11);
    EXPECT_TRUE(close(matmul(a, b), matmul_ref(a, b), 1e-4, 1e-5)) << M << " " << K << " " << N;
    EXPECT_TRUE(close(matmul(contiguous(transpose(a)), b, true, false), matmul_ref(a, b), 1e-4, 1e-5));
    EXPECT_TRUE(close(matmul(a, contiguous(transpose(b)), false, true), matmul_ref(a, b), 1e-4, 1e-5));
  }
  // Batched with broadcast batch dims; strided operands.
  Tensor a = randn_t(Shape{2, 1, 4, 6}, 12), b = randn_t(Shape{3, 6, 5}, 13);
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 3, 4, 5}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      Tensor ai = squeeze(slice(squeeze(slice(a, 0, i, i + 1), 0), 0, 0, 1), 0);
      Tensor bj = squeeze(slice(b, 0, j, j + 1), 0);
      Tensor cij = squeeze(slice(squeeze(slice(c, 0, i, i + 1), 0), 0, j, j + 1), 0);
      EXPECT_TRUE(close(cij, matmul_ref(ai, bj), 1e-5, 1e-5));
    }
  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor x = randn_t(Shape{9, 17}, 14, 1.0f, dt), y = randn_t(Shape{17, 5}, 15, 1.0f, dt);
    Tensor z = matmul(x, y);
    EXPECT_EQ(z.dtype(), dt);
    EXPECT_TRUE(close(z, matmul_ref(x, y), 0.1, 2e-2));
  }
  // Vectors: dot, matrix-vector.
  Tensor v = randn_t(Shape{6}, 16), m = randn_t(Shape{6, 4}, 17);
  EXPECT_EQ(matmul(v, v).ndim(), 0);
  EXPECT_EQ(matmul(v, m).shape(), (Shape{4}));
  EXPECT_EQ(matmul(transpose(m), v).shape(), (Shape{4}));
  // K = 0 gives zeros.
  EXPECT_EQ(sum(abs(matmul(zeros(Shape{3, 0}), zeros(Shape{0, 2})))).item(), 0.0);
}

TEST(Forward, LinearAndOutProd) {
  Tensor x = randn_t(Shape{2, 3, 8}, 20), w = randn_t(Shape{5, 8}, 21), b = randn_t(Shape{5}, 22);
  Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  std::vector<double> ref = matmul_ref(reshape(x, Shape{6, 8}), transpose(w));
  std::vector<double> bv = to_double(b);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += bv[i % 5];
  EXPECT_TRUE(close(y, ref, 1e-5, 1e-5));
  Tensor p = randn_t(Shape{3}, 23), q = randn_t(Shape{4}, 24);
  std::vector<double> pv = to_double(p), qv = to_double(q), o;
  for (double pi : pv)
    for (double qj : qv) o.push_back(pi * qj);
  EXPECT_TRUE(close(out_prod(p, q), o, 1e-6, 1e-6));
  Tensor A = randn_t(Shape{7, 3}, 25), B = randn_t(Shape{7, 4}, 26);
  EXPECT_TRUE(close(out_prod(A, B), matmul_ref(transpose(A), B), 1e-5, 1e-5));
}

TEST(Forward, Reductions) {
  Tensor x = randn_t(Shape{3, 4, 5}, 30);
  std::vector<double> xv = to_double(x);
  for (int axis = 0; axis < 3; ++axis) {
    Shape os = x.shape();
    os.erase(axis);
    std::vector<double> s(size_t(os.numel()), 0.0), m(size_t(os.numel()), -INFINITY);
    std::vector<int32_t> am(size_t(os.numel()), 0);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 5; ++k) {
          int idx[3] = {i, j, k};
          int o0 = axis == 0 ? j : i, o1 = axis == 2 ? j : k;
          size_t o = size_t(o0 * os[1] + o1);
          double v = xv[size_t((i * 4 + j) * 5 + k)];
          s[o] += v;
          if (v > m[o]) m[o] = v, am[o] = idx[axis];
        }
    EXPECT_TRUE(close(sum(x, axis), s, 1e-5, 1e-5)) << axis;
    EXPECT_TRUE(close(max(x, axis), m, 0, 0)) << axis;
    EXPECT_EQ(argmax(x, axis).to_i32_vector(), am) << axis;
    std::vector<double> mean_ref = s;
    for (auto& v : mean_ref) v /= double(x.size(axis));
    EXPECT_TRUE(close(mean(x, axis), mean_ref, 1e-6, 1e-5));
  }
  EXPECT_EQ(sum(x, 1, true).shape(), (Shape{3, 1, 5}));
  EXPECT_NEAR(sum(x).item(), std::accumulate(xv.begin(), xv.end(), 0.0), 1e-4);
  EXPECT_EQ(max(x).item(), *std::max_element(xv.begin(), xv.end()));
  // A long sum keeps double-like accuracy (blocked accumulation).
  Tensor big = full(Shape{1 << 22}, 0.1);
  EXPECT_NEAR(sum(big).item(), 0.1f * double(1 << 22), 1e-2);
  // NaN propagates through max.
  EXPECT_TRUE(std::isnan(max(from_vector(std::vector<float>{1, NAN, 3}, Shape{3})).item()));
}

TEST(Forward, ArgsortAndTopK) {
  Tensor x = randn_t(Shape{4, 37}, 31);
  std::vector<float> xv = x.to_f32_vector();
  std::vector<int32_t> idx = argsort(x).to_i32_vector(), dsc = argsort(x, true).to_i32_vector();
  auto [vals, ids] = top_k(x, 5);
  std::vector<float> tv = vals.to_f32_vector();
  std::vector<int32_t> ti = ids.to_i32_vector();
  for (int r = 0; r < 4; ++r) {
    std::vector<int32_t> ref(37);
    std::iota(ref.begin(), ref.end(), 0);
    std::stable_sort(ref.begin(), ref.end(), [&](int a, int b) { return xv[size_t(r * 37 + a)] < xv[size_t(r * 37 + b)]; });
    for (int j = 0; j < 37; ++j) ASSERT_EQ(idx[size_t(r * 37 + j)], ref[size_t(j)]);
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(ti[size_t(r * 5 + j)], ref[size_t(36 - j)]);
      EXPECT_EQ(dsc[size_t(r * 37 + j)], ref[size_t(36 - j)]);
      EXPECT_EQ(tv[size_t(r * 5 + j)], xv[size_t(r * 37 + ref[size_t(36 - j)])]);
    }
  }
}

TEST(Forward, Norms) {
  for (int64_t D : {1, 7, 64, 131}) {
    Tensor x = randn_t(Shape{5, D}, 40, 3.0f), w = randn_t(Shape{D}, 41), b = randn_t(Shape{D}, 42);
    std::vector<double> xv = to_double(x), wv = to_double(w), bv = to_double(b);
    std::vector<double> rms(xv.size()), ln(xv.size()), l2(xv.size());
    for (int r = 0; r < 5; ++r) {
      double ss = 0, mu = 0, var = 0;
      for (int64_t j = 0; j < D; ++j) ss += xv[size_t(r * D + j)] * xv[size_t(r * D + j)], mu += xv[size_t(r * D + j)];
      mu /= double(D);
      for (int64_t j = 0; j < D; ++j) var += (xv[size_t(r * D + j)] - mu) * (xv[size_t(r * D + j)] - mu);
      var /= double(D);
      for (int64_t j = 0; j < D; ++j) {
        size_t i = size_t(r * D + j);
        rms[i] = xv[i] / std::sqrt(ss / double(D) + 1e-6) * wv[size_t(j)];
        ln[i] = (xv[i] - mu) / std::sqrt(var + 1e-5) * wv[size_t(j)] + bv[size_t(j)];
        l2[i] = xv[i] / std::max(std::sqrt(ss), 1e-12);
      }
    }
    EXPECT_TRUE(close(rms_norm(x, w, 1e-6f), rms, 1e-5, 1e-5)) << D;
    EXPECT_TRUE(close(layer_norm(x, w, b, 1e-5f), ln, 1e-5, 1e-4)) << D;
    EXPECT_TRUE(close(l2_norm(x), l2, 1e-6, 1e-5)) << D;
    EXPECT_TRUE(close(rms_norm(noncontig(x), w, 1e-6f), rms, 1e-5, 1e-5)) << D;
  }
  // LayerNorm of rows with a large mean stays exact (two-pass variance).
  Tensor big = add(randn_t(Shape{2, 32}, 43), full(Shape{}, 1e4));
  Tensor y = layer_norm(big);
  std::vector<float> yv = y.to_f32_vector();
  double m = 0;
  for (int j = 0; j < 32; ++j) m += yv[size_t(j)];
  EXPECT_NEAR(m / 32, 0.0, 1e-3);
}

TEST(Forward, SoftmaxMaskAndDiag) {
  Tensor x = randn_t(Shape{2, 3, 21}, 50, 3.0f), mask = randn_t(Shape{3, 21}, 51);
  std::vector<double> xv = to_double(x), mv = to_double(mask), sm(xv.size()), lsm(xv.size());
  const double s = 0.5;
  for (int r = 0; r < 6; ++r) {
    double mx = -INFINITY, tot = 0;
    for (int j = 0; j < 21; ++j) mx = std::max(mx, xv[size_t(r * 21 + j)] * s + mv[size_t((r % 3) * 21 + j)]);
    for (int j = 0; j < 21; ++j) tot += std::exp(xv[size_t(r * 21 + j)] * s + mv[size_t((r % 3) * 21 + j)] - mx);
    for (int j = 0; j < 21; ++j) {
      double z = xv[size_t(r * 21 + j)] * s + mv[size_t((r % 3) * 21 + j)];
      sm[size_t(r * 21 + j)] = std::exp(z - mx) / tot;
      lsm[size_t(r * 21 + j)] = z - mx - std::log(tot);
    }
  }
  EXPECT_TRUE(close(softmax(x, 0.5f, mask), sm, 1e-7, 1e-5));
  EXPECT_TRUE(close(log_softmax(x, 0.5f, mask), lsm, 1e-5, 1e-5));
  // Causal mask with n_past, then softmax: rows sum to 1 over visible keys only.
  Tensor d = diag_mask_inf(randn_t(Shape{4, 6}, 52), 2);
  std::vector<float> dv = d.to_f32_vector();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_EQ(std::isinf(dv[size_t(i * 6 + j)]), j > 2 + i);
  // A fully masked row gives zeros, not NaN.
  Tensor all_masked = full(Shape{1, 4}, -INFINITY);
  for (float v : softmax(all_masked).to_f32_vector()) EXPECT_EQ(v, 0.0f);
}

namespace {
// ggml rope_yarn reference in double.
std::vector<double> rope_ref(const Tensor& x, const std::vector<int>& pos, const RopeOptions& o) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  const int n = o.n_dims ? o.n_dims : int(D);
  std::vector<double> xv = to_double(contiguous(x)), y = xv;
  std::vector<float> ff = o.freq_factors.defined() ? o.freq_factors.to_f32_vector() : std::vector<float>();
  double corr0 = 0, corr1 = 0;
  auto corr_dim = [&](double rot) { return n * std::log(o.n_ctx_orig / (rot * 2 * M_PI)) / (2 * std::log(o.freq_base)); };
  if (o.ext_factor != 0) {
    corr0 = std::max(0.0, std::floor(corr_dim(o.beta_fast)));
    corr1 = std::min(double(n - 1), std::ceil(corr_dim(o.beta_slow)));
  }
  double mscale = o.attn_factor * (o.ext_factor != 0 ? 1 + 0.1 * std::log(1 / o.freq_scale) : 1.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int i = 0; i < n / 2; ++i) {
          double te = pos[size_t(t)] * std::pow(double(o.freq_base), -2.0 * i / n) / (ff.empty() ? 1.0 : ff[size_t(i)]);
          double th = o.freq_scale * te;
          if (o.ext_factor != 0) {
            double ramp = 1 - std::min(1.0, std::max(0.0, (i - corr0) / std::max(0.001, corr1 - corr0)));
            double mix = ramp * o.ext_factor;
            th = th * (1 - mix) + te * mix;
          }
          const int64_t i0 = o.neox ? i : 2 * i, i1 = o.neox ? i + n / 2 : 2 * i + 1;
          const size_t base = size_t(((b * T + t) * H + h) * D);
          const double x0 = xv[base + size_t(i0)], x1 = xv[base + size_t(i1)];
          y[base + size_t(i0)] = (x0 * std::cos(th) - x1 * std::sin(th)) * mscale;
          y[base + size_t(i1)] = (x0 * std::sin(th) + x1 * std::cos(th)) * mscale;
        }
  return y;
}
}  // namespace

TEST(Forward, RopeLayoutsScalingAndYarn) {
  Tensor x = randn_t(Shape{2, 5, 3, 16}, 60);
  std::vector<int> pv = {0, 1, 5, 100, 4000};
  Tensor pos = from_vector(std::vector<int32_t>(pv.begin(), pv.end()), Shape{5});
  std::vector<RopeOptions> cases(5);
  cases[1].neox = true;
  cases[2].n_dims = 8;
  cases[2].freq_base = 500000.0f;
  cases[3].freq_factors = from_vector(std::vector<float>{1, 1, 2, 2, 4, 4, 8, 8}, Shape{8});
  cases[4].ext_factor = 1.0f;
  cases[4].freq_scale = 0.25f;
  cases[4].n_ctx_orig = 4096;
  cases[4].attn_factor = 1.1f;
  for (size_t c = 0; c < cases.size(); ++c)
    EXPECT_TRUE(close(rope(x, pos, cases[c]), rope_ref(x, pv, cases[c]), 1e-4, 1e-4)) << "case " << c;
  // Per-batch positions.
  Tensor pos2 = from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 5, 100, 4000}, Shape{2, 5});
  Tensor y = rope(x, pos2);
  EXPECT_TRUE(close(slice(y, 0, 1, 2), rope_ref(slice(x, 0, 1, 2), pv, {}), 1e-4, 1e-4));
  // The inverse rotation restores the input (what the backward relies on).
  Tensor xr = param(x.detach());
  Tensor yr = rope(xr, pos);
  auto g = grad(sum(mul(yr, yr.detach())), {xr});
  EXPECT_TRUE(close(g[0], to_double(x), 1e-4, 1e-4));
}

namespace {
std::vector<double> attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                  const std::vector<int>& seg, float scale, int64_t window = 0) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1), Hkv = k.size(2),
                Dv = v.size(3);
  std::vector<double> qv = to_double(contiguous(q)), kv = to_double(contiguous(k)), vv = to_double(contiguous(v));
  std::vector<double> out(size_t(B * T * H * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(size_t(S), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          if (causal && j > i + (S - T)) continue;
          if (window > 0 && i + (S - T) - j >= window) continue;
          if (!seg.empty() && seg[size_t(b * T + j)] != seg[size_t(b * T + i)]) continue;
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += qv[size_t(((b * T + i) * H + h) * D + e)] * kv[size_t(((b * S + j) * Hkv + hk) * D + e)];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double tot = 0;
        for (auto& x : s) tot += (x = std::isinf(x) ? 0 : std::exp(x - mx));
        for (int64_t j = 0; j < S; ++j)
          for (int64_t e = 0; e < Dv; ++e)
            out[size_t(((b * T + i) * H + h) * Dv + e)] += s[size_t(j)] / tot * vv[size_t(((b * S + j) * Hkv + hk) * Dv + e)];
      }
    }
  return out;
}
}  // namespace

// [B, S, 1, D] -> [B, S, n, D]: the one KV head shared by n query heads, as a differentiable copy.
Tensor repeat_kv_for_test(const Tensor& x, int64_t n) {
  std::vector<Tensor> parts(size_t(n), x);
  return concat(parts, 2);
}

TEST(Forward, AttentionCausalGqaSegmentsAndKvOffset) {
  Tensor q = randn_t(Shape{2, 150, 4, 8}, 70), k = randn_t(Shape{2, 150, 2, 8}, 71), v = randn_t(Shape{2, 150, 2, 5}, 72);
  const float sc = 1.0f / std::sqrt(8.0f);
  EXPECT_TRUE(close(attention(q, k, v), attention_ref(q, k, v, true, {}, sc), 1e-5, 1e-4));
  AttentionOptions nc;
  nc.causal = false;
  nc.scale = 0.3f;
  EXPECT_TRUE(close(attention(q, k, v, nc), attention_ref(q, k, v, false, {}, 0.3f), 1e-5, 1e-4));
  // Decode-style: 3 new queries against 150 cached keys.
  Tensor q3 = slice(q, 1, 147, 150);
  EXPECT_TRUE(close(attention(q3, k, v), attention_ref(q3, k, v, true, {}, sc), 1e-5, 1e-4));
  // One query (the decode path: dot products per key, no tiles), head dims that are not a
  // multiple of 8, causal and not, one key, and through the backward.
  for (int64_t D : {int64_t(8), int64_t(13)}) {
    Tensor q1 = randn_t(Shape{2, 1, 4, D}, 73), k1 = randn_t(Shape{2, 37, 2, D}, 74), v1 = randn_t(Shape{2, 37, 2, 11}, 75);
    const float s1 = 1.0f / std::sqrt(float(D));
    EXPECT_TRUE(close(attention(q1, k1, v1), attention_ref(q1, k1, v1, true, {}, s1), 1e-5, 1e-4)) << D;
    EXPECT_TRUE(close(attention(q1, k1, v1, nc), attention_ref(q1, k1, v1, false, {}, 0.3f), 1e-5, 1e-4)) << D;
    Tensor k0 = slice(k1, 1, 0, 1), v0 = slice(v1, 1, 0, 1);
    EXPECT_TRUE(close(attention(q1, k0, v0), attention_ref(q1, k0, v0, true, {}, s1), 1e-5, 1e-4)) << D;
  }
  {
    Tensor qa = param(randn_t(Shape{1, 1, 2, 8}, 76)), ka = param(randn_t(Shape{1, 9, 1, 8}, 77)),
           va = param(randn_t(Shape{1, 9, 1, 8}, 78));
    auto fused = grad(sum(square(attention(qa, ka, va))), {qa, ka, va});
    Tensor kr = repeat_kv_for_test(ka, 2), vr = repeat_kv_for_test(va, 2);
    Tensor qh = permute(qa, {0, 2, 1, 3}), kh = permute(kr, {0, 2, 1, 3}), vh = permute(vr, {0, 2, 1, 3});
    Tensor o = permute(matmul(softmax(matmul(qh, kh, false, true), 1.0f / std::sqrt(8.0f)), vh), {0, 2, 1, 3});
    auto composed = grad(sum(square(o)), {qa, ka, va});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(fused[size_t(i)], composed[size_t(i)], 1e-5, 1e-4)) << i;
  }
  // Packed segments (monotone in batch 0, interleaved in batch 1).
  std::vector<int> seg(300);
  for (int t = 0; t < 150; ++t) seg[size_t(t)] = t / 40, seg[size_t(150 + t)] = (t / 7) % 3;
  AttentionOptions so;
  so.segments = from_vector(std::vector<int32_t>(seg.begin(), seg.end()), Shape{2, 150});
  EXPECT_TRUE(close(attention(q, k, v, so), attention_ref(q, k, v, true, seg, sc), 1e-5, 1e-4));
  // Strided inputs (a permuted view) and bf16.
  Tensor qp = permute(contiguous(permute(q, {0, 2, 1, 3})), {0, 2, 1, 3});
  EXPECT_TRUE(close(attention(qp, k, v), attention_ref(q, k, v, true, {}, sc), 1e-5, 1e-4));
  Tensor qb = cast(q, DType::BF16), kb = cast(k, DType::BF16), vb = cast(v, DType::BF16);
  Tensor ob = attention(qb, kb, vb);
  EXPECT_EQ(ob.dtype(), DType::BF16);
  EXPECT_TRUE(close(ob, attention_ref(qb, kb, vb, true, {}, sc), 2e-2, 2e-2));
}

// Sliding windows (Gemma 3's local layers): a query sees only the `window` latest keys — in
// tiles (whole key chunks before the window skipped), with more keys than queries (a cache),
// one query (the decode path), segments, and through the backward against composed ops.
TEST(Forward, AttentionSlidingWindow) {
  Tensor q = randn_t(Shape{2, 300, 4, 8}, 160), k = randn_t(Shape{2, 600, 2, 8}, 161), v = randn_t(Shape{2, 600, 2, 5}, 162);
  const float sc = 1.0f / std::sqrt(8.0f);
  for (int64_t w : {int64_t(1), int64_t(7), int64_t(100), int64_t(257), int64_t(700)}) {
    SCOPED_TRACE(w);
    AttentionOptions o;
    o.window = w;
    EXPECT_TRUE(close(attention(q, k, v, o), attention_ref(q, k, v, true, {}, sc, w), 1e-5, 1e-4));
    Tensor q1 = slice(q, 1, 299, 300);
    EXPECT_TRUE(close(attention(q1, k, v, o), attention_ref(q1, k, v, true, {}, sc, w), 1e-5, 1e-4));
    Tensor ks = slice(k, 1, 0, 300), vs = slice(v, 1, 0, 300);
    std::vector<int> seg(600);
    for (int t = 0; t < 300; ++t) seg[size_t(t)] = t / 90, seg[size_t(300 + t)] = (t / 7) % 3;
    o.segments = from_vector(std::vector<int32_t>(seg.begin(), seg.end()), Shape{2, 300});
    EXPECT_TRUE(close(attention(q, ks, vs, o), attention_ref(q, ks, vs, true, seg, sc, w), 1e-5, 1e-4));
  }
  AttentionOptions bad;
  bad.causal = false;
  bad.window = 4;
  EXPECT_THROW(attention(q, k, v, bad), Error);
  // Gradients across key chunks with a window that cuts inside them.
  Tensor qq = param(randn_t(Shape{1, 520, 2, 4}, 163)), kk = param(randn_t(Shape{1, 520, 1, 4}, 164)),
         vv = param(randn_t(Shape{1, 520, 1, 4}, 165));
  Tensor g = randn_t(Shape{1, 520, 2, 4}, 166);
  AttentionOptions o;
  o.window = 300;
  auto fused = grad(mul(attention(qq, kk, vv, o), g), {qq, kk, vv}, ones(Shape{1, 520, 2, 4}));
  std::vector<float> far(size_t(520 * 520), 0.0f);
  for (int64_t i = 0; i < 520; ++i)
    for (int64_t j = 0; j < 520; ++j)
      if (j > i || i - j >= 300) far[size_t(i * 520 + j)] = -INFINITY;
  Tensor mask = from_vector(far, Shape{1, 1, 520, 520});
  Tensor kr = repeat_kv_for_test(kk, 2), vr = repeat_kv_for_test(vv, 2);
  Tensor qh = permute(qq, {0, 2, 1, 3}), kh = permute(kr, {0, 2, 1, 3}), vh = permute(vr, {0, 2, 1, 3});
  Tensor out = permute(matmul(softmax(matmul(qh, kh, false, true), 0.5f, mask), vh), {0, 2, 1, 3});
  auto composed = grad(mul(out, g), {qq, kk, vv}, ones(Shape{1, 520, 2, 4}));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(fused[size_t(i)], composed[size_t(i)], 1e-5, 1e-4)) << i;
}

TEST(Forward, AttentionAcceptsRowStridesBlasCannotTake) {
  // The same query broadcast over time (row stride 0): BLAS needs lda >= D, so the op
  // must copy rather than hand the view over (regression: silently wrong output).
  Tensor q0 = randn_t(Shape{2, 1, 4, 8}, 73);
  Tensor qe = make_view(q0, Shape{2, 5, 4, 8}, Strides{32, 0, 8, 1}, 0);
  Tensor k = randn_t(Shape{2, 5, 2, 8}, 74), v = randn_t(Shape{2, 5, 2, 8}, 75);
  const float sc = 1.0f / std::sqrt(8.0f);
  EXPECT_TRUE(close(attention(qe, k, v), attention_ref(contiguous(qe), k, v, true, {}, sc), 1e-5, 1e-4));
}

TEST(Forward, AttentionMatchesComposedOps) {
  // The fused kernel against the same maths composed from the engine's own ops.
  Tensor q = randn_t(Shape{1, 33, 2, 16}, 73), k = randn_t(Shape{1, 33, 2, 16}, 74), v = randn_t(Shape{1, 33, 2, 16}, 75);
  Tensor qh = permute(q, {0, 2, 1, 3}), kh = permute(k, {0, 2, 1, 3}), vh = permute(v, {0, 2, 1, 3});
  Tensor p = softmax(diag_mask_inf(matmul(qh, kh, false, true)), 0.25f);
  Tensor composed = permute(matmul(p, vh), {0, 2, 1, 3});
  EXPECT_TRUE(close(attention(q, k, v), contiguous(composed), 1e-5, 1e-4));
}

TEST(Forward, ShapeOps) {
  Tensor x = reshape(arange(24), Shape{2, 3, 4});
  EXPECT_EQ(permute(x, {2, 0, 1}).to_f32_vector()[1], 4.0f);  // y[0, 0, 1] = x[0, 1, 0]
  Tensor c = concat({x, scale(x, -1)}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 6, 4}));
  EXPECT_EQ(c.to_f32_vector()[12], -0.0f);
  EXPECT_EQ(c.to_f32_vector()[24], 12.0f);
  Tensor s = slice(x, 2, 1, 4, 2);
  EXPECT_EQ(s.to_f32_vector(), (std::vector<float>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  EXPECT_EQ(slice(x, 0, -1, 100).shape(), (Shape{1, 3, 4}));
  Tensor p = pad(reshape(arange(2), Shape{1, 2}), {{1, 0}, {0, 2}}, 9.0f);
  EXPECT_EQ(p.to_f32_vector(), (std::vector<float>{9, 9, 9, 9, 0, 1, 9, 9}));
  Tensor r = repeat(from_vector(std::vector<float>{1, 2}, Shape{2}), {2, 3});
  EXPECT_EQ(r.shape(), (Shape{2, 6}));
  EXPECT_EQ(r.to_f32_vector(), (std::vector<float>{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}));
  Tensor e = expand(from_vector(std::vector<float>{1, 2}, Shape{2, 1}), Shape{2, 3});
  EXPECT_EQ(e.to_f32_vector(), (std::vector<float>{1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(unsqueeze(x, 1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(cast(from_vector(std::vector<float>{1.7f, -2.5f}, Shape{2}), DType::I32).to_i32_vector(),
            (std::vector<int32_t>{1, -2}));
  EXPECT_EQ(cast(cast(x, DType::BF16), DType::F32).to_f32_vector(), x.to_f32_vector());
  // Quantize / dequantize through cast.
  Tensor w = randn_t(Shape{3, 64}, 80);
  Tensor wq = cast(w, DType::Q8_0);
  EXPECT_EQ(wq.dtype(), DType::Q8_0);
  EXPECT_TRUE(close(cast(wq, DType::F32), w, 0.05, 0.0));
}

TEST(Forward, RowsGatherAndScatter) {
  Tensor table = randn_t(Shape{6, 5}, 90);
  Tensor ids = from_vector(std::vector<int32_t>{5, 0, 5}, Shape{3});
  Tensor r = get_rows(table, ids);
  std::vector<float> tv = table.to_f32_vector(), rv = r.to_f32_vector();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(rv[size_t(i)], tv[size_t(25 + i)]);
    EXPECT_EQ(rv[size_t(5 + i)], tv[size_t(i)]);
  }
  Tensor q = cast(randn_t(Shape{4, 32}, 91), DType::Q4_0);
  Tensor qr = get_rows(q, from_vector(std::vector<int32_t>{2}, Shape{1}));
  EXPECT_EQ(qr.dtype(), DType::F32);
  EXPECT_TRUE(close(qr, slice(cast(q, DType::F32), 0, 2, 3), 0, 0));
  Tensor dst = zeros(Shape{4, 5});
  Tensor src = randn_t(Shape{2, 5}, 92);
  Tensor out = set_rows(dst, from_vector(std::vector<int32_t>{3, 1}, Shape{2}), src);
  EXPECT_EQ(sum(abs(dst)).item(), 0.0);  // functional: dst untouched
  EXPECT_TRUE(close(slice(out, 0, 3, 4), slice(src, 0, 0, 1), 0, 0));
  set_rows_(dst, from_vector(std::vector<int32_t>{0}, Shape{1}), slice(src, 0, 1, 2));
  EXPECT_TRUE(close(slice(dst, 0, 0, 1), slice(src, 0, 1, 2), 0, 0));
}

TEST(Forward, CrossEntropyIgnoreWeightsAndNormalizer) {
  Tensor logits = randn_t(Shape{4, 7}, 100, 3.0f);
  Tensor t = from_vector(std::vector<int32_t>{1, -100, 6, 0}, Shape{4});
  std::vector<double> z = to_double(logits);
  auto nll = [&](int r, int c) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < 7; ++j) mx = std::max(mx, z[size_t(r * 7 + j)]);
    for (int j = 0; j < 7; ++j) s += std::exp(z[size_t(r * 7 + j)] - mx);
    return mx + std::log(s) - z[size_t(r * 7 + c)];
  };
  double ref = (nll(0, 1) + nll(2, 6) + nll(3, 0)) / 3;
  EXPECT_NEAR(cross_entropy(logits, t).item(), ref, 1e-5);
  CrossEntropyOptions o;
  o.weights = from_vector(std::vector<float>{2, 1, 0, 1}, Shape{4});
  EXPECT_NEAR(cross_entropy(logits, t, o).item(), (2 * nll(0, 1) + nll(3, 0)) / 3, 1e-5);
  o.normalizer = 10;
  EXPECT_NEAR(cross_entropy(logits, t, o).item(), (2 * nll(0, 1) + nll(3, 0)) / 10, 1e-5);
  Tensor none = from_vector(std::vector<int32_t>{-100, -100, -100, -100}, Shape{4});
  EXPECT_EQ(cross_entropy(logits, none).item(), 0.0);
  // Chunked linear head = plain head.
  Tensor h = randn_t(Shape{9, 6}, 101), w = randn_t(Shape{7, 6}, 102);
  Tensor t9 = from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, -100, 3}, Shape{9});
  EXPECT_NEAR(linear_cross_entropy(h, w, t9, 4).item(), cross_entropy(linear(h, w), t9).item(), 1e-5);
  // A quantized head (a tied Q8_0 embedding, fine-tuned with LoRA) is chunked the same way:
  // the same loss and the same gradient to h as the full logits.
  Tensor hq = param(randn_t(Shape{9, 64}, 103)), hq2 = param(randn_t(Shape{9, 64}, 103));
  Tensor wq = cast(randn_t(Shape{7, 64}, 104, 0.3f), DType::Q8_0);
  Tensor chunked = linear_cross_entropy(hq, wq, t9, 4), whole = cross_entropy(linear(hq2, wq), t9);
  EXPECT_NEAR(chunked.item(), whole.item(), 1e-5);
  backward(chunked);
  backward(whole);
  EXPECT_TRUE(close(hq.grad(), hq2.grad(), 1e-5, 1e-5));
}

TEST(Forward, ConvolutionsMatchDirectLoops) {
  Tensor x = randn_t(Shape{2, 3, 7, 6}, 110), w = randn_t(Shape{4, 3, 3, 2}, 111), b = randn_t(Shape{4}, 112);
  Conv2dOptions o;
  o.stride_h = 2;
  o.pad_h = 1;
  o.pad_w = 2;
  o.dilation_w = 2;
  Tensor y = conv2d(x, w, b, o);
  const int64_t OH = (7 + 2 - 2 - 1) / 2 + 1, OW = (6 + 4 - 2 - 1) / 1 + 1;
  ASSERT_EQ(y.shape(), (Shape{2, 4, OH, OW}));
  std::vector<double> xv = to_double(x), wv = to_double(w), bv = to_double(b), ref;
  for (int n = 0; n < 2; ++n)
    for (int oc = 0; oc < 4; ++oc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double s = bv[size_t(oc)];
          for (int c = 0; c < 3; ++c)
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 2; ++kw) {
                int ih = oh * 2 - 1 + kh, iw = ow - 2 + kw * 2;
                if (ih < 0 || ih >= 7 || iw < 0 || iw >= 6) continue;
                s += xv[size_t(((n * 3 + c) * 7 + ih) * 6 + iw)] * wv[size_t(((oc * 3 + c) * 3 + kh) * 2 + kw)];
              }
          ref.push_back(s);
        }
  EXPECT_TRUE(close(y, ref, 1e-5, 1e-5));
  // Depthwise causal conv1d.
  Tensor xs = randn_t(Shape{2, 9, 3}, 113), ws = randn_t(Shape{3, 4}, 114);
  std::vector<double> a = to_double(xs), k = to_double(ws), r2;
  for (int bb = 0; bb < 2; ++bb)
    for (int t = 0; t < 9; ++t)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (int j = 0; j < 4; ++j) {
          int ti = t - 3 + j;
          if (ti >= 0) s += k[size_t(c * 4 + j)] * a[size_t((bb * 9 + ti) * 3 + c)];
        }
        r2.push_back(s);
      }
  EXPECT_TRUE(close(conv1d(xs, ws), r2, 1e-6, 1e-5));
}

TEST(Forward, SsmScanMatchesRecurrence) {
  const int64_t B = 2, T = 6, H = 4, P = 3, G = 2, N = 5;
  Tensor x = randn_t(Shape{B, T, H, P}, 120), dt = randn_t(Shape{B, T, H}, 121), A = rand_t(Shape{H}, 122, -2, -0.1f);
  Tensor Bm = randn_t(Shape{B, T, G, N}, 123), C = randn_t(Shape{B, T, G, N}, 124), s0 = randn_t(Shape{B, H, P, N}, 125);
  auto [y, sf] = ssm_scan(x, dt, A, Bm, C, s0);
  std::vector<double> xv = to_double(x), dv = to_double(dt), av = to_double(A), bv = to_double(Bm), cv = to_double(C),
                      s = to_double(s0), yref(size_t(B * T * H * P));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t t = 0; t < T; ++t) {
        double d = dv[size_t((b * T + t) * H + h)];
        double dtp = d > 20 ? d : std::log1p(std::exp(d));
        double a = std::exp(dtp * av[size_t(h)]);
        for (int64_t p = 0; p < P; ++p) {
          double acc = 0;
          for (int64_t n = 0; n < N; ++n) {
            double& st = s[size_t(((b * H + h) * P + p) * N + n)];
            st = st * a + xv[size_t(((b * T + t) * H + h) * P + p)] * dtp * bv[size_t(((b * T + t) * G + g) * N + n)];
            acc += st * cv[size_t(((b * T + t) * G + g) * N + n)];
          }
          yref[size_t(((b * T + t) * H + h) * P + p)] = acc;
        }
      }
    }
  EXPECT_TRUE(close(y, yref, 1e-5, 1e-5));
  EXPECT_TRUE(close(sf, s, 1e-5, 1e-5));
}

namespace {
// The gated delta rule token by token in double: o [B, T, Hv, Dv] and the final state.
std::pair<std::vector<double>, std::vector<double>> gated_delta_naive(const Tensor& q, const Tensor& k,
                                                                       const Tensor& v, const Tensor& g,
                                                                       const Tensor& beta, const Tensor& s0) {
  const int64_t B = q.size(0), T = q.size(1), Hk = q.size(2), Dk = q.size(3), Hv = v.size(2), Dv = v.size(3);
  const std::vector<double> qv = to_double(q), kv = to_double(k), vv = to_double(v), gv = to_double(g),
                            bv = to_double(beta);
  std::vector<double> S = s0.defined() ? to_double(s0) : std::vector<double>(size_t(B * Hv * Dk * Dv), 0.0);
  std::vector<double> o(static_cast<size_t>(B * T * Hv * Dv)), u(static_cast<size_t>(Dv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hv; ++h) {
      double* St = S.data() + (b * Hv + h) * Dk * Dv;
      for (int64_t t = 0; t < T; ++t) {
        const double* kt = kv.data() + ((b * T + t) * Hk + h % Hk) * Dk;
        const double* qt = qv.data() + ((b * T + t) * Hk + h % Hk) * Dk;
        const double* vt = vv.data() + ((b * T + t) * Hv + h) * Dv;
        const double a = std::exp(gv[size_t((b * T + t) * Hv + h)]), be = bv[size_t((b * T + t) * Hv + h)];
        for (int64_t i = 0; i < Dk * Dv; ++i) St[i] *= a;
        for (int64_t j = 0; j < Dv; ++j) {
          double p = 0;
          for (int64_t i = 0; i < Dk; ++i) p += St[i * Dv + j] * kt[i];
          u[size_t(j)] = be * (vt[j] - p);
        }
        for (int64_t i = 0; i < Dk; ++i)
          for (int64_t j = 0; j < Dv; ++j) St[i * Dv + j] += kt[i] * u[size_t(j)];
        for (int64_t j = 0; j < Dv; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < Dk; ++i) acc += St[i * Dv + j] * qt[i];
          o[size_t(((b * T + t) * Hv + h) * Dv + j)] = acc;
        }
      }
    }
  return {o, S};
}

struct GdrInputs {
  Tensor q, k, v, g, beta, s0;
};
GdrInputs gdr_inputs(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, uint64_t seed,
                     bool state) {
  GdrInputs in;
  // q and k L2-normalised per head, as the model feeds them; strong and weak decays.
  in.q = l2_norm(randn_t(Shape{B, T, Hk, Dk}, seed), 1e-6f);
  in.k = l2_norm(randn_t(Shape{B, T, Hk, Dk}, seed + 1), 1e-6f);
  in.v = randn_t(Shape{B, T, Hv, Dv}, seed + 2);
  in.g = rand_t(Shape{B, T, Hv}, seed + 3, -3.0f, -0.001f);
  in.beta = rand_t(Shape{B, T, Hv}, seed + 4, 0.0f, 1.0f);
  if (state) in.s0 = randn_t(Shape{B, Hv, Dk, Dv}, seed + 5);
  return in;
}
}  // namespace

// Both algorithms against the recurrence in double: several chunk boundaries, T not a
// multiple of 64, Dk != Dv, fewer K heads than V heads, with and without an initial state.
TEST(Forward, GatedDeltaRuleMatchesTheNaiveRecurrence) {
  struct Case {
    int64_t B, T, Hk, Hv, Dk, Dv;
    bool state;
  };
  for (const Case& c : {Case{2, 5, 2, 4, 3, 5, true}, Case{1, 64, 1, 1, 8, 8, false}, Case{2, 150, 2, 6, 16, 8, true},
                        Case{1, 200, 3, 3, 8, 12, false}}) {
    const GdrInputs in = gdr_inputs(c.B, c.T, c.Hk, c.Hv, c.Dk, c.Dv, uint64_t(140 + c.T), c.state);
    const auto [o_ref, s_ref] = gated_delta_naive(in.q, in.k, in.v, in.g, in.beta, in.s0);
    for (GatedDeltaAlgorithm a : {GatedDeltaAlgorithm::Chunked, GatedDeltaAlgorithm::Recurrent}) {
      auto [o, s] = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.s0, a);
      const std::string what = fmt::format("T={} {}", c.T, a == GatedDeltaAlgorithm::Chunked ? "chunked" : "recurrent");
      EXPECT_TRUE(close(o, o_ref, 1e-5, 1e-5)) << what;
      EXPECT_TRUE(close(s, s_ref, 1e-5, 1e-5)) << what;
    }
  }
}

// A prefill's final state continues the sequence: the first 100 tokens chunked, then the rest
// one token at a time, equals the whole sequence at once.
TEST(Forward, GatedDeltaRuleContinuesFromItsFinalState) {
  const int64_t T = 120, split = 100;
  const GdrInputs in = gdr_inputs(1, T, 2, 4, 8, 8, 160, true);
  const auto [o_all, s_all] = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.s0);
  auto part = [](const Tensor& x, int64_t a, int64_t b) { return contiguous(slice(x, 1, a, b)); };
  auto [o, s] = gated_delta_rule(part(in.q, 0, split), part(in.k, 0, split), part(in.v, 0, split),
                                 part(in.g, 0, split), part(in.beta, 0, split), in.s0);
  std::vector<double> got = to_double(o);
  for (int64_t t = split; t < T; ++t) {
    auto [ot, st] = gated_delta_rule(part(in.q, t, t + 1), part(in.k, t, t + 1), part(in.v, t, t + 1),
                                     part(in.g, t, t + 1), part(in.beta, t, t + 1), s);
    s = st;
    const std::vector<double> step = to_double(ot);
    got.insert(got.end(), step.begin(), step.end());
  }
  EXPECT_TRUE(close(o_all, got, 1e-5, 1e-5));
  EXPECT_TRUE(close(s_all, to_double(s), 1e-5, 1e-5));
}

// The fused layer form equals its composition: slices of c, L2 norms, q / sqrt(D), the rule.
TEST(Forward, GatedDeltaRuleQkvEqualsItsComposition) {
  const int64_t B = 2, T = 90, Hk = 2, Hv = 4, D = 8;
  Tensor c = randn_t(Shape{B, T, (2 * Hk + Hv) * D}, 170);
  Tensor g = rand_t(Shape{B, T, Hv}, 171, -2.0f, -0.01f), beta = rand_t(Shape{B, T, Hv}, 172, 0.0f, 1.0f);
  Tensor s0 = randn_t(Shape{B, Hv, D, D}, 173);
  auto [o, s] = gated_delta_rule_qkv(c, g, beta, Hk, Hv, D, 1e-6f, s0);
  Tensor q = scale(l2_norm(reshape(slice(c, 2, 0, Hk * D), Shape{B, T, Hk, D}), 1e-6f), 1.0f / std::sqrt(float(D)));
  Tensor k = l2_norm(reshape(slice(c, 2, Hk * D, 2 * Hk * D), Shape{B, T, Hk, D}), 1e-6f);
  Tensor v = reshape(slice(c, 2, 2 * Hk * D, (2 * Hk + Hv) * D), Shape{B, T, Hv, D});
  auto [o_ref, s_ref] = gated_delta_rule(q, k, v, g, beta, s0);
  EXPECT_TRUE(close(o, o_ref, 1e-6, 1e-6));
  EXPECT_TRUE(close(s, s_ref, 1e-6, 1e-6));
}

TEST(Forward, MoePrimitives) {
  Tensor w = randn_t(Shape{3, 4, 5}, 130), x = randn_t(Shape{2, 1, 5}, 131), b = randn_t(Shape{3, 4}, 132);
  Tensor ids = from_vector(std::vector<int32_t>{2, 0, 1, 2}, Shape{2, 2});
  Tensor y = mul_mat_id(w, x, ids);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 4}));
  std::vector<double> wv = to_double(w), xv = to_double(x), yv = to_double(y);
  const int idv[4] = {2, 0, 1, 2};
  for (int t = 0; t < 2; ++t)
    for (int u = 0; u < 2; ++u)
      for (int n = 0; n < 4; ++n) {
        double s = 0;
        for (int k = 0; k < 5; ++k) s += wv[size_t((idv[t * 2 + u] * 4 + n) * 5 + k)] * xv[size_t(t * 5 + k)];
        EXPECT_NEAR(yv[size_t((t * 2 + u) * 4 + n)], s, 1e-5);
      }
  Tensor z = add_id(y, b, ids);
  std::vector<double> zv = to_double(z), bv = to_double(b);
  for (int i = 0; i < 4; ++i)
    for (int n = 0; n < 4; ++n) EXPECT_NEAR(zv[size_t(i * 4 + n)], yv[size_t(i * 4 + n)] + bv[size_t(idv[i] * 4 + n)], 1e-6);
}

// Experts in a stored dtype: one kernel call (the few-pair experts of a decoding step in one
// parallel region, the many-pair experts of a prompt one product each) gives the bits of its
// composite form (each expert's rows gathered through linear, which runs under autograd and
// on devices without the kernel), and a few-pair expert's row those of linear on that row
// alone. Every stored type: the 32-value blocks (integer products), the K types, F16/BF16,
// and a type without block products (Q4_1: every expert through matmul_weight). Row counts
// of one pair per expert (decoding), a few, and more than kGemvMaxRows (a prompt), N not a
// multiple of the kernel's 16-row blocks, x shared by the slots (X = 1) or one row per slot.
TEST(Forward, StoredExpertsInOneKernelEqualTheirGroupedLinearsBitForBit) {
  const int64_t E = 6, N = 40, K = 256, U = 2;
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::F16, DType::BF16,
                   DType::Q4_1}) {
    const Tensor w = cast(randn_t(Shape{E, N, K}, 140, 0.5f), dt);
    const Tensor wf = cast(w, DType::F32);
    for (int64_t T : {1, 3, 24})
      for (int64_t X : {int64_t(1), U}) {
        SCOPED_TRACE(fmt::format("{} T {} X {}", name(dt), T, X));
        // Slot 0 of every token picks expert 0 (24 pairs at T = 24: a prompt's product), slot 1
        // one of the other five (a few pairs each).
        std::vector<int32_t> idv;
        for (int64_t t = 0; t < T; ++t) idv.insert(idv.end(), {0, int32_t(1 + (t * 7 + 2) % 5)});
        const Tensor ids = from_vector(idv, Shape{T, U});
        const Tensor x = randn_t(Shape{T, X, K}, 141 + uint64_t(T));
        const Tensor y = mul_mat_id(w, x, ids);
        ASSERT_EQ(y.shape(), (Shape{T, U, N}));
        {  // one thread: the whole row range in one call of the block loop
          const int threads = num_threads();
          set_num_threads(1);
          const std::vector<float> alone = mul_mat_id(w, x, ids).to_f32_vector();
          set_num_threads(threads);
          EXPECT_EQ(alone, y.to_f32_vector()) << "one thread";
        }
        Tensor xg = x.detach();
        xg.requires_grad_(true);
        const Tensor grouped = mul_mat_id(w, xg, ids);
        EXPECT_EQ(y.to_f32_vector(), grouped.detach().to_f32_vector());
        const std::vector<float> yv = y.to_f32_vector(), ref = mul_mat_id(wf, x, ids).to_f32_vector();
        float top = 0.0f;
        for (float v : ref) top = std::max(top, std::fabs(v));
        for (size_t i = 0; i < yv.size(); ++i) ASSERT_NEAR(yv[i], ref[i], 0.03f * top) << "at " << i;
        // A few-pair expert's row (slot 1 of token 0) is linear's on that row alone.
        const Tensor row = reshape(slice(slice(x, 0, 0, 1), 1, X - 1, X), Shape{1, K});
        const Tensor alone = linear(row, view(slice(w, 0, idv[1], idv[1] + 1), Shape{N, K}));
        const std::vector<float> av = alone.to_f32_vector();
        EXPECT_EQ(std::vector<float>(yv.begin() + N, yv.begin() + 2 * N), av);
      }
    // No tokens: an empty result, with and without a gradient to carry (the grouped form).
    Tensor none = zeros(Shape{0, U, K});
    EXPECT_EQ(mul_mat_id(w, none, zeros(Shape{0, U}, DType::I32)).shape(), (Shape{0, U, N})) << name(dt);
    none.requires_grad_(true);
    EXPECT_EQ(mul_mat_id(w, none, zeros(Shape{0, U}, DType::I32)).shape(), (Shape{0, U, N})) << name(dt);
  }
}

TEST(Forward, ResultsDoNotDependOnThreadCount) {
  auto run = [] {
    Tensor x = randn_t(Shape{37, 129}, 140), w = randn_t(Shape{129}, 141);
    Tensor a = randn_t(Shape{2, 70, 2, 16}, 142);
    std::vector<float> r = rms_norm(x, w).to_f32_vector();
    std::vector<float> s = softmax(x).to_f32_vector();
    std::vector<float> e = gelu(x).to_f32_vector();
    std::vector<float> at = attention(a, a, a).to_f32_vector();
    r.insert(r.end(), s.begin(), s.end());
    r.insert(r.end(), e.begin(), e.end());
    r.insert(r.end(), at.begin(), at.end());
    return r;
  };
  set_num_threads(1);
  auto one = run();
  set_num_threads(2);
  auto two = run();
  set_num_threads(3);
  auto three = run();
  set_num_threads(0);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
}

TEST(Forward, EmptyTensorsFlowThroughEveryOpFamily) {
  // Zero-sized dimensions must give empty results (or the reduction identity), never a crash.
  Tensor e = param(zeros(Shape{0, 8}));
  Tensor w = param(ones(Shape{8}));
  std::vector<Tensor> outs = {exp(e), add(e, w), rms_norm(e, w), layer_norm(e, w, w), l2_norm(e), softmax(e),
                              log_softmax(e), gelu(e), matmul(e, randn_t(Shape{8, 3}, 1)), linear(e, randn_t(Shape{5, 8}, 2)),
                              transpose(e), concat({e, e}, 0), slice(e, 1, 2, 4), cast(e, DType::BF16),
                              get_rows(randn_t(Shape{4, 8}, 3), zeros(Shape{0}, DType::I32)), sum(e, 0), max(e, 1)};
  for (const Tensor& o : outs) EXPECT_EQ(o.numel() == 0 || o.shape() == Shape{8}, true) << describe(o);
  EXPECT_EQ(sum(e).item(), 0.0);
  EXPECT_EQ(sum(e, 0).to_f32_vector(), std::vector<float>(8, 0.0f));
  EXPECT_EQ(cross_entropy(zeros(Shape{0, 5}), zeros(Shape{0}, DType::I32)).item(), 0.0);
  Tensor q = param(zeros(Shape{1, 0, 2, 4}));
  EXPECT_EQ(attention(q, q, q).numel(), 0);
  EXPECT_EQ(rope(q, zeros(Shape{0}, DType::I32)).numel(), 0);
  // Backward through empty tensors gives empty (or zero) gradients.
  sum(mul(rms_norm(e, w), e)).backward();
  EXPECT_EQ(e.grad().numel(), 0);
  EXPECT_EQ(w.grad().to_f32_vector(), std::vector<float>(8, 0.0f));
  EXPECT_EQ(matmul(zeros(Shape{2, 0}), zeros(Shape{0, 3})).to_f32_vector(), std::vector<float>(6, 0.0f));
}

TEST(Forward, SizeOneDimensionsBroadcastEverywhere) {
  Tensor x = randn_t(Shape{1, 5, 1}, 10), y = randn_t(Shape{3, 1, 4}, 11);
  Tensor s = add(x, y);
  ASSERT_EQ(s.shape(), (Shape{3, 5, 4}));
  std::vector<double> xv = to_double(x), yv = to_double(y), ref;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 4; ++k) ref.push_back(xv[size_t(j)] + yv[size_t(i * 4 + k)]);
  EXPECT_TRUE(close(s, ref, 1e-6, 1e-7));
  EXPECT_EQ(rms_norm(randn_t(Shape{1, 1, 1}, 12)).numel(), 1);
  EXPECT_EQ(softmax(randn_t(Shape{4, 1}, 13)).to_f32_vector(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(matmul(randn_t(Shape{1, 1}, 14), randn_t(Shape{1, 1}, 15)).numel(), 1);
}

// attention_decode (batched decoding): each row equals that sequence's query alone through
// attention, bit for bit — sequences of 1 to 300 keys, GQA, a head dim with an 8-lane tail,
// a sliding window, and F16 keys and values (an F16 cache) against their F32 widening.
// D = 36: the scores' scalar tail past the last 8 lanes (and Dv = 44: the values').
TEST(Forward, AttentionDecodeEqualsEachSequenceAlone) {
  const std::vector<int64_t> lengths = {1, 7, 33, 300, 64};
  const int64_t N = int64_t(lengths.size()), H = 6, Hkv = 2;
  AttentionOptions win;
  win.window = 16;
  for (int64_t D : {int64_t(64), int64_t(36)})
    for (const AttentionOptions& o : {AttentionOptions{}, win})
      for (DType kv : {DType::F32, DType::F16}) {
        SCOPED_TRACE("D " + std::to_string(D) + " window " + std::to_string(o.window) + " " + std::string(name(kv)));
        Tensor q = randn_t(Shape{N, 1, H, D}, 170);
        std::vector<Tensor> ks, vs;
        for (int64_t i = 0; i < N; ++i) {
          ks.push_back(cast(randn_t(Shape{1, lengths[size_t(i)], Hkv, D}, 171 + uint64_t(i)), kv));
          vs.push_back(cast(randn_t(Shape{1, lengths[size_t(i)], Hkv, D + 8}, 181 + uint64_t(i)), kv));
        }
        const std::vector<float> all = attention_decode(q, ks, vs, o).to_f32_vector();
        ASSERT_EQ(all.size(), size_t(N * H * (D + 8)));
        for (int64_t i = 0; i < N; ++i) {
          const std::vector<float> alone =
              attention(slice(q, 0, i, i + 1), cast(ks[size_t(i)], DType::F32), cast(vs[size_t(i)], DType::F32), o)
                  .to_f32_vector();
          const size_t row = size_t(H * (D + 8));
          for (size_t j = 0; j < row; ++j)
            ASSERT_EQ(std::bit_cast<uint32_t>(all[size_t(i) * row + j]), std::bit_cast<uint32_t>(alone[j]))
                << "sequence " << i << " element " << j;
        }
      }
}

TEST(Forward, AttentionAcrossSeveralKeyChunks) {
  // More than 256 keys: the forward's online softmax spans several key chunks.
  Tensor q = randn_t(Shape{1, 300, 2, 8}, 150), k = randn_t(Shape{1, 600, 1, 8}, 151), v = randn_t(Shape{1, 600, 1, 4}, 152);
  const float sc = 1.0f / std::sqrt(8.0f);
  EXPECT_TRUE(close(attention(q, k, v), attention_ref(q, k, v, true, {}, sc), 1e-5, 1e-4));
  AttentionOptions nc;
  nc.causal = false;
  EXPECT_TRUE(close(attention(q, k, v, nc), attention_ref(q, k, v, false, {}, sc), 1e-5, 1e-4));
  // Gradients across chunks against the composed ops (autograd through matmul/softmax).
  Tensor qq = param(randn_t(Shape{1, 520, 1, 4}, 153)), kk = param(randn_t(Shape{1, 520, 1, 4}, 154)),
         vv = param(randn_t(Shape{1, 520, 1, 4}, 155));
  Tensor g = randn_t(Shape{1, 520, 1, 4}, 156);
  auto fused = grad(mul(attention(qq, kk, vv), g), {qq, kk, vv}, ones(Shape{1, 520, 1, 4}));
  Tensor qh = permute(qq, {0, 2, 1, 3}), kh = permute(kk, {0, 2, 1, 3}), vh = permute(vv, {0, 2, 1, 3});
  Tensor o = permute(matmul(softmax(diag_mask_inf(matmul(qh, kh, false, true)), 0.5f), vh), {0, 2, 1, 3});
  auto composed = grad(mul(o, g), {qq, kk, vv}, ones(Shape{1, 520, 1, 4}));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(close(fused[size_t(i)], composed[size_t(i)], 1e-5, 1e-4)) << i;
}

// linear with a weight kept in its stored dtype (F16, BF16, GGUF blocks) equals linear with
// that weight widened to f32 (for block types, of the activations rounded as llama.cpp rounds
// them) — forward (one row: decoding; many rows: a prompt) and the gradient to x and the bias;
// the stored weight itself cannot train.
TEST(Forward, LinearWithStoredWeightsMatchesTheWidenedWeight) {
  for (DType dt : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                   DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    Tensor w = cast(randn_t(Shape{70, 256}, 3, 0.2f), dt);  // 70 rows: a partial tile of 64
    Tensor wide = cast(w, DType::F32);
    Tensor b = randn_t(Shape{70}, 4);
    for (int64_t rows : {int64_t(1), int64_t(15)}) {
      if (rows <= cpu::kGemvMaxRows && cpu::gemv_blocks_supports(dt)) continue;  // see the next test
      Tensor x = param(randn_t(Shape{rows, 256}, 5));
      // Stored weights see the activations rounded as llama.cpp rounds them (f16, bf16, 8-bit
      // blocks: tested below); the gradient to x passes straight through that rounding.
      Tensor x2 = param(randn_t(Shape{rows, 256}, 5));
      if (cpu::rounds_activations(dt)) {
        std::vector<float> xr(size_t(rows * 256));
        cpu::round_activations(dt, x.data<float>(), rows * 256, xr.data());
        x2 = param(from_vector(xr, Shape{rows, 256}));
      }
      Tensor y = linear(x, w, b), y_ref = linear(x2, wide, b);
      EXPECT_TRUE(close(y, y_ref, 1e-5, 1e-4));
      backward(sum(square(y)));
      backward(sum(square(y_ref)));
      EXPECT_TRUE(close(x.grad(), x2.grad(), 1e-4, 1e-4));
    }
    Tensor trainable = cast(w, dt);
    if (is_block(dt)) {
      EXPECT_THROW(trainable.requires_grad_(), Error);
    } else {
      // An F16/BF16 weight may train (mixed precision: the rounding of an F32 master); its
      // gradient is g^T times the activations rounded as the forward rounded them.
      trainable.requires_grad_();
      Tensor x = randn_t(Shape{2, 256}, 6);
      backward(sum(linear(x, trainable)));
      ASSERT_TRUE(trainable.grad().defined());
      std::vector<float> xr(512);
      cpu::round_activations(dt, x.data<float>(), 512, xr.data());
      const std::vector<float> got = cast(trainable.grad(), DType::F32).to_f32_vector();
      for (int64_t r = 0; r < 70; ++r)
        for (int64_t k = 0; k < 256; ++k) {
          const float want = xr[size_t(k)] + xr[size_t(256 + k)];
          ASSERT_NEAR(got[size_t(r * 256 + k)], want, 0.01 * std::fabs(want) + 1e-3) << r << "," << k;
        }
    }
  }
}

// Activations are rounded for block products exactly as llama.cpp's quantize_row_q8_0 (AVX2:
// q = round-to-even(x * 127 / amax), scale amax / 127 stored as f16) and quantize_row_q8_K
// (per 256: the first value of largest magnitude, with its sign, maps to -127; q capped at
// 127; scale its reciprocal factor), written out here from their published formulas.
TEST(Forward, ActivationsAreRoundedAsLlamaCppRoundsThem) {
  const int64_t K = 1024;
  std::vector<float> x = randn_t(Shape{K}, 41, 2.0f).to_f32_vector();
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
  x[600] = -9.0f, x[700] = 9.0f;                     // largest magnitude twice: the first (negative) decides
  x[800] = -7.5f;                                     // a block whose largest value is negative
  for (DType dt : {DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    std::vector<float> d(static_cast<size_t>(K / 32));
    std::vector<int8_t> q(static_cast<size_t>(K));
    std::vector<int16_t> s16(static_cast<size_t>(K / 16));
    cpu::quantize_activations(dt, x.data(), K, d.data(), q.data(), s16.data());
    const int64_t block = dt == DType::Q8_0 ? 32 : 256;
    for (int64_t b0 = 0; b0 < K; b0 += block) {
      float amax = 0, max = 0;
      for (int64_t j = b0; j < b0 + block; ++j)
        if (std::fabs(x[size_t(j)]) > amax) amax = std::fabs(x[size_t(j)]), max = x[size_t(j)];
      float want_d = 0, mul = 0;
      if (dt == DType::Q8_0) {
        want_d = to_f32(from_f32<f16>(amax / 127.0f));
        mul = amax != 0.0f ? 127.0f / amax : 0.0f;
      } else if (amax != 0.0f) {
        mul = -127.0f / max;
        want_d = 1.0f / mul;
      }
      for (int64_t j = b0; j < b0 + block; ++j) {
        ASSERT_EQ(d[size_t(j / 32)], want_d) << j;
        const int want_q = std::min(127, int(std::nearbyint(mul * x[size_t(j)])));
        ASSERT_EQ(int(q[size_t(j)]), want_q) << j;
      }
    }
  }
  // The K types of the prompt path round the same way (f32 values d * q).
  std::vector<float> r(static_cast<size_t>(K));
  cpu::round_activations(DType::Q6_K, x.data(), K, r.data());
  std::vector<float> d(static_cast<size_t>(K / 32));
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<int16_t> s16(static_cast<size_t>(K / 16));
  cpu::quantize_activations(DType::Q6_K, x.data(), K, d.data(), q.data(), s16.data());
  for (int64_t j = 0; j < K; ++j) ASSERT_EQ(r[size_t(j)], d[size_t(j / 32)] * float(q[size_t(j)])) << j;
  EXPECT_EQ(q[600], -127);
  EXPECT_EQ(q[700], 127);
}

// The K types' decode products are llama.cpp's AVX2 arithmetic (ggml's vec_dot_q{2..6}_K_q8_K),
// written out here as plain loops over the documented block layouts: per
// super-block of 256, lane k (0..7) of an exact integer sum takes bytes 4k..4k+3 of every
// 32-value run times its scale; one fma by d_x * d_w per lane; the lanes summed in hsum's
// order (k + 4, then halves, then pairs); Q4_K's mins as 4 lanes of min * activation sum in
// their own fma accumulator, by -d_x * dmin, added last ((0 + 2) + (1 + 3)); Q5_K's (a fifth
// bit per value from qh) summed in integers, one scalar fma a super-block. Bit for bit, so
// a K-quant model decodes to llama.cpp's numbers from the same activations — except Q6_K,
// whose 32s come off per sub-block in lane k (not inside each lane as llama.cpp's AVX2 does):
// the same total, possibly other last bits; pinned here as toy computes it.
TEST(Forward, KQuantDecodeProductsAreLlamaCppsAvx2ArithmeticBitForBit) {
  const int64_t K = 768, out = 6;
  auto half = [](const uint8_t* p) {
    f16 h;
    std::memcpy(&h.bits, p, 2);
    return to_f32(h);
  };
  auto hsum8 = [](const float* a) {
    float r[4];
    for (int i = 0; i < 4; ++i) r[i] = a[i] + a[i + 4];
    return (r[0] + r[2]) + (r[1] + r[3]);
  };
  for (DType dt : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    const Tensor w = stored_weight(dt, out, K, 23, 0.3f);
    const auto* wp = static_cast<const uint8_t*>(w.raw_data());
    const size_t rb = row_bytes(dt, K);
    for (uint64_t seed : {24, 25}) {
      const Tensor x = randn_t(Shape{1, K}, seed, 2.0f);
      const std::vector<float> xv = x.to_f32_vector();
      std::vector<float> d(static_cast<size_t>(K / 32));
      std::vector<int8_t> q(static_cast<size_t>(K));
      std::vector<int16_t> s16(static_cast<size_t>(K / 16));
      cpu::quantize_activations(dt, xv.data(), K, d.data(), q.data(), s16.data());
      // Both compiled forms (AVX2; AVX-512VL where this CPU has it) must give these bits.
      const bool avx512 = cpu::avx512_forms();
      cpu::use_avx512_forms(false);
      const std::vector<float> y_avx2 = linear(x, w).to_f32_vector();
      cpu::use_avx512_forms(avx512);
      const std::vector<float> y = linear(x, w).to_f32_vector();
      EXPECT_EQ(y, y_avx2);
      for (int64_t r = 0; r < out; ++r) {
        float acc[8] = {}, acc_m[4] = {}, summs = 0.0f;
        for (int64_t sb = 0; sb < K / 256; ++sb) {
          const uint8_t* b = wp + size_t(r) * rb + size_t(sb) * (dt == DType::Q2_K   ? 84
                                                                     : dt == DType::Q3_K ? 110
                                                                     : dt == DType::Q4_K ? 144
                                                                     : dt == DType::Q5_K ? 176
                                                                                         : 210);
          const int8_t* xq = q.data() + sb * 256;
          const int16_t* bs = s16.data() + sb * 16;
          const float xd = d[size_t(sb * 8)];
          int64_t sumi[8] = {};
          if (dt == DType::Q4_K || dt == DType::Q5_K) {
            const bool five = dt == DType::Q5_K;
            int sc[8], mn[8];
            for (int j = 0; j < 8; ++j) {
              const uint8_t* s = b + 4;
              sc[j] = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
              mn[j] = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
            for (int j = 0; j < 8; ++j)      // sub-block j: nibbles of bytes 32 (j / 2) .. + 31
              for (int i = 0; i < 32; ++i) {  // (low for even j, high for odd); Q5_K: plus 16 x bit j of qh[i]
                const int byte = b[(five ? 48 : 16) + 32 * (j / 2) + i];
                const int value = (j % 2 ? byte >> 4 : byte & 15) + (five ? 16 * (b[16 + i] >> j & 1) : 0);
                sumi[i / 4] += int64_t(sc[j]) * (value * xq[32 * j + i]);
              }
            int64_t mins_total = 0;
            for (int t = 0; t < 4; ++t) {
              const int64_t prod = int64_t(mn[2 * t]) * (bs[4 * t] + bs[4 * t + 1]) +
                                   int64_t(mn[2 * t + 1]) * (bs[4 * t + 2] + bs[4 * t + 3]);
              if (five)
                mins_total += prod;  // (Q5_K: the 4 lanes summed in integers, one scalar fma)
              else
                acc_m[t] = std::fma(-xd * half(b + 2), float(prod), acc_m[t]);
            }
            if (five) summs = std::fma(-xd * half(b + 2), float(mins_total), summs);
            for (int k = 0; k < 8; ++k) acc[k] = std::fma(xd * half(b), float(sumi[k]), acc[k]);
          } else if (dt == DType::Q2_K) {
            // (the mins first, into the same lanes: lane k = min_2k bsum_2k + min_2k+1 bsum_2k+1)
            for (int k = 0; k < 8; ++k) {
              const int64_t m = int64_t(b[2 * k] >> 4) * bs[2 * k] + int64_t(b[2 * k + 1] >> 4) * bs[2 * k + 1];
              acc[k] = std::fma(-xd * half(b + 82), float(m), acc[k]);
            }
            for (int e = 0; e < 256; ++e) {
              const int j = e / 128, r = (e % 128) / 32, i = e % 32;
              const int value = b[16 + 32 * j + i] >> (2 * r) & 3;
              sumi[i / 4] += int64_t(b[e / 16] & 15) * (value * xq[e]);
            }
            for (int k = 0; k < 8; ++k) acc[k] = std::fma(xd * half(b + 80), float(sumi[k]), acc[k]);
          } else if (dt == DType::Q3_K) {
            for (int e = 0; e < 256; ++e) {  // element e: run r = (e % 128) / 32 of half j = e / 128
              const int j = e / 128, r = (e % 128) / 32, i = e % 32, idx = e / 16;
              const int value = (b[32 + 32 * j + i] >> (2 * r) & 3) - ((b[i] >> (4 * j + r) & 1) ? 0 : 4);
              const int sc = ((b[96 + idx % 8] >> (4 * (idx / 8)) & 15) | (b[104 + idx % 4] >> (2 * (idx / 4)) & 3) << 4) - 32;
              sumi[i / 4] += int64_t(sc) * (value * xq[e]);
            }
            for (int k = 0; k < 8; ++k) acc[k] = std::fma(xd * half(b + 108), float(sumi[k]), acc[k]);
          } else {
            const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
            for (int e = 0; e < 256; ++e) {  // element e: run r = e / 32 of half e / 128
              const int h = e / 128, rr = (e % 128) / 32, i = e % 32;
              const int lo = b[64 * h + 32 * (rr % 2) + i] >> (rr >= 2 ? 4 : 0) & 15;
              const int hi = b[128 + 32 * h + i] >> (2 * rr) & 3;
              sumi[i / 4] += int64_t(sc[e / 16]) * ((lo | hi << 4) * xq[e]);
            }
            for (int k = 0; k < 8; ++k)
              sumi[k] -= 32 * (int64_t(bs[2 * k]) * sc[2 * k] + int64_t(bs[2 * k + 1]) * sc[2 * k + 1]);
            for (int k = 0; k < 8; ++k) acc[k] = std::fma(xd * half(b + 208), float(sumi[k]), acc[k]);
          }
        }
        const float want = dt == DType::Q4_K   ? hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
                           : dt == DType::Q5_K ? hsum8(acc) + summs
                                               : hsum8(acc);
        EXPECT_EQ(y[size_t(r)], want) << "row " << r << " seed " << seed;
      }
    }
  }
}

// The decode path (up to kGemvMaxRows rows; F16, BF16, Q8_0, Q4_0, Q5_0, Q2_K..Q6_K read
// straight from the blocks): F16/BF16 equal the widened product of the activations rounded to
// f16 / bf16 (as llama.cpp converts them; off by at most half an ulp each); the block types round the
// activations to 8-bit blocks first, as llama.cpp does, so they are checked twice: against
// the product of the rounded activations and the widened weight computed in double (only
// summation order differs: 1e-5), and against the f32 product within the bound the rounding
// implies — each activation moves by at most half its block's step d / 2, plus, for Q8_0's
// f16 scale, 2^-11 d for each of up to 127 steps: |y - y_f32| <= sum_k |w_k| d_k (1/2 + 127/2048).
TEST(Forward, LinearDecodePathReadsBlocksDirectly) {
  for (DType dt : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                   DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    ASSERT_TRUE(cpu::gemv_blocks_supports(dt));
    const int64_t K = 512, out = 37;
    Tensor w = stored_weight(dt, out, K, 13, 0.2f);
    const std::vector<float> wv = cast(w, DType::F32).to_f32_vector();
    Tensor b = randn_t(Shape{out}, 14);
    const std::vector<float> bv = b.to_f32_vector();
    // (20 rows: the prompt path, f32 products of the rounded activations — the same numbers.)
    for (int64_t rows : {int64_t(1), int64_t(3), cpu::kGemvMaxRows, int64_t(20)}) {
      Tensor x = randn_t(Shape{rows, K}, 15 + uint64_t(rows), 1.5f);
      const std::vector<float> xv = x.to_f32_vector();
      const std::vector<float> y = linear(x, w, b).to_f32_vector();
      for (int64_t n = 0; n < rows; ++n) {
        std::vector<float> d(static_cast<size_t>(K / 32));
        std::vector<int8_t> q(static_cast<size_t>(K));
        std::vector<int16_t> s16(static_cast<size_t>(K / 16));
        cpu::quantize_activations(dt, xv.data() + n * K, K, d.data(), q.data(), s16.data());
        for (int64_t i = 0; i < K / 16; ++i) {
          int s = 0;
          for (int j = 0; j < 16; ++j) s += q[size_t(16 * i + j)];
          ASSERT_EQ(s, s16[size_t(i)]);
        }
        for (int64_t r = 0; r < out; ++r) {
          double exact = bv[size_t(r)], rounded = bv[size_t(r)], bound = 0, scale = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double wk = wv[size_t(r * K + k)], xk = xv[size_t(n * K + k)];
            exact += wk * xk;
            if (is_block(dt))
              rounded += wk * double(d[size_t(k / 32)]) * double(q[size_t(k)]);
            else  // F16 / BF16 weights: the activation rounded to that type
              rounded += wk * double(dt == DType::F16 ? to_f32(from_f32<f16>(float(xk))) : to_f32(from_f32<bf16>(float(xk))));
            bound += std::fabs(wk * double(d[size_t(k / 32)])) * (0.5 + 127.0 / 2048);  // (Q8_K scales may be negative)
            scale += std::fabs(wk * xk);
          }
          const double got = y[size_t(n * out + r)];
          if (!is_block(dt)) {
            EXPECT_NEAR(got, rounded, 1e-5 * scale) << n << "," << r;
            EXPECT_LE(std::fabs(got - exact), (dt == DType::F16 ? 0x1p-11 : 0x1p-8) * scale) << n << "," << r;
          } else {
            EXPECT_NEAR(got, rounded, 1e-5 * scale) << n << "," << r;
            EXPECT_LE(std::fabs(got - exact), bound + 1e-5 * scale) << n << "," << r;
          }
        }
      }
    }
  }
  // Several rows at once (sequences decoding together, `toy serve`) give each row exactly the
  // bits it gets alone, whatever the row count and with an odd number of blocks (K = 544).
  for (DType dt : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q5_0}) {
    SCOPED_TRACE(std::string(name(dt)) + " rows together");
    Tensor w = cast(randn_t(Shape{29, 544}, 17, 0.2f), dt);
    for (int64_t rows = 2; rows <= cpu::kGemvMaxRows; ++rows) {
      Tensor x = randn_t(Shape{rows, 544}, 30 + uint64_t(rows), 1.5f);
      const std::vector<float> together = linear(x, w).to_f32_vector();
      for (int64_t n = 0; n < rows; ++n) {
        const std::vector<float> alone = linear(contiguous(slice(x, 0, n, n + 1)), w).to_f32_vector();
        for (int64_t r = 0; r < 29; ++r)
          ASSERT_EQ(together[size_t(n * 29 + r)], alone[size_t(r)]) << rows << " rows, row " << n << ", output " << r;
      }
    }
  }
  // A non-finite activation poisons its outputs as in f32, instead of vanishing in the rounding.
  for (bool vnni : {false, true}) {
    cpu::gemv_use_vnni(vnni);
    Tensor w = cast(randn_t(Shape{4, 64}, 16, 0.2f), DType::Q8_0);
    std::vector<float> xv(64, 1.0f);
    xv[40] = NAN;
    const std::vector<float> y = linear(from_vector(xv, Shape{1, 64}), w).to_f32_vector();
    for (float v : y) EXPECT_TRUE(std::isnan(v));
  }
  cpu::gemv_use_vnni(true);
}

// K-quant products give a row the bits it gets decoding alone, whatever the number of rows
// (1..4 a tile, tails of a group) — through the decode path (up to kGemvMaxRows rows) and,
// where the kernel variant is avx512, through prompts (integer tiles; 20 and 37 rows) — in
// both compiled forms (AVX2's 16 registers, AVX-512VL's 32). With the integer tiles turned off,
// prompts take SGEMM over widened tiles: close, not equal.
TEST(Forward, KQuantRowsTogetherGetTheBitsOfEachRowAlone) {
  const bool avx512 = cpu::avx512_forms();
  for (DType dt : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const Tensor w = stored_weight(dt, 23, 512, 19, 0.2f);
    for (bool wide : {false, true}) {
      if (wide && !avx512) continue;
      cpu::use_avx512_forms(wide);
      for (int64_t rows : {int64_t(2), int64_t(5), cpu::kGemvMaxRows, int64_t(20), int64_t(37)}) {
        SCOPED_TRACE(fmt::format("{} {} rows, {} form", name(dt), rows, wide ? "avx512" : "avx2"));
        const Tensor x = randn_t(Shape{rows, 512}, 50 + uint64_t(rows), 1.5f);
        const std::vector<float> together = linear(x, w).to_f32_vector();
        const bool integer = rows <= cpu::kGemvMaxRows || cpu::kquant_for_prompts();
        EXPECT_EQ(integer, rows <= cpu::kGemvMaxRows || wide);
        for (int64_t n = 0; n < rows; ++n) {
          const std::vector<float> alone = linear(contiguous(slice(x, 0, n, n + 1)), w).to_f32_vector();
          for (int64_t r = 0; r < 23; ++r) {
            if (integer)
              ASSERT_EQ(together[size_t(n * 23 + r)], alone[size_t(r)]) << "row " << n << ", output " << r;
            else
              ASSERT_NEAR(together[size_t(n * 23 + r)], alone[size_t(r)], 1e-4f * (1 + std::fabs(alone[size_t(r)])));
          }
        }
      }
    }
    cpu::use_avx512_forms(avx512);
  }
  if (!avx512) std::puts("NOTE: this CPU has no AVX-512: the prompt tiles were not run (SGEMM instead)");
  // The hook: integer tiles off, prompts through SGEMM.
  cpu::kquant_use_for_prompts(false);
  EXPECT_FALSE(cpu::kquant_for_prompts());
  cpu::kquant_use_for_prompts(true);
}

// Q8_0 products on a CPU with VNNI (vpdpbusd on the weights offset to unsigned) give the bits
// of the AVX2 kernels, for every row count, an odd block count, weight bytes of -128 (legal
// in a Q8_0 file, though our quantizer never writes them) and activations at +-127.
TEST(Forward, Q8_0ProductsWithVnniEqualTheAvx2OnesBitForBit) {
  if (!cpu::gemv_vnni_available()) GTEST_SKIP() << "this CPU has no VNNI (AVX-VNNI or AVX512-VNNI with VL)";
  Tensor w = cast(randn_t(Shape{29, 544}, 18, 0.2f), DType::Q8_0);
  auto* raw = static_cast<uint8_t*>(const_cast<void*>(w.raw_data()));
  const size_t rb = 544 / 32 * 34;
  for (int64_t r = 0; r < 29; r += 3)
    for (int64_t b = 0; b < 544 / 32; b += 2) raw[size_t(r) * rb + size_t(b) * 34 + 2 + size_t((r + b) % 32)] = 0x80;
  for (int64_t rows = 1; rows <= cpu::kGemvMaxRows; ++rows) {
    std::vector<float> xv = randn_t(Shape{rows, 544}, 40 + uint64_t(rows), 1.5f).to_f32_vector();
    for (size_t i = 0; i < xv.size(); i += 37) xv[i] = (i % 2 ? 40.0f : -40.0f);  // a block's largest: q = +-127
    const Tensor x = from_vector(xv, Shape{rows, 544});
    cpu::gemv_use_vnni(false);
    const std::vector<float> avx2 = linear(x, w).to_f32_vector();
    cpu::gemv_use_vnni(true);
    const std::vector<float> vnni = linear(x, w).to_f32_vector();
    for (size_t i = 0; i < avx2.size(); ++i) ASSERT_EQ(vnni[i], avx2[i]) << rows << " rows, value " << i;
  }
}
