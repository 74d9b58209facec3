// ref::TransformerLM, the double-precision oracle for the engine model: every gradient
// against central finite differences, training steps lower the loss, deterministic
// sampling, the Mat helpers, and toy::Error for every caller mistake.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "toy/core/error.h"
#include "toy/models/ref/transformer_lm.h"

using toy::ref::Config;
using toy::ref::Gradients;
using toy::ref::Mat;
using toy::ref::TransformerLM;

namespace {

// The small model of the brief: 2 heads of d_head 4, 2 layers.
Config small_config() {
  return Config{.vocab_size = 11, .d_model = 8, .d_ff = 12, .n_heads = 2, .n_layers = 2, .context_length = 6};
}

// Runs f, expects toy::Error whose message contains every needle.
void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown (expected one mentioning " << *needles.begin() << ")";
  } catch (const toy::Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// Seeded weights with gammas away from 1 and larger-than-init scale, so every term of the
// backward (gamma gradients, attention off the uniform pattern) carries weight.
TransformerLM perturbed_model(uint64_t seed) {
  TransformerLM m(small_config(), seed);
  std::mt19937_64 rng(seed + 1000);
  for (auto& p : m.parameters()) {
    bool gamma = p.shape.size() == 1;
    for (double& v : *p.data) v = gamma ? 1.0 + 0.5 * (2.0 * toy::ref::uniform01(rng) - 1.0) : v * 2.5;
  }
  return m;
}

}  // namespace

// ---- Mat ------------------------------------------------------------------------------

TEST(RefMat, MatmulVariantsAgreeWithTranspose) {
  Mat a(2, 3), b(3, 4);
  for (int64_t i = 0; i < a.numel(); ++i) a.flat[size_t(i)] = double(i) - 2.0;
  for (int64_t i = 0; i < b.numel(); ++i) b.flat[size_t(i)] = 0.5 * double(i) - 1.0;
  Mat ab = a.matmul(b);
  ASSERT_EQ(ab.shape(), "[2, 4]");
  // Row 0 of a is [-2, -1, 0]; column 0 of b is [-1, 1, 3].
  EXPECT_DOUBLE_EQ(ab.get(0, 0), 1.0);
  Mat ab2 = a.matmul_t(b.transpose());
  Mat ab3 = a.transpose().t_matmul(b);
  EXPECT_EQ(ab.flat, ab2.flat);
  EXPECT_EQ(ab.flat, ab3.flat);

  Mat s = a.plus(a);
  Mat orig = a;
  a.add_(a).scale_(0.5);  // (a + a) / 2 == a
  EXPECT_EQ(a.flat, orig.flat);
  for (size_t i = 0; i < s.flat.size(); ++i) EXPECT_EQ(s.flat[i], 2.0 * a.flat[i]);
  a.set(1, 2, 7.0);
  EXPECT_EQ(a.get(1, 2), 7.0);
  expect_error([&] { a.matmul(a); }, {"[ref::Mat::matmul]", "[2, 3]"});
  expect_error([&] { a.plus(b); }, {"[ref::Mat::plus]", "[2, 3]", "[3, 4]"});
}

TEST(RefMat, ShapeAndInfoFormats) {
  Mat m(5, 768);
  EXPECT_EQ(m.shape(), "[5, 768]");
  Mat e(0, 3);
  EXPECT_EQ(e.info(), "Mat[0, 3] (empty)");
  Mat a(2, 2);
  a.flat = {-1.5, 2.0, 0.0, 0.5};
  EXPECT_EQ(a.info(), "Mat[2, 2] min=-1.5 max=2.0 mean=0.25");
  // Ruby's Float#to_s: fixed from 1e-4 up to 1e16, exponent form (two exponent digits) beyond.
  a.flat = {1.0e-5, 1.0e20, 0.012, 0.0001};
  EXPECT_EQ(a.info(), "Mat[2, 2] min=1.0e-05 max=1.0e+20 mean=2.5e+19");
  a.flat = {100.0, 123.25, 1e15, -0.25};
  EXPECT_EQ(a.info(), "Mat[2, 2] min=-0.25 max=1000000000000000.0 mean=250000000000055.75");
}

// ---- layers ---------------------------------------------------------------------------

TEST(RefLayers, KnownValues) {
  EXPECT_NEAR(toy::ref::gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_EQ(toy::ref::gelu_tanh(0.0), 0.0);
  for (double x : {-3.0, -0.7, 0.0, 0.4, 2.5}) {
    double h = 1e-5;
    double fd = (toy::ref::gelu_tanh(x + h) - toy::ref::gelu_tanh(x - h)) / (2 * h);
    EXPECT_NEAR(toy::ref::gelu_tanh_grad(x), fd, 1e-9) << x;
  }
  // RMSNorm of [3, 4] with gamma [1, 2]: r = sqrt(12.5 + eps).
  Mat x(1, 2);
  x.flat = {3.0, 4.0};
  auto n = toy::ref::rms_norm(x, {1.0, 2.0});
  double r = std::sqrt(12.5 + 1e-5);
  EXPECT_DOUBLE_EQ(n.rms[0], r);
  EXPECT_DOUBLE_EQ(n.y.get(0, 0), 3.0 / r);
  EXPECT_DOUBLE_EQ(n.y.get(0, 1), 8.0 / r);
  // Causal softmax: row i spreads over keys 0..i, exactly 0 beyond.
  Mat s(3, 3);
  toy::ref::apply_causal_mask_(s);
  toy::ref::softmax_rows_(s);
  EXPECT_EQ(s.flat, (std::vector<double>{1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}));
}

TEST(RefLayers, CrossEntropyIsMeanNegativeLogProb) {
  Mat logits(3, 4);
  logits.flat = {0, 1, 2, 3, -1, 0.5, 0.25, 2, 0, 0, 0, 0};
  std::vector<int32_t> ids = {0, 3, 1};
  auto res = toy::ref::cross_entropy_grad(logits, ids);
  auto lse = [&](int r) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += std::exp(logits.get(r, j));
    return std::log(s);
  };
  double want = ((lse(0) - 3.0) + (lse(1) - 0.5)) / 2.0;
  EXPECT_NEAR(res.loss, want, 1e-15);
  // dlogits rows sum to 0; the last row is 0 (no next token to predict).
  for (int r = 0; r < 2; ++r) {
    double s = 0;
    for (int j = 0; j < 4; ++j) s += res.dlogits.get(r, j);
    EXPECT_NEAR(s, 0.0, 1e-16);
  }
  for (int j = 0; j < 4; ++j) EXPECT_EQ(res.dlogits.get(2, j), 0.0);
  // A confident wrong prediction keeps its true (unclamped) loss.
  Mat far(2, 2);
  far.flat = {0, 100, 0, 0};
  EXPECT_NEAR(toy::ref::cross_entropy_grad(far, {0, 0}).loss, 100.0, 1e-12);
}

// ---- the model ------------------------------------------------------------------------

TEST(RefTransformer, ParametersAndShapes) {
  TransformerLM m(small_config(), 1);
  auto ps = m.parameters();
  int64_t total = 0;
  for (auto& p : ps) total += int64_t(p.data->size());
  EXPECT_EQ(total, m.num_parameters());
  EXPECT_EQ(ps.front().name, "token_embed");
  EXPECT_EQ(ps.back().name, "norm_final_gamma");
  EXPECT_EQ(m.blocks[1].w_q[1].shape(), "[8, 4]");
  EXPECT_EQ(m.blocks[0].w_o.shape(), "[8, 8]");
  EXPECT_EQ(m.blocks[0].w_ff1.shape(), "[8, 12]");
  EXPECT_EQ(m.blocks[0].w_ff2.shape(), "[12, 8]");
  EXPECT_EQ(m.pos_embed.shape(), "[6, 8]");
  Gradients g(small_config());
  auto gs = g.parameters();
  ASSERT_EQ(gs.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(gs[i].name, ps[i].name);
    EXPECT_EQ(gs[i].shape, ps[i].shape);
    for (double v : *gs[i].data) EXPECT_EQ(v, 0.0);
  }
  // Init: uniform in [-1/sqrt(d_model), 1/sqrt(d_model)], gammas 1, reproducible from the seed.
  double s = 1.0 / std::sqrt(8.0);
  for (double v : m.token_embed.flat) EXPECT_LE(std::abs(v), s);
  for (double v : m.blocks[0].norm2_gamma) EXPECT_EQ(v, 1.0);
  EXPECT_EQ(TransformerLM(small_config(), 1).blocks[1].w_ff2.flat, m.blocks[1].w_ff2.flat);
  EXPECT_NE(TransformerLM(small_config(), 2).blocks[1].w_ff2.flat, m.blocks[1].w_ff2.flat);
}

TEST(RefTransformer, ForwardIsCausalAndUsesPositions) {
  TransformerLM m = perturbed_model(3);
  Mat a = m.forward({1, 4, 7, 2, 9});
  ASSERT_EQ(a.shape(), "[5, 11]");
  EXPECT_EQ(m.cache().layers.size(), 2u);
  EXPECT_EQ(m.cache().layers[1].heads[1].attn.shape(), "[5, 5]");
  Mat b = m.forward({1, 4, 7, 3, 0});  // changes positions 3 and 4 only
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 11; ++j) EXPECT_EQ(a.get(i, j), b.get(i, j)) << i << "," << j;
  bool differs = false;
  for (int64_t j = 0; j < 11; ++j) differs |= a.get(3, j) != b.get(3, j);
  EXPECT_TRUE(differs);
  // The same token at two positions gives different logits (learned positions).
  Mat c = m.forward({5, 5});
  differs = false;
  for (int64_t j = 0; j < 11; ++j) differs |= c.get(0, j) != c.get(1, j);
  EXPECT_TRUE(differs);
}

// Every gradient against central differences of the double-precision loss, the fourth-order
// stencil (8(f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h: with h = 1e-3 its truncation
// error is ~h⁴ = 1e-12 and its rounding error ~1e-16/h = 1e-13, so the analytic and numeric
// gradients must agree to 1e-7 relative with a wide margin (the denominator is floored at
// 1e-4 for the few near-zero entries).
TEST(RefTransformer, EveryGradientMatchesFiniteDifferences) {
  TransformerLM m = perturbed_model(7);
  // Repeats (token 3 twice) so embedding rows accumulate from several positions and from
  // the unembedding; full context so every pos_embed row gets a gradient.
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 3};
  Gradients g(small_config());
  m.forward(ids);
  double loss = m.backward(ids, g);
  EXPECT_EQ(loss, g.loss);
  EXPECT_GT(loss, 0.0);

  auto ps = m.parameters();
  auto gs = g.parameters();
  const double h = 1e-3;
  double worst = 0;
  std::string worst_name;
  int checked = 0;
  std::vector<std::string> zero_names;
  for (size_t k = 0; k < ps.size(); ++k) {
    std::vector<double>& p = *ps[k].data;
    for (size_t i = 0; i < p.size(); ++i) {
      const double orig = p[i];
      auto loss_at = [&](double v) {
        p[i] = v;
        return m.loss(ids);
      };
      const double fd = (8.0 * (loss_at(orig + h) - loss_at(orig - h)) - (loss_at(orig + 2 * h) - loss_at(orig - 2 * h))) /
                        (12.0 * h);
      p[i] = orig;
      const double an = (*gs[k].data)[i];
      const double rel = std::abs(an - fd) / std::max({std::abs(an), std::abs(fd), 1e-4});
      if (rel > worst) {
        worst = rel;
        worst_name = ps[k].name + "[" + std::to_string(i) + "]";
      }
      EXPECT_LT(rel, 1e-7) << ps[k].name << "[" << i << "] analytic " << an << " numeric " << fd;
      ++checked;
      if (an == 0.0) zero_names.push_back(ps[k].name + "[" + std::to_string(i) + "]");
    }
  }
  EXPECT_EQ(checked, m.num_parameters());
  // The only dead parameters are the last position's pos_embed row: the last position
  // predicts nothing and, under the causal mask, no other position reads it. Everything
  // else is live (the tied unembedding gives even unseen tokens' rows a gradient).
  std::vector<std::string> want_zero;
  for (int j = 40; j < 48; ++j) want_zero.push_back("pos_embed[" + std::to_string(j) + "]");
  EXPECT_EQ(zero_names, want_zero);
  std::cout << "[ gradcheck ] " << checked << " parameters, worst relative error " << worst << " at "
            << worst_name << "\n";
}

TEST(RefTransformer, BackwardAccumulatesAndShortSequencesHaveNoLoss) {
  TransformerLM m = perturbed_model(11);
  const std::vector<int32_t> ids = {2, 7, 2, 9};
  Gradients once(small_config()), twice(small_config());
  m.forward(ids);
  m.backward(ids, once);
  m.backward(ids, twice);
  m.backward(ids, twice);
  auto a = once.parameters(), b = twice.parameters();
  for (size_t k = 0; k < a.size(); ++k)
    for (size_t i = 0; i < a[k].data->size(); ++i) {
      const double want = 2.0 * (*a[k].data)[i];  // up to the order of the += sums
      EXPECT_NEAR((*b[k].data)[i], want, 1e-14 * std::max(1.0, std::abs(want))) << a[k].name << "[" << i << "]";
    }

  Gradients g(small_config());
  m.forward({4});
  EXPECT_EQ(m.backward({4}, g), 0.0);
  for (auto& p : g.parameters())
    for (double v : *p.data) EXPECT_EQ(v, 0.0);
  g.fill_zero();
}

TEST(RefTransformer, SgdAndAdamLowerTheLoss) {
  const std::vector<int32_t> ids = {1, 2, 3, 1, 2, 3};
  for (bool adam : {false, true}) {
    TransformerLM m(small_config(), 5);
    Gradients g(small_config());
    toy::ref::AdamState st(small_config());
    const double first = m.loss(ids);
    double last = first;
    for (int step = 0; step < 60; ++step) {
      g.fill_zero();
      m.forward(ids);
      last = m.backward(ids, g);
      if (adam)
        m.adam_step(g, st, 0.02);
      else
        m.sgd_step(g, 0.5);
    }
    last = m.loss(ids);
    EXPECT_LT(last, 0.25 * first) << (adam ? "adam" : "sgd") << ": " << first << " -> " << last;
    if (adam) {
      EXPECT_EQ(st.step, 60);
      EXPECT_NEAR(st.bc1, std::pow(0.9, 60), 1e-15);
    }
  }
}

TEST(RefTransformer, AdamStepMatchesTheFormula) {
  // One parameter entry through two steps by hand.
  TransformerLM m(small_config(), 9);
  Gradients g(small_config());
  toy::ref::AdamState st(small_config());
  const double p0 = m.blocks[1].w_o.get(2, 3);
  g.blocks[1].w_o.set(2, 3, 0.3);
  m.adam_step(g, st, 0.1, 0.9, 0.99, 1e-8);
  g.blocks[1].w_o.set(2, 3, -0.1);
  m.adam_step(g, st, 0.1, 0.9, 0.99, 1e-8);
  double mm = 0.1 * 0.3, vv = 0.01 * 0.09;
  double p = p0 - 0.1 * (mm / 0.1) / (std::sqrt(vv / 0.01) + 1e-8);
  mm = 0.9 * mm + 0.1 * -0.1;
  vv = 0.99 * vv + 0.01 * 0.01;
  p -= 0.1 * (mm / (1 - 0.81)) / (std::sqrt(vv / (1 - 0.99 * 0.99)) + 1e-8);
  EXPECT_NEAR(m.blocks[1].w_o.get(2, 3), p, 1e-15);
  // A zero gradient leaves its parameter alone.
  EXPECT_EQ(m.blocks[0].w_o.get(0, 0), TransformerLM(small_config(), 9).blocks[0].w_o.get(0, 0));
}

// ---- sampling -------------------------------------------------------------------------

TEST(RefSampling, ArgmaxAndCumulativeDraw) {
  Mat l(2, 3);
  l.flat = {0.0, std::log(2.0), 0.0, 5.0, 1.0, 5.0};
  // temperature <= 0: argmax, first maximum on ties, the uniform number ignored.
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 0.0, 0.99), 1);
  EXPECT_EQ(toy::ref::sample_logits_row(l, 1, -1.0, 0.0), 0);
  // Probabilities 0.25 / 0.5 / 0.25: the draw picks by cumulative mass.
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 1.0, 0.2), 0);
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 1.0, 0.3), 1);
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 1.0, 0.74), 1);
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 1.0, 0.76), 2);
  // Temperature 0.5 squares the odds: 1/6, 4/6, 1/6.
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 0.5, 0.16), 0);
  EXPECT_EQ(toy::ref::sample_logits_row(l, 0, 0.5, 0.18), 1);
  expect_error([&] { toy::ref::sample_logits_row(l, 0, 1.0, 1.0); }, {"[0, 1)", "1"});
  expect_error([&] { toy::ref::sample_logits_row(l, 2, 1.0, 0.5); }, {"row 2", "[2, 3]"});
}

TEST(RefSampling, GenerationIsDeterministic) {
  TransformerLM m = perturbed_model(13);
  // Argmax: no random numbers at all; runs past the context window (6) by sliding it.
  auto a = m.generate_from_ids({1, 2, 3, 4}, 5, 0.0);
  auto b = m.generate_from_ids({1, 2, 3, 4}, 5, 0.0);
  ASSERT_EQ(a.size(), 9u);
  EXPECT_EQ(a, b);
  EXPECT_EQ((std::vector<int32_t>(a.begin(), a.begin() + 4)), (std::vector<int32_t>{1, 2, 3, 4}));
  // The first generated token is the argmax of the last row of the prompt's logits.
  Mat logits = m.forward({1, 2, 3, 4});
  EXPECT_EQ(a[4], toy::ref::sample_logits_row(logits, 3, 0.0, 0.0));

  // Seeded sampling: the same seed gives the same tokens, a different one (very likely)
  // different tokens at temperature 2.
  auto sample = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    return m.generate_from_ids({7}, 12, 2.0, [&] { return toy::ref::uniform01(rng); });
  };
  EXPECT_EQ(sample(42), sample(42));
  EXPECT_NE(sample(42), sample(43));
  for (int32_t t : sample(42)) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 11);
  }
}

// ---- errors ---------------------------------------------------------------------------

TEST(RefErrors, BadInputsThrow) {
  TransformerLM m(small_config(), 1);
  expect_error([&] { m.forward({1, 11, 2}); }, {"token id 11", "position 1", "vocab_size 11"});
  expect_error([&] { m.forward({1, -1}); }, {"token id -1", "vocab_size 11"});
  expect_error([&] { m.forward({1, 2, 3, 4, 5, 6, 7}); }, {"7 tokens", "context_length 6"});
  expect_error([&] { m.forward({}); }, {"at least 1"});
  expect_error([&] { m.generate_from_ids({1, 12}, 1, 0.0); }, {"token id 12"});
  expect_error([&] { m.generate_from_ids({}, 1, 0.0); }, {"at least 1"});
  expect_error([&] { m.generate_from_ids({1}, 1, 1.0); }, {"uniform"});

  Config c = small_config();
  c.n_heads = 3;
  expect_error([&] { TransformerLM bad(c); }, {"d_model 8", "n_heads 3"});
  c = small_config();
  c.d_model = 10;
  c.n_heads = 4;
  expect_error([&] { TransformerLM bad(c); }, {"d_model 10", "n_heads 4"});
  c = small_config();
  c.n_layers = 0;
  expect_error([&] { TransformerLM bad(c); }, {"positive", "n_layers 0"});

  // backward needs a forward of the same ids; gradients must match the config.
  Gradients g(small_config());
  TransformerLM fresh(small_config(), 1);
  expect_error([&] { fresh.backward({1, 2}, g); }, {"no forward"});
  fresh.forward({1, 2, 3});
  expect_error([&] { fresh.backward({1, 2}, g); }, {"other ids"});
  Config bigger = small_config();
  bigger.d_ff = 16;
  Gradients wrong(bigger);
  expect_error([&] { fresh.backward({1, 2, 3}, wrong); }, {"w_ff1"});

  // A weight copied in with the wrong size is caught before it is read.
  m.blocks[1].w_ff1 = Mat(8, 13);
  expect_error([&] { m.forward({1}); }, {"blocks.1.w_ff1", "[8, 13]"});
}
