// The tape: accumulation, shared inputs, no-grad, detach, retain_graph, grad(),
// recomputation regions, gradcheck itself.
#include <gtest/gtest.h>

#include "helpers.h"
#include "toy/core/allocator.h"

using namespace toy;
using namespace toy::test;

TEST(Autograd, HandWorkedExample) {
  // y = sum(x^2 + 5x + 4) => dy/dx = 2x + 5.
  Tensor x = param(from_vector(std::vector<float>{1, 2, -3}, Shape{3}));
  Tensor y = sum(add(add(square(x), scale(x, 5.0f)), full(Shape{}, 4.0)));
  y.backward();
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{7, 9, -1}));
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = param(ones(Shape{2}));
  sum(scale(x, 3.0f)).backward();
  sum(scale(x, 3.0f)).backward();
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{6, 6}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, InputUsedTwiceGetsBothContributions) {
  Tensor x = param(from_vector(std::vector<float>{2, 3}, Shape{2}));
  Tensor y = sum(mul(x, x));  // d/dx = 2x
  y.backward();
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{4, 6}));
}

TEST(Autograd, LeafGradsDoNotAliasEachOther) {
  // add's backward hands the same tensor to both inputs; each leaf must own its grad.
  Tensor a = param(ones(Shape{4})), b = param(ones(Shape{4}));
  sum(add(a, b)).backward();
  EXPECT_NE(a.grad().storage().get(), b.grad().storage().get());
  EXPECT_TRUE(a.grad().is_contiguous());
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = param(ones(Shape{3}));
  Tensor y;
  {
    NoGradGuard ng;
    y = exp(x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, DetachStopsGradient) {
  Tensor x = param(ones(Shape{3}));
  Tensor y = sum(mul(x, exp(x).detach()));
  y.backward();
  EXPECT_NEAR(x.grad().to_f32_vector()[0], std::exp(1.0f), 1e-6);
}

TEST(Autograd, NonScalarRootNeedsAGradient) {
  Tensor x = param(ones(Shape{3}));
  Tensor y = scale(x, 2.0f);
  EXPECT_THROW(y.backward(), Error);
  y.backward(from_vector(std::vector<float>{1, 2, 3}, Shape{3}));
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{2, 4, 6}));
}

TEST(Autograd, GraphIsFreedUnlessRetained) {
  Tensor x = param(ones(Shape{3}));
  Tensor y = sum(exp(x));
  backward(y, Tensor(), {.retain_graph = true});
  backward(y);
  EXPECT_NEAR(x.grad().to_f32_vector()[0], 2 * std::exp(1.0f), 1e-5);
  EXPECT_THROW(backward(y), Error);
}

TEST(Autograd, GradReturnsWithoutTouchingLeaves) {
  Tensor x = param(from_vector(std::vector<float>{1, 2}, Shape{2}));
  Tensor h = square(x);
  Tensor y = sum(h);
  auto g = grad(y, {x, h});
  EXPECT_EQ(g[0].to_f32_vector(), (std::vector<float>{2, 4}));
  EXPECT_EQ(g[1].to_f32_vector(), (std::vector<float>{1, 1}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, RetainGradOnIntermediate) {
  Tensor x = param(ones(Shape{2}));
  Tensor h = scale(x, 3.0f);
  h.retain_grad();
  sum(square(h)).backward();
  EXPECT_EQ(h.grad().to_f32_vector(), (std::vector<float>{6, 6}));
}

TEST(Autograd, CheckpointMatchesPlainBackwardIncludingDropoutAndCapturedParams) {
  Tensor w = param(randn_t(Shape{16, 16}, 2, 0.3f));
  Tensor x0 = randn_t(Shape{8, 16}, 3);
  auto block = [&](const std::vector<Tensor>& in) {
    return gelu(dropout(linear(in[0], w), 0.25f));
  };
  // Plain.
  manual_seed(11);
  Tensor x1 = param(x0.detach());
  Tensor y1 = sum(square(block({x1})));
  y1.backward();
  Tensor gw1 = w.grad();
  w.zero_grad();
  // Checkpointed: same generator position => same dropout mask in the recomputation.
  manual_seed(11);
  Tensor x2 = param(x0.detach());
  Tensor y2 = sum(square(checkpoint(block, {x2})));
  EXPECT_NEAR(y1.item(), y2.item(), 1e-5 * std::fabs(y1.item()));
  y2.backward();
  EXPECT_TRUE(close(x2.grad(), x1.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(close(w.grad(), gw1, 1e-5, 1e-5));
}

TEST(Autograd, CheckpointKeepsOnlyItsInputsAlive) {
  // A chain of 8 checkpointed blocks holds ~1 block of activations at a time.
  Tensor w = param(randn_t(Shape{256, 256}, 4, 0.05f));
  auto run = [&](bool ckpt) {
    Tensor h = param(randn_t(Shape{256, 256}, 5));
    for (int i = 0; i < 8; ++i) {
      auto f = [&](const std::vector<Tensor>& in) { return tanh(tanh(tanh(matmul(in[0], w)))); };
      h = ckpt ? checkpoint(f, {h}) : f({h});
    }
    const int64_t peak_before = allocator(Device::CPU).stats().bytes_in_use;
    return peak_before;
  };
  const int64_t base = allocator(Device::CPU).stats().bytes_in_use;
  int64_t plain = 0, ckpt = 0;
  {
    plain = run(false) - base;
  }
  {
    ckpt = run(true) - base;
  }
  EXPECT_LT(ckpt * 2, plain) << "checkpointed " << ckpt << " bytes vs plain " << plain;
}

TEST(Autograd, GradOfALeafWithRespectToItselfIsOne) {
  // Regression: a leaf root that is also captured was counted twice.
  Tensor x = param(from_vector(std::vector<float>{2, 3}, Shape{2}));
  std::vector<Tensor> g = grad(x, {x}, ones(Shape{2}));
  EXPECT_EQ(g[0].to_f32_vector(), (std::vector<float>{1, 1}));
  Tensor s = param(full(Shape{}, 4.0));
  EXPECT_EQ(grad(s, {s})[0].item(), 1.0);
}

TEST(Autograd, GradLeavesOtherLeavesUntouched) {
  // grad() returns what it was asked for and nothing else, also through a checkpoint
  // region whose body captures a parameter.
  Tensor w = param(randn_t(Shape{4, 4}, 6, 0.5f));
  Tensor x = param(randn_t(Shape{3, 4}, 7));
  Tensor y = sum(square(matmul(x, w)));
  std::vector<Tensor> gx = grad(y, {x});
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  auto body = [&](const std::vector<Tensor>& in) { return tanh(matmul(in[0], w)); };
  Tensor yc = sum(square(checkpoint(body, {x})));
  std::vector<Tensor> gc = grad(yc, {x, w});
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  // The parameter's gradient reached grad()'s result instead.
  Tensor yp = sum(square(body({x})));
  std::vector<Tensor> gp = grad(yp, {x, w});
  EXPECT_TRUE(close(gc[0], gp[0], 1e-6, 1e-6));
  EXPECT_TRUE(close(gc[1], gp[1], 1e-6, 1e-6));
}

TEST(Autograd, CheckpointOfAFunctionReturningItsInput) {
  // Regression: the region's node was attached to the input itself.
  Tensor x = param(from_vector(std::vector<float>{1, 2}, Shape{2}));
  Tensor h = scale(x, 2.0f);
  Tensor y = checkpoint([](const std::vector<Tensor>& in) { return in[0]; }, {h});
  EXPECT_EQ(std::string(h.grad_fn()->op), "scale");
  sum(square(y)).backward();
  EXPECT_EQ(x.grad().to_f32_vector(), (std::vector<float>{8, 16}));  // d/dx (2x)^2 = 8x
}

TEST(Autograd, LeafGradDoesNotAliasTheCallersGradient) {
  Tensor x = param(zeros(Shape{3}));
  Tensor g = full(Shape{3}, 1.0);
  backward(x, g);
  EXPECT_NE(x.grad().storage().get(), g.storage().get());
}

TEST(Autograd, CheckpointRestoresTheGeneratorWhenTheReplayThrows) {
  Tensor x = param(ones(Shape{4}));
  int calls = 0;
  Tensor y = checkpoint([&](const std::vector<Tensor>& in) {
    if (++calls == 2) throw Error("replay failed");
    return dropout(in[0], 0.5f);
  }, {x});
  const uint64_t before = default_generator().offset();
  EXPECT_THROW(sum(y).backward(), Error);
  EXPECT_EQ(default_generator().offset(), before);
}

TEST(Gradcheck, CatchesAWrongGradient) {
  // gradcheck itself must fail on a rule that is off: compare d(x^2) against 3x via a
  // detach trick: f = x^2 + (x - x.detach()) * x.detach() has value x^2, gradient 3x.
  Tensor x = from_vector(std::vector<float>{1, 2}, Shape{2});
  x.requires_grad_();
  auto f = [](const std::vector<Tensor>& in) {
    Tensor d = in[0].detach();
    return add(square(in[0]), mul(sub(in[0], d), d));
  };
  EXPECT_FALSE(gradcheck(f, {x}).ok);
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return square(in[0]); }, {x}).ok);
}

TEST(Autograd, GraphsDroppedWithoutBackwardFreeEverything) {
  // A node that holds its own output would form a reference cycle and leak the whole graph
  // when backward never runs (evaluation with grad mode on). Every op family once:
  const int64_t before = allocator(Device::CPU).stats().bytes_in_use;
  {
    Tensor x = param(randn_t(Shape{2, 8, 2, 8}, 1));
    Tensor m = param(randn_t(Shape{6, 8}, 2));
    Tensor w = param(randn_t(Shape{8}, 3));
    std::vector<Tensor> outs = {
        exp(m), tanh(m), sigmoid(m), add(m, w), mul(m, w), div(m, add_scalar(abs(w), 1.0f)), swiglu(m, m),
        dropout(m, 0.5f), matmul(m, transpose(m)), linear(m, m), out_prod(m, m), sum(m, 0), mean(m), max(m, 1),
        rms_norm(m, w), layer_norm(m, w, w), l2_norm(m), softmax(m), log_softmax(m), diag_mask_inf(m),
        rope(x, arange(8, DType::I32)), attention(x, x, x), reshape(m, Shape{-1}), permute(x, {3, 2, 1, 0}),
        concat({m, m}, 0), slice(m, 1, 2, 6), pad(m, {{1, 1}}), repeat(m, {2, 1}), cast(m, DType::BF16),
        get_rows(m, arange(3, DType::I32)), set_rows(m, arange(2, DType::I32), slice(m, 0, 0, 2)),
        cross_entropy(m, arange(6, DType::I32)), linear_cross_entropy(m, m, arange(6, DType::I32), 4),
        conv2d(reshape(m, Shape{1, 1, 6, 8}), reshape(slice(w, 0, 0, 4), Shape{1, 1, 2, 2})),
        conv1d(reshape(m, Shape{1, 6, 8}), reshape(repeat(w, {2}), Shape{8, 2})),
        mul_mat_id(reshape(m, Shape{2, 3, 8}), reshape(m, Shape{6, 1, 8}), zeros(Shape{6, 1}, DType::I32)),
        add_id(reshape(m, Shape{6, 1, 8}), reshape(w, Shape{1, 8}), zeros(Shape{6, 1}, DType::I32)),
        checkpoint([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {m}),
    };
    auto [y, s] = ssm_scan(reshape(slice(m, 0, 0, 4), Shape{1, 2, 2, 8}), reshape(slice(w, 0, 0, 4), Shape{1, 2, 2}),
                           neg(abs(slice(w, 0, 0, 2))), reshape(slice(m, 0, 0, 4), Shape{1, 2, 2, 8}),
                           reshape(slice(m, 0, 2, 6), Shape{1, 2, 2, 8}));
    for (const Tensor& o : outs) EXPECT_TRUE(o.requires_grad());
  }
  EXPECT_EQ(allocator(Device::CPU).stats().bytes_in_use, before);
}
