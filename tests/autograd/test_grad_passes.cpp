// Gradient accumulation per backward pass: each leaf's contributions of one pass are summed
// on their own and added to .grad once, and a gradient-ready callback fires when a leaf's
// last contribution of the pass has arrived (data-parallel reduction starts on it).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "helpers.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/node.h"

using namespace toy;
using namespace toy::test;

namespace {
// sum(w * k1) + sum(w * k2): w gets two contributions, k1 and k2, in one pass.
Tensor used_twice(const Tensor& w, float k1, float k2) {
  return add(sum(scale(w, k1)), sum(scale(w, k2)));
}
}  // namespace

// A weight used twice (a tied embedding and head) with two accumulated passes: the second
// pass's two contributions of 2^-24 are summed first (2^-23, which 1 + 2^-23 holds), not
// added to the first pass's 1 one at a time (each rounds away: 1 + 2^-24 == 1 in F32).
TEST(GradPasses, EachPassIsSummedOnItsOwnThenAddedOnce) {
  Tensor w = param(ones(Shape{3}));
  backward(used_twice(w, 0.5f, 0.5f));
  ASSERT_EQ(w.grad().to_f32_vector(), (std::vector<float>{1, 1, 1}));
  const float tiny = std::ldexp(1.0f, -24);
  backward(used_twice(w, tiny, tiny));
  const float want = 1.0f + std::ldexp(1.0f, -23);
  EXPECT_EQ(w.grad().to_f32_vector(), (std::vector<float>{want, want, want}));
}

// The callback fires once per leaf per pass, after the leaf's last contribution (its .grad
// is final then), and a leaf near the loss is ready before the backward pass has reached the
// first layer's weight.
TEST(GradPasses, ReadyFiresOncePerLeafAsSoonAsItsGradientIsWhole) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3}, Shape{3});
  Tensor w1 = param(from_vector(std::vector<float>{0.5f, -1, 2}, Shape{3}));
  Tensor w2 = param(from_vector(std::vector<float>{3, 1, -2}, Shape{3}));
  // w2 is used twice near the loss; w1 once, first in the forward.
  Tensor h = mul(x, w1);
  Tensor loss = add(sum(mul(h, w2)), sum(mul(w2, w2)));
  std::vector<std::string> fired;
  std::map<std::string, std::vector<float>> at_fire;
  bool w1_had_grad_when_w2_fired = true;
  BackwardOptions o;
  o.on_grad_ready = [&](const Tensor& leaf) {
    const std::string name = leaf.impl() == w1.impl() ? "w1" : leaf.impl() == w2.impl() ? "w2" : "?";
    fired.push_back(name);
    at_fire[name] = leaf.grad().to_f32_vector();
    if (name == "w2") w1_had_grad_when_w2_fired = w1.grad().defined();
  };
  backward(loss, Tensor(), o);
  EXPECT_EQ(fired, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_FALSE(w1_had_grad_when_w2_fired) << "w2 was held back until the pass ended";
  EXPECT_EQ(at_fire["w2"], w2.grad().to_f32_vector());
  EXPECT_EQ(at_fire["w1"], w1.grad().to_f32_vector());
  // d/dw2 = h + 2 w2, d/dw1 = x * w2
  EXPECT_EQ(w2.grad().to_f32_vector(), (std::vector<float>{0.5f + 6, -2 + 2, 6 - 4}));
  EXPECT_EQ(w1.grad().to_f32_vector(), (std::vector<float>{3, 2, -6}));
}

// A weight inside a recomputation region is reached by a pass nested in the region's rule:
// it is ready once, with its whole gradient, also when it is used outside the region too.
TEST(GradPasses, ALeafInsideARecomputationRegionIsReadyOnceWithItsWholeGradient) {
  Tensor w = param(from_vector(std::vector<float>{1, 2}, Shape{2}));
  Tensor x = param(from_vector(std::vector<float>{3, 4}, Shape{2}));
  Tensor inner = checkpoint([&](const std::vector<Tensor>& in) { return mul(in[0], w); }, {x});
  Tensor loss = add(sum(inner), sum(scale(w, 10.0f)));  // w also outside the region
  std::map<TensorImpl*, int> count;
  std::vector<float> w_at_fire;
  BackwardOptions o;
  o.on_grad_ready = [&](const Tensor& leaf) {
    ++count[leaf.impl()];
    if (leaf.impl() == w.impl()) w_at_fire = leaf.grad().to_f32_vector();
  };
  backward(loss, Tensor(), o);
  EXPECT_EQ(count[w.impl()], 1);
  EXPECT_EQ(count[x.impl()], 1);
  EXPECT_EQ(count.size(), 2u);
  EXPECT_EQ(w_at_fire, (std::vector<float>{13, 14}));
  EXPECT_EQ(w.grad().to_f32_vector(), (std::vector<float>{13, 14}));
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{1, 2}));
}

// A pass that throws part way adds nothing to any .grad (the contributions that had arrived
// stay in the pass).
TEST(GradPasses, APassThatThrowsLeavesEveryGradAsItWas) {
  Tensor w = param(ones(Shape{2}));
  backward(sum(scale(w, 2.0f)));
  const std::vector<float> before = w.grad().to_f32_vector();
  Tensor boom = sum(w).detach();
  record("boom", boom, {w}, [](const Tensor&) -> Grads { fail("[test] this rule fails"); });
  // The product's rule runs (and delivers 3 to w) before the failing one: both feed the
  // final add, and the add hands each its gradient in argument order.
  Tensor loss = add(boom, sum(scale(w, 3.0f)));
  EXPECT_THROW(backward(loss), Error);
  EXPECT_EQ(w.grad().to_f32_vector(), before);
}
