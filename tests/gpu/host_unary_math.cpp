// The CUDA unary kernels' per-element math (backend/cuda/unary_math.h), run on the host and
// checked against the CPU kernels on any machine (no GPU needed).
//  - Unary ops and their gradients over a grid of values that includes ±0, subnormals, the
//    CPU's thresholds (0.0625, 20, -87.34, 88.72), huge values, ±inf and NaN, with finite,
//    zero, infinite and NaN upstream gradients: NaN where the CPU gives NaN, the same infinity
//    where it gives one, otherwise |got - want| <= kRel * max(|want|, terms) + kAbs.
//    kRel = 2e-6: the CPU's vector exp/log (inside sigmoid, silu and the GELUs) are a few ulp
//    from libm's (the largest difference seen is 4.6e-7 relative, in gelu_tanh's gradient).
//    `terms` is the size of what a result was summed from, where that sum cancels: the CPU's
//    tanh past |x| = 0.0625 is 2 sigmoid(2x) - 1 (size 1; up to 1.4e-6 relative apart from
//    tanhf near there), the silu and gelu gradients s + x s (1 - s) near their roots, and
//    1 - y^2 in tanh's. kAbs = 1e-37 (below FLT_MIN): for subnormal results only the absolute
//    size means anything.
//  - Philox4x32-10 equals core/rng.cpp's bit for bit; the uniform, normal (Box-Muller) and
//    dropout transforms give rand's and dropout's exact bits, the normal one randn's within an
//    ulp or two (its log and cos are taken in double; the CPU's are the C library's floats).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "toy/backend/cuda/unary_math.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"
#include "toy/core/rng.h"
#include "toy/core/tensor.h"
#include "toy/ops/ops.h"

using namespace toy;
namespace um = toy::cuda::umath;

namespace {

constexpr double kRel = 2e-6, kAbs = 1e-37;

const KernelRef<kern::Unary> k_unary("unary");
const KernelRef<kern::UnaryBackward> k_unary_bwd("unary_backward");

const char* const kOpNames[um::kNumOps] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "square", "abs", "tanh",
    "sigmoid", "relu", "silu", "gelu_tanh", "gelu_erf", "scale", "clamp", "softplus"};

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// ±0, subnormals, the CPU's thresholds and their neighbours, huge values, ±inf, NaN; a dense
// sweep of [-25, 25]; magnitudes 1e-40 .. 1e38 of both signs.
std::vector<float> value_grid() {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
                          1e-45f, -1e-45f};
  for (float m : {1e-30f, 1e-10f, 1e-6f, 1e-3f, 0.0625f, 0.1f, 0.5f, 0.75f, 1.0f, 1.2785f, 2.0f, 3.0f, 5.0f, 9.0f,
                  10.0f, 13.0f, 13.5f, 19.99f, 20.0f, 20.01f, 30.0f, 40.0f, 50.0f, 80.0f, 87.3365402f, 87.34f, 88.0f,
                  88.7228394f, 89.0f, 100.0f, 103.9f, 104.0f, 1e4f, 1e6f, 1e12f, 1e20f, 1e30f}) {
    for (float s : {1.0f, -1.0f}) {
      v.push_back(s * m);
      v.push_back(std::nextafter(s * m, INFINITY));
      v.push_back(std::nextafter(s * m, -INFINITY));
    }
  }
  for (int i = 0; i <= 4000; ++i) v.push_back(-25.0f + 50.0f * float(i) / 4000.0f);
  for (int e = -40; e <= 38; ++e)
    for (float m : {1.0f, 3.7f}) {
      v.push_back(m * std::pow(10.0f, float(e)));
      v.push_back(-m * std::pow(10.0f, float(e)));
    }
  return v;
}

um::Params params_for(um::Op op) {
  um::Params p;
  if (op == um::Op::Scale) p.alpha = -1.75f;
  if (op == um::Op::Clamp) p.lo = -2.5f, p.hi = 3.0f;
  return p;
}
kern::UnaryArgs args_of(const um::Params& p) {
  kern::UnaryArgs a;
  a.alpha = p.alpha, a.lo = p.lo, a.hi = p.hi;
  return a;
}

std::vector<float> cpu_forward(um::Op op, const std::vector<float>& x, const um::Params& p) {
  Tensor xt = from_vector(x, Shape{int64_t(x.size())});
  Tensor y = empty(xt.shape());
  k_unary(Device::CPU)(kern::UnaryOp(int(op)), xt, y, args_of(p));
  return y.to_f32_vector();
}

std::vector<float> cpu_backward(um::Op op, const std::vector<float>& x, const std::vector<float>& y,
                                const std::vector<float>& g, const um::Params& p) {
  const Shape s{int64_t(x.size())};
  Tensor dx = empty(s);
  k_unary_bwd(Device::CPU)(kern::UnaryOp(int(op)), from_vector(x, s), from_vector(y, s), from_vector(g, s), dx,
                           args_of(p));
  return dx.to_f32_vector();
}

// Whether got stands for want: NaN for NaN, the same infinity, else within the bound, where
// `scale` is the size of the terms the result was summed from (|want| when none cancel).
bool agrees(float got, float want, double scale) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  if (std::isnan(got) || std::isinf(got)) return false;
  return std::fabs(double(got) - double(want)) <= kRel * std::max(std::fabs(double(want)), scale) + kAbs;
}

// The size of the terms a gradient sums before g scales it, in double (0: no sum).
double gradient_terms(um::Op op, float xf) {
  const double x = xf, ax = std::fabs(x);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  switch (op) {
    case um::Op::Silu: return sig(x) + ax * sig(x) * sig(-x);  // s + x s (1 - s)
    case um::Op::GeluTanh: {
      const double u2 = 2 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
      return sig(u2) + ax * sig(u2) * sig(-u2) * 2 * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
    }
    case um::Op::GeluErf:  // Phi + x phi
      return 0.5 * std::erfc(-x / std::sqrt(2.0)) + ax * 0.3989422804014327 * std::exp(-0.5 * x * x);
    case um::Op::Tanh: return 1.0;  // 1 - y^2, from a y that carries the CPU's error
    default: return 0.0;
  }
}

std::string show(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", double(x), bits(x));
  return buf;
}

}  // namespace

TEST(CudaMath, UnaryForwardMatchesTheCpuKernel) {
  const std::vector<float> x = value_grid();
  for (int o = 0; o < um::kNumOps; ++o) {
    const um::Op op = um::Op(o);
    const um::Params p = params_for(op);
    const std::vector<float> want = cpu_forward(op, x, p);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = um::unary_forward(op, x[i], p);
      // (past |x| = 0.0625 the CPU's tanh is 2 sigmoid(2x) - 1: terms of size 1)
      const double terms = op == um::Op::Tanh && std::fabs(x[i]) >= 0.0625f ? 1.0 : 0.0;
      if (!agrees(got, want[i], terms) && ++bad <= 5)
        ADD_FAILURE() << kOpNames[o] << "(" << show(x[i]) << "): cpu " << show(want[i]) << ", cuda math "
                      << show(got);
    }
    EXPECT_EQ(bad, 0) << kOpNames[o];
  }
}

TEST(CudaMath, UnaryForwardKeepsTheCpuSignedZerosAndNaNs) {
  // Spot checks of what the CPU's operand orders and masks give, stated outright.
  const um::Params none;
  EXPECT_EQ(bits(um::unary_forward(um::Op::Neg, 0.0f, none)), 0u);  // 0 - x: +0, not -0
  EXPECT_EQ(bits(um::unary_forward(um::Op::Neg, -0.0f, none)), 0u);
  EXPECT_EQ(bits(um::unary_forward(um::Op::Relu, -0.0f, none)), bits(-0.0f));  // max_ps(0, x) returns x
  EXPECT_TRUE(std::isnan(um::unary_forward(um::Op::Relu, NAN, none)));
  um::Params c;
  c.lo = -1.0f, c.hi = 1.0f;
  EXPECT_TRUE(std::isnan(um::unary_forward(um::Op::Clamp, NAN, c)));
  EXPECT_TRUE(std::isnan(um::unary_forward(um::Op::Silu, -INFINITY, none)));  // -inf * 0
  EXPECT_EQ(um::unary_forward(um::Op::Silu, INFINITY, none), INFINITY);
  EXPECT_EQ(bits(um::unary_forward(um::Op::Sigmoid, -100.0f, none)), 0u);  // exp_nonpos flushes
  EXPECT_EQ(um::unary_forward(um::Op::Rsqrt, -0.0f, none), -INFINITY);
  for (float v : {0.0f, -0.0f, NAN, INFINITY, -INFINITY, -3.0f}) {
    const std::vector<float> cpu = cpu_forward(um::Op::Neg, {v}, none);
    if (!std::isnan(v)) {
      EXPECT_EQ(bits(um::unary_forward(um::Op::Neg, v, none)), bits(cpu[0])) << v;
    }
    const std::vector<float> relu = cpu_forward(um::Op::Relu, {v}, none);
    if (!std::isnan(v)) {
      EXPECT_EQ(bits(um::unary_forward(um::Op::Relu, v, none)), bits(relu[0])) << v;
    }
  }
}

TEST(CudaMath, UnaryBackwardMatchesTheCpuKernel) {
  const std::vector<float> grid = value_grid();
  // Every grid value with finite gradients of both signs, then each special value of x with
  // each special g (0, ±inf, NaN): the masks (relu, clamp) must give 0 where the CPU does.
  std::vector<float> x, g;
  const float gs[] = {1.0f, -2.5f, 0.375f, 1e-3f, -7.0f};
  for (size_t i = 0; i < grid.size(); ++i) x.push_back(grid[i]), g.push_back(gs[i % 5]);
  for (size_t i = 0; i < 12 + 37 * 6; ++i)
    for (float gv : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f}) x.push_back(grid[i]), g.push_back(gv);
  for (int o = 0; o < um::kNumOps; ++o) {
    const um::Op op = um::Op(o);
    const um::Params p = params_for(op);
    const std::vector<float> y = cpu_forward(op, x, p);
    const std::vector<float> want = cpu_backward(op, x, y, g, p);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = um::unary_backward(op, x[i], y[i], g[i], p);
      if (!agrees(got, want[i], gradient_terms(op, x[i]) * std::fabs(double(g[i]))) && ++bad <= 5)
        ADD_FAILURE() << kOpNames[o] << "'(" << show(x[i]) << ") g " << g[i] << ": cpu " << show(want[i])
                      << ", cuda math " << show(got);
    }
    EXPECT_EQ(bad, 0) << kOpNames[o];
  }
}

TEST(CudaMath, SwigluMatchesTheCpuKernels) {
  const std::vector<float> grid = value_grid();
  std::vector<float> a, b, g;
  for (size_t i = 0; i < grid.size(); ++i) {
    a.push_back(grid[i]);
    b.push_back(i % 3 == 0 ? -1.5f : i % 3 == 1 ? 0.25f : 3.0f);
    g.push_back(i % 2 ? 1.0f : -0.5f);
  }
  const Shape s{int64_t(a.size())};
  Tensor at = from_vector(a, s), bt = from_vector(b, s), gt = from_vector(g, s);
  Tensor out = empty(s), da = empty(s), db = empty(s);
  KernelRef<kern::Swiglu>("swiglu")(Device::CPU)(at, bt, out);
  KernelRef<kern::SwigluBackward>("swiglu_backward")(Device::CPU)(at, bt, gt, da, db);
  // The packed form: rows [a | b], the same values.
  std::vector<float> packed;
  for (size_t i = 0; i < a.size(); ++i) packed.push_back(a[i]);
  for (size_t i = 0; i < b.size(); ++i) packed.push_back(b[i]);
  Tensor xp = from_vector(packed, Shape{1, 2 * s[0]}), outp = empty(Shape{1, s[0]}), dxp = empty(Shape{1, 2 * s[0]});
  KernelRef<kern::SwigluPacked>("swiglu_packed")(Device::CPU)(xp, outp);
  KernelRef<kern::SwigluPackedBackward>("swiglu_packed_backward")(Device::CPU)(xp, reshape(gt, Shape{1, s[0]}), dxp);
  const std::vector<float> o = out.to_f32_vector(), dav = da.to_f32_vector(), dbv = db.to_f32_vector();
  const std::vector<float> op = outp.to_f32_vector(), dxv = dxp.to_f32_vector();
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float f = um::swiglu_forward(a[i], b[i]);
    const um::SwigluGrads d = um::swiglu_backward(a[i], b[i], g[i]);
    const double terms = gradient_terms(um::Op::Silu, a[i]) * std::fabs(double(g[i]) * b[i]);
    const bool ok = agrees(f, o[i], 0.0) && agrees(f, op[i], 0.0) && agrees(d.da, dav[i], terms) &&
                    agrees(d.da, dxv[i], terms) && agrees(d.db, dbv[i], 0.0) && agrees(d.db, dxv[a.size() + i], 0.0);
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << "swiglu at a " << show(a[i]) << " b " << b[i] << " g " << g[i] << ": cpu " << o[i] << " / "
                    << dav[i] << " / " << dbv[i] << ", cuda math " << f << " / " << d.da << " / " << d.db;
  }
  EXPECT_EQ(bad, 0);
}

TEST(CudaMath, PhiloxEqualsTheCpuGeneratorBitForBit) {
  const uint64_t edges[] = {0, 1, 0xffffffffull, 0x100000000ull, 0xdeadbeefcafef00dull, ~0ull};
  int checked = 0;
  for (uint64_t seed : edges)
    for (uint64_t stream : edges)
      for (uint64_t counter : edges) {
        const auto want = philox4x32(seed, stream, counter);
        const um::Philox4 got = um::philox4x32(seed, stream, counter);
        for (int j = 0; j < 4; ++j) ASSERT_EQ(got.w[j], want[j]) << seed << " " << stream << " " << counter;
        ++checked;
      }
  // And a pseudo-random walk over the three 64-bit inputs.
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&] { return s = s * 6364136223846793005ull + 1442695040888963407ull; };
  for (int n = 0; n < 100000; ++n) {
    const uint64_t seed = next(), stream = next(), counter = next() >> (n % 64);
    const auto want = philox4x32(seed, stream, counter);
    const um::Philox4 got = um::philox4x32(seed, stream, counter);
    for (int j = 0; j < 4; ++j) ASSERT_EQ(got.w[j], want[j]) << seed << " " << stream << " " << counter;
    ++checked;
  }
  EXPECT_EQ(checked, 216 + 100000);
}

// The draw's log and cos (double precision, rounded once) against the C library's float
// logf/cosf over every argument Box-Muller can pass them: within one float ulp everywhere, and
// equal on the great majority (glibc's float versions are not correctly rounded for ~1%).
TEST(CudaMath, DrawLogAndCosAreWithinAnUlpOfTheCLibrary) {
  auto ulps = [](float a, float b) { return std::abs(int64_t(bits(a)) - int64_t(bits(b))); };
  int64_t differ = 0, n = 0;
  for (uint32_t k = 1; k <= (1u << 24); k += 7) {
    const float u1 = float(k) * (1.0f / 16777216.0f);
    const int64_t d = ulps(um::log_for_draw(u1), std::log(u1));
    ASSERT_LE(d, 1) << "log(" << show(u1) << "): libm " << show(std::log(u1)) << ", draw " << show(um::log_for_draw(u1));
    differ += d != 0, ++n;
  }
  for (uint32_t j = 0; j < (1u << 24); j += 7) {
    const float x = 6.2831853071795864f * (float(j) * (1.0f / 16777216.0f));
    const int64_t d = ulps(um::cos_for_draw(x), std::cos(x));
    // (near cos's zeros one ulp of a tiny result is a tiny absolute difference)
    ASSERT_TRUE(d <= 1 || std::fabs(um::cos_for_draw(x) - std::cos(x)) < 1e-7f)
        << "cos(" << show(x) << "): libm " << show(std::cos(x)) << ", draw " << show(um::cos_for_draw(x));
    differ += d != 0, ++n;
  }
  EXPECT_LT(double(differ), 0.05 * double(n));
}

TEST(CudaMath, UniformDrawsEqualRandBitForBitAndNormalOnesRandnWithinAnUlpOrTwo) {
  // Odd sizes (a partial last block) and a generator whose offset is not 0.
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1 << 20) + 3}) {
    Generator g(1234 + uint64_t(n), 5);
    g.set_offset(77);
    Generator h = g;
    const uint64_t normal_base = h.reserve(uint64_t(n + 1) / 2);
    Tensor nt = randn(Shape{n}, g, 0.25f, 1.5f);
    const uint64_t uniform_base = h.reserve(uint64_t(n + 3) / 4);
    Tensor ut = rand(Shape{n}, g, -2.0f, 3.0f);
    const std::vector<float> nv = nt.to_f32_vector(), uv = ut.to_f32_vector();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const um::Philox4 bn = um::philox4x32(h.seed(), h.stream(), normal_base + uint64_t(i) / 2);
      const um::Philox4 bu = um::philox4x32(h.seed(), h.stream(), uniform_base + uint64_t(i) / 4);
      const float wn = um::random_element(bn, i, true, 0.25f, 1.5f), wu = um::random_element(bu, i, false, -2.0f, 3.0f);
      const float want_n = nv[size_t(i)];
      const bool normal_close = std::fabs(wn - want_n) <= 4e-7f * std::max(1.0f, std::fabs(want_n));
      if ((!normal_close || bits(wu) != bits(uv[size_t(i)])) && ++bad <= 5)
        ADD_FAILURE() << "element " << i << " of " << n << ": randn " << show(nv[size_t(i)]) << " vs "
                      << show(wn) << ", rand " << show(uv[size_t(i)]) << " vs " << show(wu);
    }
    EXPECT_EQ(bad, 0) << n;
  }
}

TEST(CudaMath, DropoutTransformGivesTheCpuMaskAndScale) {
  Generator base(99, 3);
  const int64_t n = 4099;  // a partial last block
  Tensor x = randn(Shape{n}, base);
  const std::vector<float> xv = x.to_f32_vector();
  for (float p : {0.1f, 0.5f, 0.9f, 1e-9f, 0.999999f}) {
    // A host-addressed generator, and one whose step is a (CPU) device scalar: counters from
    // step * 2^32 either way.
    for (int mode = 0; mode < 2; ++mode) {
      const int32_t step_value = 5;
      Tensor step = from_vector(std::vector<int32_t>{step_value}, Shape{});
      Generator g = mode == 0 ? base.for_micro_batch(step_value, 2) : base.for_micro_batch(step, 2);
      const uint64_t offset = g.offset();
      const std::vector<float> y = dropout(x, p, true, g).to_f32_vector();
      const uint64_t counter =
          mode == 0 ? offset : um::dropout_counter(offset, true, step.to_i32_vector()[0]);
      const uint32_t threshold = um::dropout_threshold(p);
      const float scale = um::dropout_scale(p);
      int bad = 0, kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const um::Philox4 u = um::philox4x32(g.seed(), g.stream(), counter + uint64_t(i) / 4);
        const float want = um::dropout_element(xv[size_t(i)], u.w[i % 4], threshold, scale);
        kept += want != 0.0f;
        if (bits(want) != bits(y[size_t(i)]) && ++bad <= 5)
          ADD_FAILURE() << "p " << p << " element " << i << ": cpu " << show(y[size_t(i)]) << ", cuda math "
                        << show(want);
      }
      EXPECT_EQ(bad, 0) << "p " << p << " mode " << mode;
      EXPECT_NEAR(double(kept) / double(n), 1.0 - double(p), 0.05) << p;
    }
  }
}

TEST(CudaMath, DropoutKeepsAnElementWhoseWordEqualsTheThreshold) {
  // p = u 2^-32 for a word u whose low 8 bits are clear (so p is exact in f32): the threshold
  // is u itself, and the CPU keeps the element (word >= threshold).
  const uint64_t seed = 2024, stream = 1;
  uint64_t counter = 0;
  int word = -1;
  for (; word < 0; ++counter)
    for (int j = 0; j < 4 && word < 0; ++j) {
      const uint32_t u = philox4x32(seed, stream, counter)[j];
      if (u != 0 && (u & 0xff) == 0) word = j;
    }
  --counter;
  const uint32_t u = philox4x32(seed, stream, counter)[word];
  const float p = float(u) * (1.0f / 4294967296.0f);
  ASSERT_EQ(um::dropout_threshold(p), u);
  Generator g(seed, stream);
  g.set_offset(counter);
  const std::vector<float> y = dropout(full(Shape{4}, 1.0), p, true, g).to_f32_vector();
  const float want = um::dropout_element(1.0f, u, um::dropout_threshold(p), um::dropout_scale(p));
  EXPECT_NE(y[size_t(word)], 0.0f) << "the CPU drops a word equal to its threshold";
  EXPECT_EQ(bits(want), bits(y[size_t(word)]));
}
