// OpGrad.<op>: every op's backward against central differences (gradcheck), on regular,
// broadcast, non-contiguous and size-1 inputs. Ops without a gradient check that their
// outputs carry none. The op table's grad_test field names these tests.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "helpers.h"
#include "toy/core/registry.h"

using namespace toy;
using namespace toy::test;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

namespace {
Tensor R(const Shape& s, uint64_t seed, float scale = 1.0f) { return param(randn_t(s, seed, scale)); }
Tensor U(const Shape& s, uint64_t seed, float lo, float hi) { return param(rand_t(s, seed, lo, hi)); }
// Values bounded away from 0 with random sign (for kinked ops).
Tensor away_from_zero(const Shape& s, uint64_t seed) {
  NoGradGuard ng;
  Tensor m = rand_t(s, seed, 0.2f, 1.5f);
  Tensor sign = rand_t(s, seed + 1, -1.0f, 1.0f);
  std::vector<float> mv = m.to_f32_vector(), sv = sign.to_f32_vector();
  for (size_t i = 0; i < mv.size(); ++i) mv[i] *= sv[i] < 0 ? -1.0f : 1.0f;
  return param(from_vector(mv, s));
}
// Moves any value within 0.05 of a kink 0.1 away from it (eps is 0.01).
Tensor avoiding(const Tensor& t, std::initializer_list<float> kinks) {
  std::vector<float> v = t.to_f32_vector();
  for (float& x : v)
    for (float k : kinks)
      if (std::fabs(x - k) < 0.05f) x = k + (x < k ? -0.1f : 0.1f);
  return param(from_vector(v, t.shape()));
}
Tensor NC(const Tensor& t) { return param(noncontig(t.detach())); }
}  // namespace

// ---- elementwise -----------------------------------------------------------------------------

#define UNARY_GRAD(NAME, EXPR, INPUT)                                        \
  TEST(OpGrad, NAME) {                                                       \
    Fn f = [](const std::vector<Tensor>& in) { return EXPR; };               \
    Tensor x = INPUT;                                                        \
    EXPECT_TRUE(grad_ok(f, {x}));                                            \
    EXPECT_TRUE(grad_ok(f, {NC(x)}));                                        \
    EXPECT_TRUE(grad_ok(f, {param(reshape(x.detach(), Shape{1, -1, 1}))}));  \
  }

UNARY_GRAD(scale, scale(in[0], -1.5f), R(Shape{3, 5}, 1))
UNARY_GRAD(neg, neg(in[0]), R(Shape{3, 5}, 2))
UNARY_GRAD(exp, exp(in[0]), R(Shape{3, 5}, 3))
UNARY_GRAD(log, log(in[0]), U(Shape{3, 5}, 4, 0.5f, 3.0f))
UNARY_GRAD(sqrt, sqrt(in[0]), U(Shape{3, 5}, 5, 0.5f, 3.0f))
UNARY_GRAD(rsqrt, rsqrt(in[0]), U(Shape{3, 5}, 6, 0.5f, 3.0f))
UNARY_GRAD(square, square(in[0]), R(Shape{3, 5}, 7))
UNARY_GRAD(abs, abs(in[0]), away_from_zero(Shape{3, 5}, 8))
UNARY_GRAD(tanh, tanh(in[0]), R(Shape{3, 5}, 9))
UNARY_GRAD(sigmoid, sigmoid(in[0]), R(Shape{3, 5}, 10, 2.0f))
UNARY_GRAD(relu, relu(in[0]), away_from_zero(Shape{3, 5}, 11))
UNARY_GRAD(silu, silu(in[0]), R(Shape{3, 5}, 12, 2.0f))
UNARY_GRAD(softplus, softplus(in[0]), R(Shape{3, 5}, 13, 3.0f))
UNARY_GRAD(clamp, clamp(in[0], -0.5f, 0.7f), avoiding(R(Shape{3, 5}, 13), {-0.5f, 0.7f}))

TEST(OpGrad, gelu) {
  Tensor x = R(Shape{4, 6}, 14, 2.0f);
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return gelu(in[0], GeluApprox::Tanh); }, {x}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return gelu(in[0], GeluApprox::None); }, {x}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {NC(x)}));
}

#define BINARY_GRAD(NAME, OP, B_INPUT)                                                             \
  TEST(OpGrad, NAME) {                                                                             \
    Fn f = [](const std::vector<Tensor>& in) { return OP(in[0], in[1]); };                         \
    EXPECT_TRUE(grad_ok(f, {R(Shape{3, 4}, 20), B_INPUT(Shape{3, 4}, 21)}));                       \
    /* broadcasting both ways, size-1 and leading dims */                                          \
    EXPECT_TRUE(grad_ok(f, {R(Shape{2, 3, 4}, 22), B_INPUT(Shape{4}, 23)}));                        \
    EXPECT_TRUE(grad_ok(f, {R(Shape{3, 1}, 24), B_INPUT(Shape{1, 4}, 25)}));                        \
    EXPECT_TRUE(grad_ok(f, {NC(R(Shape{4, 3}, 26)), B_INPUT(Shape{4, 1}, 27)}));                    \
    EXPECT_TRUE(grad_ok(f, {R(Shape{}, 28), B_INPUT(Shape{2, 2}, 29)}));                            \
  }

namespace {
Tensor Rb(const Shape& s, uint64_t seed) { return R(s, seed); }
Tensor Pos(const Shape& s, uint64_t seed) { return U(s, seed, 0.5f, 2.0f); }
}  // namespace
BINARY_GRAD(add, add, Rb)
BINARY_GRAD(sub, sub, Rb)
BINARY_GRAD(mul, mul, Rb)
BINARY_GRAD(div, div, Pos)

TEST(OpGrad, swiglu) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                      {R(Shape{3, 8}, 30, 2.0f), R(Shape{3, 8}, 31)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return swiglu(in[0]); }, {R(Shape{2, 3, 10}, 32, 2.0f)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); },
                      {NC(R(Shape{5, 4}, 33)), R(Shape{5, 4}, 34)}));
}

TEST(OpGrad, dropout) {
  // With a fixed generator position the mask is a constant: the op is linear.
  Fn f = [](const std::vector<Tensor>& in) {
    Generator g(99);
    return dropout(in[0], 0.3f, true, g);
  };
  EXPECT_TRUE(grad_ok(f, {R(Shape{7, 9}, 35)}));
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{7, 9}, 36))}));
}

// ---- matmul ------------------------------------------------------------------------------------

TEST(OpGrad, matmul) {
  Fn f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{3, 4}, 40), R(Shape{4, 5}, 41)}));
  EXPECT_TRUE(grad_ok(f, {R(Shape{2, 3, 4}, 42), R(Shape{4, 5}, 43)}));     // broadcast batch
  EXPECT_TRUE(grad_ok(f, {R(Shape{2, 1, 3, 4}, 44), R(Shape{3, 4, 2}, 45)}));
  EXPECT_TRUE(grad_ok(f, {R(Shape{4}, 46), R(Shape{4, 3}, 47)}));           // vector @ matrix
  EXPECT_TRUE(grad_ok(f, {R(Shape{3, 4}, 48), R(Shape{4}, 49)}));           // matrix @ vector
  EXPECT_TRUE(grad_ok(f, {R(Shape{4}, 50), R(Shape{4}, 51)}));              // dot
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{3, 4}, 52)), NC(R(Shape{4, 5}, 53))}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return matmul(in[0], in[1], true, true); },
                      {R(Shape{2, 4, 3}, 54), R(Shape{2, 5, 4}, 55)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return matmul(in[0], in[1], false, true); },
                      {R(Shape{3, 4}, 56), R(Shape{6, 4}, 57)}));
}

TEST(OpGrad, linear) {
  Fn f = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{2, 3, 4}, 60), R(Shape{5, 4}, 61), R(Shape{5}, 62)}));
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{6, 4}, 63)), R(Shape{3, 4}, 64), R(Shape{3}, 65)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); },
                      {R(Shape{4}, 66), R(Shape{2, 4}, 67)}));
}

TEST(OpGrad, out_prod) {
  Fn f = [](const std::vector<Tensor>& in) { return out_prod(in[0], in[1]); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{3}, 70), R(Shape{4}, 71)}));
  EXPECT_TRUE(grad_ok(f, {R(Shape{5, 3}, 72), R(Shape{5, 4}, 73)}));
}

// ---- reductions --------------------------------------------------------------------------------

TEST(OpGrad, sum) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return sum(in[0]); }, {R(Shape{3, 4}, 80)}));
  for (int axis : {0, 1, 2, -1})
    EXPECT_TRUE(grad_ok([axis](const std::vector<Tensor>& in) { return sum(in[0], axis); }, {R(Shape{2, 3, 4}, 81)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return sum(in[0], 1, true); }, {NC(R(Shape{3, 4}, 82))}));
}

TEST(OpGrad, mean) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mean(in[0]); }, {R(Shape{3, 4}, 83)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mean(in[0], 0, true); }, {R(Shape{3, 4}, 84)}));
}

TEST(OpGrad, max) {
  // Distinct values so the maximum is unique and the function is locally linear.
  Tensor x = param(scale(add(arange(24), scale(rand_t(Shape{24}, 85, 0, 0.3f), 1.0f)), 0.37f));
  Tensor x3 = param(reshape(permute(reshape(x.detach(), Shape{2, 3, 4}), {2, 0, 1}), Shape{4, 2, 3}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return max(in[0]); }, {x}));
  for (int axis : {0, 1, 2})
    EXPECT_TRUE(grad_ok([axis](const std::vector<Tensor>& in) { return max(in[0], axis); }, {x3}));
}

TEST(OpGrad, argmax) {
  Tensor x = param(from_vector(std::vector<float>{1, 5, 2, 7, 0, 7}, Shape{2, 3}));
  Tensor i = argmax(x);
  EXPECT_FALSE(i.requires_grad());
  EXPECT_EQ(i.dtype(), DType::I32);
  EXPECT_EQ(i.to_i32_vector(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0).to_i32_vector(), (std::vector<int32_t>{1, 0, 1}));
}

TEST(OpGrad, argsort) {
  Tensor x = param(from_vector(std::vector<float>{3, 1, 2, 1}, Shape{4}));
  Tensor i = argsort(x);
  EXPECT_FALSE(i.requires_grad());
  EXPECT_EQ(i.to_i32_vector(), (std::vector<int32_t>{1, 3, 2, 0}));  // stable
  EXPECT_EQ(argsort(x, true).to_i32_vector(), (std::vector<int32_t>{0, 2, 1, 3}));
}

TEST(OpGrad, top_k) {
  Tensor x = param(from_vector(std::vector<float>{3, 9, 2, 9, 5, 1}, Shape{2, 3}));
  auto [v, i] = top_k(x, 2);
  EXPECT_FALSE(v.requires_grad());
  EXPECT_EQ(v.to_f32_vector(), (std::vector<float>{9, 3, 9, 5}));
  EXPECT_EQ(i.to_i32_vector(), (std::vector<int32_t>{1, 0, 0, 1}));
}

TEST(OpGrad, sample_token) {
  // No gradient. Against plain loops: greedy takes the first maximum; penalties act first;
  // with a temperature the token is the inverse of the candidates' cumulative softmax(z / T)
  // at the draw r; top-k keeps the k largest; a NaN logit comes back as -1 - its index.
  const std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  const Tensor logits = from_vector(z, Shape{5});
  auto token = [&](const SampleDraw& d, std::vector<int32_t> pen = {}) {
    return int32_t(sample_token(logits, pen, d).item());
  };
  SampleDraw greedy;
  EXPECT_EQ(token(greedy), 1);
  greedy.repeat_penalty = 2.0f;  // 2.0 / 2 = 1.0 < 2.0: id 3 wins; count-0 pairs are padding
  EXPECT_EQ(token(greedy, {1, 1, 0, 0, 0, 0}), 3);
  greedy.repeat_penalty = 1.0f, greedy.presence_penalty = 0.5f, greedy.frequency_penalty = 0.25f;
  EXPECT_EQ(token(greedy, {3, 2, 1, 1}), 1);  // id 1: 2 - 0.5 - 0.25 = 1.25; id 3: 2 - 0.5 - 0.5 = 1.0
  EXPECT_EQ(token(greedy, {3, 2, 1, 3}), 3);  // id 1: 0.75; ids 3 and 4 at 1.0: the first
  SampleDraw presence;  // padding pairs (0, 0) leave token 0 alone
  presence.presence_penalty = 2.0f;
  const Tensor lead = from_vector(std::vector<float>{3.0f, 2.5f, 2.9f}, Shape{3});
  EXPECT_EQ(int32_t(sample_token(lead, std::vector<int32_t>{1, 1, 0, 0}, presence).item()), 0);
  for (const float T : {0.7f, 1.3f}) {
    for (const int k : {0, 2}) {
      std::vector<int32_t> cand = {0, 1, 2, 3, 4};
      if (k) cand = {1, 3};  // the two largest, ties by id
      double total = 0;
      std::vector<double> p;
      for (int32_t i : cand) total += p.emplace_back(std::exp((double(z[size_t(i)]) - 2.0) / T));
      for (const double r : {0.0, 0.2, 0.45, 0.7, 0.99}) {
        double cum = 0;
        int32_t want = cand.back();
        for (size_t i = 0; i < cand.size(); ++i)
          if (r < (cum += p[i] / total)) {
            want = cand[i];
            break;
          }
        SampleDraw d;
        d.temperature = T, d.top_k = k, d.r = r;
        EXPECT_EQ(token(d), want) << "T " << T << " k " << k << " r " << r;
      }
    }
  }
  const Tensor bad = from_vector(std::vector<float>{1, 2, NAN, NAN}, Shape{1, 4});
  EXPECT_EQ(int32_t(sample_token(bad, {}, SampleDraw{}).item()), -1 - 2);
  EXPECT_NE(error_of([&] { token(greedy, {7, 1}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(error_of([&] { token(greedy, {1}); }).find("pairs"), std::string::npos);
  SampleDraw far;
  far.r = 1.0;
  EXPECT_NE(error_of([&] { token(far); }).find("[sample_token]"), std::string::npos);
}

// Greedy without penalties takes a vector fast path: the first maximum (ties, -0 beside +0,
// infinities) or the first NaN, wherever they sit (a full 8, the scalar tail), as the chain's
// plain loop finds them — the chain itself runs when padding-only penalties are passed.
TEST(SampleToken, GreedyIsTheFirstMaximumOrTheFirstNanInTheFastPathAndTheChain) {
  auto plain = [](const std::vector<float>& z) {
    for (size_t i = 0; i < z.size(); ++i)
      if (std::isnan(z[i])) return -1 - int32_t(i);
    return int32_t(std::max_element(z.begin(), z.end()) - z.begin());
  };
  for (const int64_t V : {1, 7, 8, 29, 1003}) {
    std::vector<float> base = randn_t(Shape{V}, 60 + uint64_t(V)).to_f32_vector();
    std::vector<std::vector<float>> cases = {base};
    for (const int64_t at : {int64_t(0), V / 2, V - 1}) {
      std::vector<float> tie = base;  // the maximum twice: the first wins
      const float top = *std::max_element(base.begin(), base.end()) + 1.0f;
      tie[size_t(at)] = top, tie[size_t(V - 1)] = top;
      cases.push_back(tie);
      std::vector<float> nan = base;
      nan[size_t(at)] = NAN, nan[size_t(V - 1)] = NAN;
      cases.push_back(nan);
      std::vector<float> zeros(size_t(V), -INFINITY);  // -0 then +0: the first
      zeros[size_t(at)] = -0.0f, zeros[size_t(V - 1)] = 0.0f;
      cases.push_back(zeros);
      std::vector<float> inf = base;
      inf[size_t(at)] = INFINITY;
      cases.push_back(inf);
    }
    cases.push_back(std::vector<float>(size_t(V), -INFINITY));
    for (size_t c = 0; c < cases.size(); ++c) {
      const Tensor logits = from_vector(cases[c], Shape{V});
      EXPECT_EQ(int32_t(sample_token(logits, {}, SampleDraw{}).item()), plain(cases[c])) << "V " << V << " case " << c;
      EXPECT_EQ(int32_t(sample_token(logits, std::vector<int32_t>{0, 0}, SampleDraw{}).item()), plain(cases[c]))
          << "V " << V << " case " << c << " (the chain)";
    }
  }
}

TEST(OpGrad, full) {
  // No gradient. zeros / ones / full fill on the tensor's device (sim: the same bytes).
  for (Device d : {Device::CPU, Device::SIM}) {
    EXPECT_EQ(zeros(Shape{3}, DType::F32, d).to_f32_vector(), (std::vector<float>{0, 0, 0}));
    EXPECT_EQ(ones(Shape{2}, DType::BF16, d).to_f32_vector(), (std::vector<float>{1, 1}));
    EXPECT_EQ(full(Shape{2, 2}, -3.0, DType::I32, d).to_i32_vector(), (std::vector<int32_t>{-3, -3, -3, -3}));
    EXPECT_EQ(zeros(Shape{0}, DType::F16, d).numel(), 0);
    EXPECT_EQ(zeros(Shape{32}, DType::Q8_0, d).nbytes(), 34u);
  }
  EXPECT_NE(error_of([] { full(Shape{32}, 1.0, DType::Q8_0); }).find("[full] cannot fill a q8_0"), std::string::npos);
}

TEST(OpGrad, arange) {
  // No gradient. 0..n-1 on any device, integer or float.
  for (Device d : {Device::CPU, Device::SIM}) {
    EXPECT_EQ(arange(4, DType::I32, d).to_i32_vector(), (std::vector<int32_t>{0, 1, 2, 3}));
    EXPECT_EQ(arange(3, DType::F16, d).to_f32_vector(), (std::vector<float>{0, 1, 2}));
    EXPECT_EQ(arange(0, DType::F32, d).numel(), 0);
  }
  EXPECT_NE(error_of([] { arange(-1); }).find("[arange]"), std::string::npos);
  EXPECT_NE(error_of([] { arange(4, DType::Q4_0); }).find("[arange] not defined for q4_0"), std::string::npos);
}

TEST(OpGrad, random_fill) {
  // No gradient. Element i is Philox's word i % 4 of block counter + i / 4 (uniform) or
  // Box-Muller of words 2(i % 2), 2(i % 2) + 1 of block counter + i / 2 (normal), against
  // plain loops; the same numbers on sim; the generator moves past what it drew.
  for (Device d : {Device::CPU, Device::SIM}) {
    Generator g(21, 4);
    g.set_offset(10);
    const std::vector<float> u = rand(Shape{9}, g, -1.0f, 3.0f, d).to_f32_vector();
    EXPECT_EQ(g.offset(), 13u);
    const std::vector<float> n = randn(Shape{5}, g, 0.5f, 2.0f, d).to_f32_vector();
    EXPECT_EQ(g.offset(), 16u);
    for (int i = 0; i < 9; ++i) {
      const auto w = philox4x32(21, 4, 10 + uint64_t(i) / 4);
      EXPECT_EQ(u[size_t(i)], -1.0f + 4.0f * uniform01(w[i % 4])) << i;
    }
    for (int i = 0; i < 5; ++i) {
      const auto w = philox4x32(21, 4, 13 + uint64_t(i) / 2);
      const int k = (i % 2) * 2;
      const float u1 = (float(w[size_t(k)] >> 8) + 1.0f) * (1.0f / 16777216.0f), u2 = uniform01(w[size_t(k) + 1]);
      EXPECT_EQ(n[size_t(i)], 0.5f + 2.0f * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2)) << i;
    }
  }
  Tensor ints = zeros(Shape{4}, DType::I32);
  Generator g(1);
  EXPECT_NE(error_of([&] { fill_uniform_(ints, g, 0, 1); }).find("[random_fill]"), std::string::npos);
}

TEST(OpGrad, step_clock) {
  // No gradient: the I32 step advances by one on its device; anything else is refused.
  Tensor step = zeros(Shape{}, DType::I32);
  NoGradGuard ng;
  for (int i = 1; i <= 3; ++i) {
    advance_step_clock(step);
    EXPECT_EQ(step.item(), double(i));
  }
  Tensor two = zeros(Shape{2}, DType::I32);
  EXPECT_NE(error_of([&] { advance_step_clock(two); }).find("one-element"), std::string::npos);
}

// ---- norms / softmax ---------------------------------------------------------------------------

TEST(OpGrad, rms_norm) {
  Fn f = [](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-5f); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{3, 8}, 90), R(Shape{8}, 91)}));
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{8, 3}, 92)), R(Shape{3}, 93)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return rms_norm(in[0]); }, {R(Shape{2, 2, 5}, 94)}));
  EXPECT_TRUE(grad_ok(f, {R(Shape{4, 37}, 95), R(Shape{37}, 96)}));  // odd width (vector tail)
}

TEST(OpGrad, layer_norm) {
  Fn f = [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{3, 8}, 100), R(Shape{8}, 101), R(Shape{8}, 102)}));
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{9, 3}, 103)), R(Shape{3}, 104), R(Shape{3}, 105)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return layer_norm(in[0]); }, {R(Shape{2, 11}, 106)}));
}

TEST(OpGrad, l2_norm) {
  Fn f = [](const std::vector<Tensor>& in) { return l2_norm(in[0]); };
  EXPECT_TRUE(grad_ok(f, {R(Shape{3, 8}, 110)}));
  EXPECT_TRUE(grad_ok(f, {NC(R(Shape{5, 3}, 111))}));
}

TEST(OpGrad, softmax) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {R(Shape{3, 7}, 120)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return softmax(in[0], 0.5f, in[1]); },
                      {R(Shape{2, 3, 9}, 121), R(Shape{3, 9}, 122)}));  // mask gets a gradient too
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return softmax(in[0], 2.0f); }, {NC(R(Shape{6, 4}, 123))}));
}

TEST(OpGrad, log_softmax) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return log_softmax(in[0]); }, {R(Shape{3, 7}, 124)}));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0.7f, in[1]); },
                      {R(Shape{4, 9}, 125), R(Shape{1, 9}, 126)}));
}

TEST(OpGrad, diag_mask_inf) {
  // Masked then softmaxed (a -inf output has no finite probe).
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return softmax(diag_mask_inf(in[0], 1)); },
                      {R(Shape{2, 4, 6}, 127)}));
}

// ---- rope / attention ----------------------------------------------------------------------------

TEST(OpGrad, rope) {
  Tensor pos = from_vector(std::vector<int32_t>{0, 3, 7}, Shape{3});
  for (bool neox : {false, true}) {
    RopeOptions o;
    o.neox = neox;
    o.n_dims = 6;  // partial rotation: last 2 dims pass through
    Fn f = [pos, o](const std::vector<Tensor>& in) { return rope(in[0], pos, o); };
    EXPECT_TRUE(grad_ok(f, {R(Shape{2, 3, 2, 8}, 130)}));
    EXPECT_TRUE(grad_ok(f, {param(permute(R(Shape{2, 2, 3, 8}, 131).detach(), {0, 2, 1, 3}))}));
  }
  RopeOptions y;
  y.ext_factor = 1.0f;
  y.freq_scale = 0.25f;
  y.n_ctx_orig = 32;
  y.freq_factors = from_vector(std::vector<float>{1, 2, 4, 8}, Shape{4});
  EXPECT_TRUE(grad_ok([pos, y](const std::vector<Tensor>& in) { return rope(in[0], pos, y); },
                      {R(Shape{1, 3, 2, 8}, 132)}));
}

TEST(OpGrad, rope_head_range) {
  // Only heads [1, 3) of 4 rotate: equal to rope on that slice with the others copied.
  Tensor pos = from_vector(std::vector<int32_t>{0, 2, 5}, Shape{3});
  RopeOptions o;
  o.heads_begin = 1, o.heads_end = 3;
  Tensor x = R(Shape{2, 3, 4, 6}, 132);
  Tensor want = concat({slice(x, 2, 0, 1), rope(slice(x, 2, 1, 3), pos), slice(x, 2, 3, 4)}, 2);
  EXPECT_TRUE(close(rope(x, pos, o), want, 1e-6, 1e-6));
  EXPECT_TRUE(grad_ok([pos, o](const std::vector<Tensor>& in) { return rope(in[0], pos, o); }, {x}));
}

TEST(OpGrad, attention_qkv) {
  // The packed form (GQA, two 16-row query blocks and a tail) against attention on slices,
  // forward and the one packed gradient; then a gradcheck of the packed op itself.
  const int64_t H = 4, Hkv = 2;
  Tensor qkv = R(Shape{2, 37, H + 2 * Hkv, 4}, 150);
  Tensor g = randn_t(Shape{2, 37, H, 4}, 151);
  Tensor packed = attention_qkv(qkv, H, Hkv);
  backward(packed, g);
  Tensor packed_grad = qkv.grad();
  qkv.zero_grad();
  Tensor split = attention(slice(qkv, 2, 0, H), slice(qkv, 2, H, H + Hkv), slice(qkv, 2, H + Hkv, H + 2 * Hkv));
  backward(split, g);
  EXPECT_TRUE(close(packed, split, 1e-6, 1e-6));
  EXPECT_TRUE(close(packed_grad, qkv.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return attention_qkv(in[0], 2, 1); },
                      {R(Shape{1, 5, 4, 4}, 152)}));
}

TEST(OpGrad, attention_decode) {
  // Under autograd the op is the N attentions it stands for: gradients to q and to every
  // sequence's keys and values, sequences of different lengths, GQA, a sliding window.
  AttentionOptions win;
  win.window = 3;
  for (const AttentionOptions& o : {AttentionOptions{}, win}) {
    Fn f = [o](const std::vector<Tensor>& in) {
      const std::vector<Tensor> ks = {in[1], in[3]}, vs = {in[2], in[4]};
      return attention_decode(in[0], ks, vs, o);
    };
    EXPECT_TRUE(grad_ok(f, {R(Shape{2, 1, 4, 4}, 160), R(Shape{1, 5, 2, 4}, 161), R(Shape{1, 5, 2, 3}, 162),
                            R(Shape{1, 2, 2, 4}, 163), R(Shape{1, 2, 2, 3}, 164)}));
  }
}

TEST(OpGrad, attention) {
  Fn causal = [](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2]); };
  EXPECT_TRUE(grad_ok(causal, {R(Shape{2, 5, 2, 4}, 140), R(Shape{2, 5, 2, 4}, 141), R(Shape{2, 5, 2, 4}, 142)}));
  // GQA, longer than one block, different value dim, non-causal.
  AttentionOptions nc;
  nc.causal = false;
  EXPECT_TRUE(grad_ok([nc](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], nc); },
                      {R(Shape{1, 70, 4, 4}, 143), R(Shape{1, 70, 2, 4}, 144), R(Shape{1, 70, 2, 3}, 145)},
                      {.max_elements = 200}));
  // Block-causal segments.
  AttentionOptions seg;
  seg.segments = from_vector(std::vector<int32_t>{0, 0, 0, 1, 1, 2}, Shape{1, 6});
  EXPECT_TRUE(grad_ok([seg](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], seg); },
                      {R(Shape{1, 6, 2, 4}, 146), R(Shape{1, 6, 1, 4}, 147), R(Shape{1, 6, 1, 4}, 148)}));
  // A sliding window of 3 over 7 positions (with a cache's extra keys), and with segments.
  AttentionOptions win;
  win.window = 3;
  EXPECT_TRUE(grad_ok([win](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], win); },
                      {R(Shape{1, 7, 2, 4}, 150), R(Shape{1, 9, 1, 4}, 151), R(Shape{1, 9, 1, 4}, 152)}));
  win.segments = from_vector(std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1}, Shape{1, 7});
  EXPECT_TRUE(grad_ok([win](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], win); },
                      {R(Shape{1, 7, 2, 4}, 153), R(Shape{1, 7, 1, 4}, 154), R(Shape{1, 7, 1, 4}, 155)}));
  // Strided views of one fused qkv tensor.
  Tensor qkv = R(Shape{1, 4, 3, 2, 4}, 149);
  Fn fused = [](const std::vector<Tensor>& in) {
    Tensor q = squeeze(slice(in[0], 2, 0, 1), 2), k = squeeze(slice(in[0], 2, 1, 2), 2),
           v = squeeze(slice(in[0], 2, 2, 3), 2);
    return attention(q, k, v);
  };
  EXPECT_TRUE(grad_ok(fused, {qkv}));
}

// ---- shape ops -----------------------------------------------------------------------------------

TEST(OpGrad, view) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(view(in[0], Shape{4, 3}), in[1]); },
                      {R(Shape{2, 6}, 150), R(Shape{4, 3}, 151)}));
}
TEST(OpGrad, reshape) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(reshape(in[0], Shape{-1}), in[1]); },
                      {NC(R(Shape{3, 4}, 152)), R(Shape{12}, 153)}));
}
TEST(OpGrad, permute) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(permute(in[0], {2, 0, 1}), in[1]); },
                      {R(Shape{2, 3, 4}, 154), R(Shape{4, 2, 3}, 155)}));
}
TEST(OpGrad, transpose) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(transpose(in[0], 0, 2), in[1]); },
                      {R(Shape{2, 3, 4}, 156), R(Shape{4, 3, 2}, 157)}));
}
TEST(OpGrad, contiguous) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(contiguous(transpose(in[0])), in[1]); },
                      {R(Shape{3, 4}, 158), R(Shape{4, 3}, 159)}));
}
// Through the sim device and back: the product runs as a sim kernel, each gradient returns to
// its input's device.
TEST(OpGrad, to) {
  EXPECT_TRUE(grad_ok(
      [](const std::vector<Tensor>& in) { return to(mul(to(in[0], Device::SIM), to(in[1], Device::SIM)), Device::CPU); },
      {R(Shape{3, 4}, 163), R(Shape{3, 4}, 164)}));
}
TEST(OpGrad, concat) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(concat({in[0], in[1]}, 1), in[2]); },
                      {R(Shape{2, 3}, 160), NC(R(Shape{2, 1}, 161)), R(Shape{2, 4}, 162)}));
}
TEST(OpGrad, slice) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return square(slice(in[0], 1, 1, -1, 2)); },
                      {R(Shape{3, 8}, 163)}));
}
TEST(OpGrad, pad) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(pad(in[0], {{1, 2}, {0, 1}}, 0.5f), in[1]); },
                      {R(Shape{2, 3, 2}, 164), R(Shape{2, 6, 3}, 165)}));
}
TEST(OpGrad, repeat) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return mul(repeat(in[0], {2, 1, 3}), in[1]); },
                      {R(Shape{2, 2}, 166), R(Shape{2, 2, 6}, 167)}));
}
TEST(OpGrad, cast) {
  // Through bf16 and back: the gradient is cast back; the probe uses a loose tolerance.
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return cast(cast(in[0], DType::F16), DType::F32); },
                      {R(Shape{3, 4}, 168)}, {.eps = 0.05, .atol = 2e-2, .rtol = 2e-2}));
}

// ---- rows / loss ----------------------------------------------------------------------------------

TEST(OpGrad, get_rows) {
  Tensor ids = from_vector(std::vector<int32_t>{2, 0, 2, 3}, Shape{2, 2});  // repeated id: grads add
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return get_rows(in[0], ids); }, {R(Shape{4, 5}, 170)}));
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return get_rows(in[0], ids); },
                      {param(slice(R(Shape{4, 8}, 171).detach(), 1, 0, 5))}));  // strided rows
}

TEST(OpGrad, set_rows) {
  Tensor ids = from_vector(std::vector<int32_t>{3, 1}, Shape{2});
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return set_rows(in[0], ids, in[1]); },
                      {R(Shape{4, 3}, 172), R(Shape{2, 3}, 173)}));
}

TEST(OpGrad, set_rows_with_repeated_ids) {
  // Row 1 is written twice; the second write wins, so the first src row gets no gradient.
  Tensor ids = from_vector(std::vector<int32_t>{1, 2, 1}, Shape{3});
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return set_rows(in[0], ids, in[1]); },
                      {R(Shape{4, 3}, 174), R(Shape{3, 3}, 175)}));
  Tensor src = param(ones(Shape{3, 2}));
  sum(set_rows(zeros(Shape{4, 2}), ids, src)).backward();
  EXPECT_EQ(src.grad().to_f32_vector(), (std::vector<float>{0, 0, 1, 1, 1, 1}));
}

TEST(OpGrad, cross_entropy) {
  Tensor t = from_vector(std::vector<int32_t>{1, 4, -100, 0, 2, 3}, Shape{2, 3});
  EXPECT_TRUE(grad_ok([t](const std::vector<Tensor>& in) { return cross_entropy(in[0], t); },
                      {R(Shape{2, 3, 5}, 180, 2.0f)}));
  CrossEntropyOptions o;
  o.weights = from_vector(std::vector<float>{1, 0.5f, 1, 0, 2, 1}, Shape{2, 3});
  EXPECT_TRUE(grad_ok([t, o](const std::vector<Tensor>& in) { return cross_entropy(in[0], t, o); },
                      {NC(R(Shape{2, 3, 5}, 181, 2.0f))}));
  // The chunked linear head gives the same loss and gradients as the plain one.
  Tensor tt = from_vector(std::vector<int32_t>{1, 4, 0, 2, 3, 1, 0}, Shape{7});
  EXPECT_TRUE(grad_ok([tt](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], tt, 3); },
                      {R(Shape{7, 4}, 182), R(Shape{5, 4}, 183)}));
}

// ---- conv / moe / ssm -----------------------------------------------------------------------------

TEST(OpGrad, im2col) {
  Conv2dOptions o;
  o.stride_h = 2;
  o.pad_w = 1;
  o.dilation_w = 2;
  EXPECT_TRUE(grad_ok([o](const std::vector<Tensor>& in) { return im2col(in[0], 2, 2, o); }, {R(Shape{2, 2, 5, 4}, 190)}));
}

TEST(OpGrad, conv2d) {
  Conv2dOptions o;
  o.pad_h = o.pad_w = 1;
  EXPECT_TRUE(grad_ok([o](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], o); },
                      {R(Shape{2, 3, 4, 4}, 191), R(Shape{2, 3, 3, 3}, 192), R(Shape{2}, 193)}));
}

TEST(OpGrad, conv1d) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return conv1d(in[0], in[1], in[2]); },
                      {R(Shape{2, 6, 3}, 194), R(Shape{3, 4}, 195), R(Shape{3}, 196)}));
}

TEST(OpGrad, ssm_conv) {
  EXPECT_TRUE(grad_ok([](const std::vector<Tensor>& in) { return ssm_conv(in[0], in[1]); },
                      {R(Shape{2, 8, 3}, 197), R(Shape{3, 3}, 198)}));
}

TEST(OpGrad, ssm_scan) {
  // B=2, T=5, H=4, P=3, G=2, N=3; gradient through both outputs and the initial state.
  // Both outputs, flattened side by side (gradcheck weighs them with random w).
  Fn f = [](const std::vector<Tensor>& in) {
    auto [y, s] = ssm_scan(in[0], in[1], in[2], in[3], in[4], in[5]);
    return concat({reshape(y, Shape{-1}), reshape(s, Shape{-1})}, 0);
  };
  EXPECT_TRUE(grad_ok(f, {R(Shape{2, 5, 4, 3}, 200, 0.5f), R(Shape{2, 5, 4}, 201), U(Shape{4}, 202, -1.0f, -0.2f),
                          R(Shape{2, 5, 2, 3}, 203, 0.5f), R(Shape{2, 5, 2, 3}, 204, 0.5f),
                          R(Shape{2, 4, 3, 3}, 205, 0.5f)}));
  // Without an initial state; only y used.
  Fn g = [](const std::vector<Tensor>& in) { return ssm_scan(in[0], in[1], in[2], in[3], in[4]).first; };
  EXPECT_TRUE(grad_ok(g, {R(Shape{1, 7, 2, 2}, 206, 0.5f), R(Shape{1, 7, 2}, 207), U(Shape{2}, 208, -1.0f, -0.2f),
                          R(Shape{1, 7, 1, 4}, 209, 0.5f), R(Shape{1, 7, 1, 4}, 210, 0.5f)}));
}

TEST(OpGrad, gated_delta_rule) {
  // 70 tokens (the backward keeps states per 64-token chunk: a boundary inside), 2 K heads read
  // by 4 V heads, Dk != Dv, an initial state; both outputs, so the final state's gradient and
  // the initial state's are checked too. Then the chunked forward's own gradient (same rule).
  for (GatedDeltaAlgorithm a : {GatedDeltaAlgorithm::Recurrent, GatedDeltaAlgorithm::Chunked}) {
    Fn f = [a](const std::vector<Tensor>& in) {
      auto [o, s] = gated_delta_rule(in[0], in[1], in[2], in[3], in[4], in[5], a);
      return concat({reshape(o, Shape{-1}), reshape(s, Shape{-1})}, 0);
    };
    EXPECT_TRUE(grad_ok(f, {R(Shape{1, 70, 2, 3}, 212, 0.5f), R(Shape{1, 70, 2, 3}, 213, 0.5f),
                            R(Shape{1, 70, 4, 2}, 214), U(Shape{1, 70, 4}, 215, -1.0f, -0.01f),
                            U(Shape{1, 70, 4}, 216, 0.05f, 0.95f), R(Shape{1, 4, 3, 2}, 217, 0.5f)}));
  }
  // Without an initial state; only o used.
  Fn g = [](const std::vector<Tensor>& in) { return gated_delta_rule(in[0], in[1], in[2], in[3], in[4]).first; };
  EXPECT_TRUE(grad_ok(g, {R(Shape{2, 6, 1, 4}, 218, 0.5f), R(Shape{2, 6, 1, 4}, 219, 0.5f), R(Shape{2, 6, 1, 4}, 220),
                          U(Shape{2, 6, 1}, 221, -1.0f, -0.01f), U(Shape{2, 6, 1}, 222, 0.05f, 0.95f)}));
}

TEST(OpGrad, gated_delta_rule_qkv) {
  // c [B=1, T=70, (2 x 1 + 2) x 4]: q, k L2-normalised in the op; with an initial state.
  Fn f = [](const std::vector<Tensor>& in) {
    auto [o, s] = gated_delta_rule_qkv(in[0], in[1], in[2], 1, 2, 4, 1e-6f, in[3]);
    return concat({reshape(o, Shape{-1}), reshape(s, Shape{-1})}, 0);
  };
  EXPECT_TRUE(grad_ok(f, {R(Shape{1, 70, 16}, 223), U(Shape{1, 70, 2}, 224, -1.0f, -0.01f),
                          U(Shape{1, 70, 2}, 225, 0.05f, 0.95f), R(Shape{1, 2, 4, 4}, 226, 0.5f)}));
}

TEST(OpGrad, mul_mat_id) {
  Tensor ids = from_vector(std::vector<int32_t>{0, 2, 2, 1, 0, 0}, Shape{3, 2});
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return mul_mat_id(in[0], in[1], ids); },
                      {R(Shape{3, 4, 5}, 210), R(Shape{3, 1, 5}, 211)}));  // x shared by both slots
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return mul_mat_id(in[0], in[1], ids); },
                      {R(Shape{3, 4, 5}, 212), R(Shape{3, 2, 5}, 213)}));
}

TEST(OpGrad, add_id) {
  Tensor ids = from_vector(std::vector<int32_t>{0, 2, 2, 1}, Shape{2, 2});
  EXPECT_TRUE(grad_ok([ids](const std::vector<Tensor>& in) { return add_id(in[0], in[1], ids); },
                      {R(Shape{2, 2, 3}, 214), R(Shape{3, 3}, 215)}));
}

// ---- optimizers (no gradient: check the update rule) --------------------------------------------

TEST(OpGrad, sgd) {
  Tensor p = from_vector(std::vector<float>{1, 2}, Shape{2});
  Tensor g = from_vector(std::vector<float>{0.5f, -1}, Shape{2});
  Tensor buf = zeros(Shape{2});
  Tensor lr = scalar(0.1);
  SgdOptions o;
  o.momentum = 0.9f;
  o.weight_decay = 0.1f;
  sgd_step(p, g, buf, lr, o);  // g' = g + 0.1 p ; buf = g' ; p -= 0.1 buf
  EXPECT_NEAR(p.to_f32_vector()[0], 1 - 0.1 * 0.6, 1e-6);
  EXPECT_NEAR(p.to_f32_vector()[1], 2 - 0.1 * (-0.8), 1e-6);
  sgd_step(p, g, buf, lr, o);  // buf = 0.9 buf + g'
  const double p0 = 1 - 0.1 * 0.6, g0 = 0.5 + 0.1 * p0;
  EXPECT_NEAR(p.to_f32_vector()[0], p0 - 0.1 * (0.9 * 0.6 + g0), 1e-6);
  EXPECT_FALSE(p.requires_grad());
}

TEST(OpGrad, optimizer_clock) {
  // No gradient (an in-place step): the step advances by one and lr follows the warmup and
  // cosine schedule at the position (the loop's step clock, which step_clock advances by
  // one), against the formulas in double. The position runs ahead of the step now and then,
  // as when F16 loss scaling skips a step.
  const LrSchedule s{3, 11, 0.02f, 0.002f};
  Tensor step = zeros(Shape{}), lr = zeros(Shape{}), position = zeros(Shape{}, DType::I32);
  NoGradGuard ng;
  int i = 0;
  for (int t = 1; t <= 13; ++t, ++i) {
    if (t % 4 == 0) advance_step_clock(position), ++i;  // a skipped step
    advance_optimizer_clock(step, lr, position, s);
    EXPECT_EQ(step.item(), double(t));
    const double want = i < 3 ? 0.02 * (i + 1) / 4.0
                        : i >= 11 ? 0.002
                                  : 0.002 + 0.5 * (1 + std::cos(M_PI * (i - 3) / 8.0)) * (0.02 - 0.002);
    EXPECT_NEAR(lr.item(), want, 1e-7) << t;
    advance_step_clock(position);
    EXPECT_EQ(position.item(), double(i + 1));
  }
  Tensor f32_position = zeros(Shape{});
  EXPECT_NE(error_of([&] { advance_step_clock(f32_position); }).find("[step_clock] step clock"), std::string::npos);
  EXPECT_NE(error_of([&] { advance_optimizer_clock(step, lr, f32_position, s); }).find("[optimizer_clock]"),
            std::string::npos);
}

TEST(OpGrad, adamw) {
  // Two steps against the formulas in double.
  const int n = 19;
  Tensor p = randn_t(Shape{n}, 220), m = zeros(Shape{n}), v = zeros(Shape{n});
  const std::vector<float> p0 = p.to_f32_vector();
  std::vector<double> pd(p0.begin(), p0.end()), md(n, 0), vd(n, 0);
  AdamWOptions o;
  o.beta1 = 0.8f;
  o.beta2 = 0.95f;
  o.eps = 1e-6f;
  o.weight_decay = 0.1f;
  const double lr = 0.01;
  for (int t = 1; t <= 2; ++t) {
    Tensor g = randn_t(Shape{n}, 230 + t);
    std::vector<float> gv = g.to_f32_vector();
    adamw_step(p, g, m, v, scalar(lr), scalar(t), o);
    for (int i = 0; i < n; ++i) {
      pd[size_t(i)] *= 1 - lr * o.weight_decay;
      md[size_t(i)] = o.beta1 * md[size_t(i)] + (1 - o.beta1) * gv[size_t(i)];
      vd[size_t(i)] = o.beta2 * vd[size_t(i)] + (1 - o.beta2) * double(gv[size_t(i)]) * gv[size_t(i)];
      const double mh = md[size_t(i)] / (1 - std::pow(double(o.beta1), t));
      const double vh = vd[size_t(i)] / (1 - std::pow(double(o.beta2), t));
      pd[size_t(i)] -= lr * mh / (std::sqrt(vh) + o.eps);
    }
  }
  EXPECT_TRUE(close(p, pd, 1e-6, 1e-5));
}

// Every op of the registry names its gradient test, and that test exists in this binary (in
// suite OpGrad, under exactly that name): removing or renaming one fails here.
TEST(Registry, EveryOpHasAGradTest) {
  std::set<std::string> tests;
  const ::testing::UnitTest& ut = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < ut.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& s = *ut.GetTestSuite(i);
    for (int k = 0; k < s.total_test_count(); ++k)
      tests.insert(std::string(s.name()) + "." + s.GetTestInfo(k)->name());
  }
  const auto& ops = toy::registry().ops();
  ASSERT_GE(ops.size(), 59u);
  for (const auto& op : ops) EXPECT_TRUE(tests.count(op.grad_test)) << op.name << ": no test " << op.grad_test;
}
