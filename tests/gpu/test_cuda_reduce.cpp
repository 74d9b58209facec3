// The CUDA row-wise kernels against the CPU, through the public ops (and autograd for the
// backward kernels): reduce (sum, max and its first-max index, over every axis, strided
// inputs), softmax / log_softmax with a scale and a mask, diag_mask_inf, rms / layer / L2
// norms, and the cross-entropy kernels, on seeded random inputs of rows shorter than a warp,
// not a multiple of 32, and longer than 1024, in F32, F16 and BF16.
// Tolerances (|got - want| <= rel * max(1, |want|)):
//  - F32 1e-5: both sides compute in f32 (sums in double where the CPU's are) but reduce in
//    different orders and use different exp/log implementations: a few ulps of f32; 1e-4 for
//    the norms' weight gradients (sums over all rows, see tol_weight);
//  - F16 2e-3 and BF16 1.6e-2 (two ulps of the type): the f32 results above, rounded to the
//    type, may land one ulp apart; backward results, built on forward outputs that may
//    already sit one ulp apart, get twice that;
//  - max values and indices, diag_mask_inf and the masked positions: exact.
// Every test needs a GPU: without one it skips, or fails under TOY_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/autograd/backward.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

double tol(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 1.6e-2; }
double tol_backward(DType t) { return t == DType::F32 ? 1e-5 : 2 * tol(t); }
// Weight and bias gradients sum over all rows (1100 here) in f32, in a different order on each
// side: the error scales with the sum of the terms' magnitudes, not the result's (measured up
// to 3e-5 against the CPU for 1100 rows of 33).
double tol_weight(DType t) { return t == DType::F32 ? 1e-4 : tol_backward(t); }

std::string type_name(DType t) { return std::string(name(t)); }
std::string label(const char* what, DType t, const Shape& s) {
  return std::string(what) + " " + type_name(t) + s.str();
}

// Seeded normal values, cast to t.
Tensor rnd(const Shape& s, DType t, uint64_t seed, float std = 1.0f) {
  Generator g(seed);
  return cast(randn(s, g, 0.0f, std), t);
}

// x with its dimensions reversed (a strided view).
Tensor reversed(const Tensor& x) {
  std::vector<int> p;
  for (int d = x.ndim() - 1; d >= 0; --d) p.push_back(d);
  return permute(x, p);
}

// Like expect_close, but an infinite `want` must be met exactly (-inf of a masked row).
void expect_close_inf(const std::vector<float>& got, const std::vector<float>& want, double rel,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> g, w;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]))
      EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
    else
      g.push_back(got[i]), w.push_back(want[i]);
  }
  expect_close(g, w, rel, what.c_str());
}

// A CPU leaf and its GPU copy, both tracking gradients.
std::pair<Tensor, Tensor> leaves(const Tensor& x) {
  Tensor c = x.detach(), d = on_gpu(x);
  c.requires_grad_();
  d.requires_grad_();
  return {c, d};
}

// The gradient of sum(y * gy) with respect to each of `xs` (gy on y's device).
std::vector<std::vector<float>> grads_of(const Tensor& y, const std::vector<Tensor>& xs, const Tensor& gy) {
  std::vector<std::vector<float>> r;
  for (const Tensor& g : grad(y, xs, gy)) r.push_back(back(g));
  return r;
}

// Random targets in [0, V), every `ignore_every`-th one set to `ignore`.
Tensor targets_for(int64_t n, int64_t V, int ignore_every, int32_t ignore, uint64_t seed) {
  Generator g(seed);
  std::vector<float> u = rand(Shape{n}, g, 0.0f, float(V)).to_f32_vector();
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ids[size_t(i)] = std::min<int32_t>(int32_t(u[size_t(i)]), int32_t(V - 1));
    if (ignore_every > 0 && i % ignore_every == 1) ids[size_t(i)] = ignore;
  }
  return from_vector(ids, Shape{n});
}

}  // namespace

TEST(CudaRows, EveryRowKernelIsRegistered) {
  REQUIRE_GPU();
  // (a fused op whose kernel is missing runs its composite form: the comparisons below would
  // then pass without testing these kernels)
  EXPECT_TRUE(KernelRef<kern::Reduce>("reduce").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::Softmax>("softmax").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::SoftmaxBackward>("softmax_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::DiagMask>("diag_mask_inf").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::RmsNorm>("rms_norm").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::RmsNormBackward>("rms_norm_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::LayerNorm>("layer_norm").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::LayerNormBackward>("layer_norm_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::L2Norm>("l2_norm").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::L2NormBackward>("l2_norm_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::CrossEntropy>("cross_entropy").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::CrossEntropyTotal>("cross_entropy_total").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::CrossEntropyBackward>("cross_entropy_backward").available(Device::CUDA));
}

// ---- reduce ------------------------------------------------------------------------------------

TEST(CudaRows, SumAndMaxOverEveryAxisEqualTheCpu) {
  REQUIRE_GPU();
  const std::vector<Shape> shapes = {Shape{5, 7}, Shape{3, 100, 6}, Shape{2, 1500}, Shape{1500, 3}};
  uint64_t seed = 10;
  for (DType t : kFloatTypes) {
    for (const Shape& s : shapes) {
      // Values on a coarse grid, so a row holds ties: the first maximum must win.
      Generator g(seed++);
      std::vector<float> v = randn(s, g).to_f32_vector();
      for (float& e : v) e = std::round(e * 2.0f) / 2.0f;
      const Tensor x = cast(from_vector(v, s), t), gx = on_gpu(x);
      // The tensor itself and its transpose (all dims reversed: a strided input).
      const std::pair<Tensor, Tensor> inputs[] = {{x, gx}, {reversed(x), reversed(gx)}};
      for (const auto& [in, gin] : inputs) {
        const std::string what = label(in.is_contiguous() ? "x" : "x^T", t, in.shape());
        for (int axis = 0; axis < in.ndim(); ++axis) {
          const std::string at = what + " axis " + std::to_string(axis);
          expect_close(back(sum(gin, axis)), sum(in, axis).to_f32_vector(), tol(t), ("sum " + at).c_str());
          EXPECT_EQ(back(max(gin, axis)), max(in, axis).to_f32_vector()) << "max " << at;
          EXPECT_EQ(transfer(argmax(gin, axis), Device::CPU).to_i32_vector(), argmax(in, axis).to_i32_vector())
              << "argmax " << at;
        }
      }
      expect_close(back(sum(on_gpu(x))), sum(x).to_f32_vector(), tol(t), label("sum all", t, s).c_str());
    }
  }
}

TEST(CudaRows, MaxTakesTheFirstMaximumAndTheFirstNan) {
  REQUIRE_GPU();
  const float inf = INFINITY, nan = NAN;
  // Rows: ties (first 3 wins), all -inf (index 0), two NaNs (the first wins), -0 before 0.
  const std::vector<float> v = {1, 3, 3, 2, 0,  -inf, -inf, -inf, -inf, -inf,
                                1, nan, 5, nan, 2, -0.0f, 0.0f, -1, -2, -3};
  const std::vector<int32_t> want_idx = {1, 0, 1, 0};
  for (DType t : kFloatTypes) {
    const Tensor x = cast(from_vector(v, Shape{4, 5}), t);
    const Tensor gx = on_gpu(x);
    EXPECT_EQ(transfer(argmax(gx, 1), Device::CPU).to_i32_vector(), want_idx) << name(t);
    EXPECT_EQ(argmax(x, 1).to_i32_vector(), want_idx) << name(t);
    const std::vector<float> got = back(max(gx, 1)), want = max(x, 1).to_f32_vector();
    expect_close_inf(got, want, 0.0, "max " + type_name(t));
    EXPECT_TRUE(std::signbit(got[3])) << "the first of -0 and 0 is -0";
    // The same reductions down the columns of the transpose (the strided column kernel).
    const Tensor xt = transpose(x, 0, 1), gxt = transpose(gx, 0, 1);
    EXPECT_EQ(transfer(argmax(gxt, 0), Device::CPU).to_i32_vector(), want_idx) << name(t);
    expect_close_inf(back(max(gxt, 0)), max(xt, 0).to_f32_vector(), 0.0, "max^T " + type_name(t));
  }
}

// A few outputs over a long axis (a gradient norm's whole-parameter sum) are reduced in chunks
// of 16384 and the chunks' partials combined: the sum, the first maximum across chunks (ties
// at both ends of the axis, one in the last, partial chunk) and a NaN in a late chunk.
TEST(CudaRows, LongAxesReducedInChunksEqualTheCpu) {
  REQUIRE_GPU();
  const int64_t L = 3 * 16384 + 77;
  for (DType t : kFloatTypes) {
    Generator g(33);
    std::vector<float> v = randn(Shape{2, L}, g).to_f32_vector();
    for (float& e : v) e = std::round(e * 4.0f) / 4.0f;
    v[5] = v[L - 3] = 9.0f;              // row 0: the maximum twice, in the first and last chunk
    v[L + 40000] = NAN;                  // row 1: a NaN in the third chunk wins the max
    const Tensor x = cast(from_vector(v, Shape{2, L}), t), gx = on_gpu(x);
    const std::vector<float> sums = back(sum(gx, 1)), want = sum(x, 1).to_f32_vector();
    expect_close({sums[0]}, {want[0]}, tol(t), ("chunked sum " + type_name(t)).c_str());
    EXPECT_TRUE(std::isnan(sums[1])) << "a NaN in a chunk makes the sum NaN";
    EXPECT_EQ(transfer(argmax(gx, 1), Device::CPU).to_i32_vector(), (std::vector<int32_t>{5, int32_t(40000)}))
        << type_name(t);
    const std::vector<float> maxes = back(max(gx, 1));
    EXPECT_EQ(maxes[0], 9.0f) << type_name(t);
    EXPECT_TRUE(std::isnan(maxes[1])) << "the NaN is the maximum";
    // The whole tensor (one output over 2L), and a strided long axis (the transpose's axis 0).
    const Tensor clean = cast(randn(Shape{L, 3}, g), t);
    expect_close(back(sum(on_gpu(clean))), sum(clean).to_f32_vector(), tol(t), ("chunked sum all " + type_name(t)).c_str());
    const Tensor strided = transpose(clean, 0, 1);
    expect_close(back(sum(transpose(on_gpu(clean), 0, 1), 1)), sum(strided, 1).to_f32_vector(), tol(t),
                 ("chunked strided sum " + type_name(t)).c_str());
    // Sums down long columns (a bias gradient) in chunks of 1024 rows: 2-D, 3-D with an outer
    // dimension, and down a transposed (strided) input; the max keeps the one-pass form.
    const Tensor cols = cast(randn(Shape{5000, 70}, g), t), cube = cast(randn(Shape{3, 2500, 10}, g), t);
    expect_close(back(sum(on_gpu(cols), 0)), sum(cols, 0).to_f32_vector(), tol(t), ("column sums " + type_name(t)).c_str());
    expect_close(back(sum(on_gpu(cube), 1)), sum(cube, 1).to_f32_vector(), tol(t), ("3-d column sums " + type_name(t)).c_str());
    const Tensor colst = transpose(cast(randn(Shape{40, 3000}, g), t), 0, 1);  // [3000, 40], strides (1, 3000)
    expect_close(back(sum(transpose(on_gpu(transpose(colst, 0, 1)), 0, 1), 0)), sum(colst, 0).to_f32_vector(), tol(t),
                 ("strided column sums " + type_name(t)).c_str());
    EXPECT_EQ(back(max(on_gpu(cols), 0)), max(cols, 0).to_f32_vector()) << type_name(t);
  }
}

TEST(CudaRows, SumOverAnEmptyAxisIsZeroAndEmptyOutputsAreFine) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    const Tensor x = zeros(Shape{3, 0, 4}, t);
    EXPECT_EQ(back(sum(on_gpu(x), 1)), std::vector<float>(12, 0.0f)) << name(t);
    EXPECT_EQ(back(sum(on_gpu(zeros(Shape{3, 0}, t)), 1)), std::vector<float>(3, 0.0f)) << name(t);
    EXPECT_TRUE(back(sum(on_gpu(x), 0)).empty()) << name(t);
    EXPECT_TRUE(back(max(on_gpu(x), 0)).empty()) << name(t);
  }
}

// ---- softmax -------------------------------------------------------------------------------------

TEST(CudaRows, SoftmaxAndLogSoftmaxWithScaleAndMaskEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (const Shape& s : {Shape{3, 7}, Shape{4, 100}, Shape{2, 3, 1500}}) {
      const int64_t D = s[s.ndim() - 1];
      const Tensor x = rnd(s, t, seed++, 2.0f);
      // A mask over the last dim broadcast to every row, with -inf at every 3rd column.
      std::vector<float> m = rnd(Shape{D}, DType::F32, seed++).to_f32_vector();
      for (int64_t j = 0; j < D; j += 3) m[size_t(j)] = -INFINITY;
      const Tensor mask = from_vector(m, Shape{D});
      for (bool log : {false, true}) {
        for (float scale : {1.0f, 0.37f}) {
          for (bool masked : {false, true}) {
            const Tensor mk = masked ? mask : Tensor(), gmk = masked ? on_gpu(mask) : Tensor();
            const Tensor want = log ? log_softmax(x, scale, mk) : softmax(x, scale, mk);
            const Tensor got = log ? log_softmax(on_gpu(x), scale, gmk) : softmax(on_gpu(x), scale, gmk);
            expect_close_inf(back(got), want.to_f32_vector(), tol(t),
                             label(log ? "log_softmax" : "softmax", t, s) + " scale " + std::to_string(scale) +
                                 (masked ? " masked" : ""));
          }
        }
      }
    }
  }
}

TEST(CudaRows, SoftmaxOfAStridedInputAndAFullyMaskedRow) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    // A transposed input [40, 1100] (the op copies it to rows) with a per-row mask [40, 1]
    // broadcast along the rows, whose row 5 masks everything: zeros (log: -inf) there.
    const Tensor base = rnd(Shape{1100, 40}, t, 7);
    const Tensor x = transpose(base, 0, 1), gx = transpose(on_gpu(base), 0, 1);
    std::vector<float> m = rnd(Shape{40, 1}, DType::F32, 8).to_f32_vector();
    m[5] = -INFINITY;
    const Tensor mask = from_vector(m, Shape{40, 1}), gmask = on_gpu(mask);
    for (bool log : {false, true}) {
      const Tensor want = log ? log_softmax(x, 1.0f, mask) : softmax(x, 1.0f, mask);
      const Tensor got = log ? log_softmax(gx, 1.0f, gmask) : softmax(gx, 1.0f, gmask);
      const std::vector<float> g = back(got);
      expect_close_inf(g, want.to_f32_vector(), tol(t), label(log ? "log_softmax^T" : "softmax^T", t, x.shape()));
      for (int64_t j = 0; j < 1100; ++j) EXPECT_EQ(g[size_t(5 * 1100 + j)], log ? -INFINITY : 0.0f) << name(t);
    }
  }
}

TEST(CudaRows, ASoftmaxRowHoldingNanIsNanThroughout) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    for (int64_t D : {int64_t(7), int64_t(100)}) {
      std::vector<float> v = rnd(Shape{2, D}, DType::F32, 150).to_f32_vector();
      v[3] = NAN;  // row 0 only
      const Tensor x = cast(from_vector(v, Shape{2, D}), t);
      for (bool log : {false, true}) {
        const std::vector<float> want = (log ? log_softmax(x) : softmax(x)).to_f32_vector();
        const std::vector<float> got = back(log ? log_softmax(on_gpu(x)) : softmax(on_gpu(x)));
        for (int64_t j = 0; j < D; ++j) EXPECT_TRUE(std::isnan(want[size_t(j)]) && std::isnan(got[size_t(j)]));
        expect_close(got, want, tol(t), label(log ? "log_softmax with NaN" : "softmax with NaN", t, x.shape()).c_str());
      }
    }
  }
}

TEST(CudaRows, SoftmaxBackwardEqualsTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 200;
  for (DType t : kFloatTypes) {
    for (const Shape& s : {Shape{3, 7}, Shape{4, 100}, Shape{2, 3, 1500}}) {
      const int64_t D = s[s.ndim() - 1];
      const Tensor x = rnd(s, t, seed++, 2.0f), gy = rnd(s, t, seed++);
      std::vector<float> m(size_t(D), 0.0f);
      for (int64_t j = 1; j < D; j += 4) m[size_t(j)] = -INFINITY;
      const Tensor mask = from_vector(m, Shape{D});
      for (bool log : {false, true}) {
        // (scale 1: the backward of another scale adds a unary kernel this test is not about)
        auto [xc, xg] = leaves(x);
        const Tensor yc = log ? log_softmax(xc, 1.0f, mask) : softmax(xc, 1.0f, mask);
        const Tensor yg = log ? log_softmax(xg, 1.0f, on_gpu(mask)) : softmax(xg, 1.0f, on_gpu(mask));
        const auto want = grads_of(yc, {xc}, gy), got = grads_of(yg, {xg}, on_gpu(gy));
        expect_close(got[0], want[0], tol_backward(t), label(log ? "d log_softmax" : "d softmax", t, s).c_str());
      }
    }
  }
}

TEST(CudaRows, DiagMaskInfAndItsBackwardEqualTheCpu) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    for (int64_t n_past : {int64_t(0), int64_t(2), int64_t(-1), int64_t(40)}) {
      const Tensor x = rnd(Shape{2, 5, 37}, t, 300), gy = rnd(Shape{2, 5, 37}, t, 301);
      auto [xc, xg] = leaves(x);
      const Tensor yc = diag_mask_inf(xc, n_past), yg = diag_mask_inf(xg, n_past);
      EXPECT_EQ(back(yg), yc.to_f32_vector()) << name(t) << " n_past " << n_past;
      EXPECT_EQ(grads_of(yg, {xg}, on_gpu(gy))[0], grads_of(yc, {xc}, gy)[0]) << name(t) << " n_past " << n_past;
    }
    // A strided input (the op copies it first).
    const Tensor x = rnd(Shape{37, 6}, t, 302);
    EXPECT_EQ(back(diag_mask_inf(transpose(on_gpu(x), 0, 1), 3)), diag_mask_inf(transpose(x, 0, 1), 3).to_f32_vector())
        << name(t);
  }
}

// ---- norms ---------------------------------------------------------------------------------------

namespace {
const std::vector<Shape> kNormShapes = {Shape{3, 7}, Shape{2, 5, 100}, Shape{4, 1500}, Shape{1100, 33}};
}

TEST(CudaRows, RmsNormForwardAndBackwardEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 400;
  for (DType t : kFloatTypes) {
    for (const Shape& s : kNormShapes) {
      const int64_t D = s[s.ndim() - 1];
      const Tensor x = rnd(s, t, seed++), gy = rnd(s, t, seed++);
      const Tensor w = add(rnd(Shape{D}, DType::F32, seed++, 0.1f), ones(Shape{D}));
      for (bool with_w : {true, false}) {
        auto [xc, xg] = leaves(x);
        auto [wc, wg] = leaves(cast(w, t));
        const Tensor yc = rms_norm(xc, with_w ? wc : Tensor(), 1e-6f);
        const Tensor yg = rms_norm(xg, with_w ? wg : Tensor(), 1e-6f);
        const std::string what = label(with_w ? "rms_norm" : "rms_norm (no w)", t, s);
        expect_close(back(yg), yc.to_f32_vector(), tol(t), what.c_str());
        const auto want = with_w ? grads_of(yc, {xc, wc}, gy) : grads_of(yc, {xc}, gy);
        const auto got = with_w ? grads_of(yg, {xg, wg}, on_gpu(gy)) : grads_of(yg, {xg}, on_gpu(gy));
        expect_close(got[0], want[0], tol_backward(t), ("dx " + what).c_str());
        if (with_w) expect_close(got[1], want[1], tol_weight(t), ("dw " + what).c_str());
      }
    }
  }
}

TEST(CudaRows, LayerNormForwardAndBackwardEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  for (DType t : kFloatTypes) {
    for (const Shape& s : kNormShapes) {
      const int64_t D = s[s.ndim() - 1];
      // A large mean: the two-pass variance must hold on both sides.
      const Tensor x = cast(add(rnd(s, DType::F32, seed++), full(Shape{1}, 3.0)), t), gy = rnd(s, t, seed++);
      const Tensor w = add(rnd(Shape{D}, DType::F32, seed++, 0.1f), ones(Shape{D}));
      const Tensor b = rnd(Shape{D}, DType::F32, seed++, 0.1f);
      for (bool affine : {true, false}) {
        auto [xc, xg] = leaves(x);
        auto [wc, wg] = leaves(cast(w, t));
        auto [bc, bg] = leaves(cast(b, t));
        const Tensor yc = affine ? layer_norm(xc, wc, bc, 1e-5f) : layer_norm(xc, Tensor(), Tensor(), 1e-5f);
        const Tensor yg = affine ? layer_norm(xg, wg, bg, 1e-5f) : layer_norm(xg, Tensor(), Tensor(), 1e-5f);
        const std::string what = label(affine ? "layer_norm" : "layer_norm (no w, b)", t, s);
        expect_close(back(yg), yc.to_f32_vector(), tol(t), what.c_str());
        const auto want = affine ? grads_of(yc, {xc, wc, bc}, gy) : grads_of(yc, {xc}, gy);
        const auto got = affine ? grads_of(yg, {xg, wg, bg}, on_gpu(gy)) : grads_of(yg, {xg}, on_gpu(gy));
        expect_close(got[0], want[0], tol_backward(t), ("dx " + what).c_str());
        if (affine) {
          expect_close(got[1], want[1], tol_weight(t), ("dw " + what).c_str());
          expect_close(got[2], want[2], tol_weight(t), ("db " + what).c_str());
        }
      }
    }
  }
}

TEST(CudaRows, L2NormForwardAndBackwardEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 600;
  for (DType t : kFloatTypes) {
    for (const Shape& s : kNormShapes) {
      const int64_t D = s[s.ndim() - 1];
      // Row 0 is zero: its norm clamps to eps (the backward is then a plain scale; eps 1e-3
      // keeps that scale of g finite in F16).
      std::vector<float> v = rnd(s, DType::F32, seed++).to_f32_vector();
      for (int64_t j = 0; j < D; ++j) v[size_t(j)] = 0.0f;
      const Tensor x = cast(from_vector(v, s), t), gy = rnd(s, t, seed++);
      auto [xc, xg] = leaves(x);
      const Tensor yc = l2_norm(xc, 1e-3f), yg = l2_norm(xg, 1e-3f);
      const std::string what = label("l2_norm", t, s);
      expect_close(back(yg), yc.to_f32_vector(), tol(t), what.c_str());
      expect_close(grads_of(yg, {xg}, on_gpu(gy))[0], grads_of(yc, {xc}, gy)[0], tol_backward(t),
                   ("dx " + what).c_str());
    }
  }
}

TEST(CudaRows, NormsOfAStridedInputAndOfNoRows) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    const Tensor x = rnd(Shape{100, 6}, t, 700);
    const Tensor xt = transpose(x, 0, 1), gxt = transpose(on_gpu(x), 0, 1);
    expect_close(back(rms_norm(gxt)), rms_norm(xt).to_f32_vector(), tol(t), "rms_norm^T");
    expect_close(back(layer_norm(gxt)), layer_norm(xt).to_f32_vector(), tol(t), "layer_norm^T");
    expect_close(back(l2_norm(gxt)), l2_norm(xt).to_f32_vector(), tol(t), "l2_norm^T");
    const Tensor none = on_gpu(zeros(Shape{0, 16}, t));
    EXPECT_TRUE(back(rms_norm(none)).empty());
    EXPECT_TRUE(back(layer_norm(none)).empty());
    EXPECT_TRUE(back(l2_norm(none)).empty());
  }
}

// The backward kernels add into dw/db ("+="): called twice on a nonzero start, they give the
// start plus twice one call's gradient, as the CPU kernels do.
TEST(CudaRows, NormBackwardWeightGradientsAccumulate) {
  REQUIRE_GPU();
  const KernelRef<kern::RmsNorm> rms("rms_norm");
  const KernelRef<kern::RmsNormBackward> rms_bwd("rms_norm_backward");
  const KernelRef<kern::LayerNorm> ln("layer_norm");
  const KernelRef<kern::LayerNormBackward> ln_bwd("layer_norm_backward");
  const Shape s{1100, 33};  // more rows than the backward's row groups: groups sum several rows
  for (DType t : kFloatTypes) {
    const Tensor x = rnd(s, t, 800), g = rnd(s, t, 801), w = rnd(Shape{33}, t, 802), b = rnd(Shape{33}, t, 803);
    const Tensor start_w = rnd(Shape{33}, t, 804), start_b = rnd(Shape{33}, t, 805);
    // dw (and db) after `calls` backward calls on device d, starting from start_w / start_b.
    auto run = [&](Device d, int calls) {
      const Tensor xd = transfer(x, d), gd = transfer(g, d), wd = transfer(w, d), bd = transfer(b, d);
      Tensor y = empty(s, t, d), dx = empty(s, t, d);
      Tensor rstd = empty(Shape{1100}, DType::F32, d), mean = empty(Shape{1100}, DType::F32, d);
      Tensor rms_dw = transfer(contiguous_copy(start_w), d);
      rms(d)(xd, wd, 1e-6f, y, rstd);
      for (int i = 0; i < calls; ++i) rms_bwd(d)(xd, wd, rstd, gd, dx, rms_dw);
      Tensor ln_dw = transfer(contiguous_copy(start_w), d), ln_db = transfer(contiguous_copy(start_b), d);
      ln(d)(xd, wd, bd, 1e-5f, y, mean, rstd);
      for (int i = 0; i < calls; ++i) ln_bwd(d)(xd, wd, mean, rstd, gd, dx, ln_dw, ln_db);
      return std::vector<std::vector<float>>{back(rms_dw), back(ln_dw), back(ln_db)};
    };
    const auto want = run(Device::CPU, 2), got = run(Device::CUDA, 2), once = run(Device::CUDA, 1);
    const char* names[] = {"rms dw", "layer_norm dw", "layer_norm db"};
    const std::vector<float> sw = start_w.to_f32_vector(), sb = start_b.to_f32_vector();
    for (int k = 0; k < 3; ++k) {
      const std::string what = std::string(names[k]) + " " + type_name(t);
      expect_close(got[size_t(k)], want[size_t(k)], tol_weight(t), what.c_str());
      if (t != DType::F32) continue;
      // start + 2 (once - start), in f32 on the host.
      const std::vector<float>& st = k == 2 ? sb : sw;
      std::vector<float> twice(st.size());
      for (size_t j = 0; j < st.size(); ++j) twice[j] = st[j] + 2.0f * (once[size_t(k)][j] - st[j]);
      expect_close(got[size_t(k)], twice, 1e-4, names[k]);
    }
  }
}

TEST(CudaRows, RowKernelsAreRunToRunDeterministic) {
  REQUIRE_GPU();
  const Tensor x = rnd(Shape{3000, 257}, DType::F32, 900), gy = rnd(Shape{3000, 257}, DType::F32, 901);
  const Tensor w = rnd(Shape{257}, DType::F32, 902);
  auto once = [&] {
    Tensor xg = on_gpu(x), wg = on_gpu(w);
    xg.requires_grad_();
    wg.requires_grad_();
    const Tensor y = layer_norm(xg, wg, Tensor(), 1e-5f);
    std::vector<std::vector<float>> r = grads_of(y, {xg, wg}, on_gpu(gy));
    r.push_back(back(sum(on_gpu(x), 0)));
    r.push_back(back(cross_entropy(on_gpu(x), on_gpu(targets_for(3000, 257, 5, -100, 903)))));
    return r;
  };
  EXPECT_EQ(once(), once());
}

// ---- cross-entropy -------------------------------------------------------------------------------

TEST(CudaRows, CrossEntropyLossAndGradientEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 1000;
  struct Case {
    Shape s;
    bool weights;
    int32_t ignore;
    float normalizer;
    float grad;  // the loss's incoming gradient
  };
  const std::vector<Case> cases = {
      {Shape{6, 7}, false, -100, 0.0f, 1.0f},     {Shape{5, 100}, true, -100, 0.0f, 1.0f},
      {Shape{2, 3, 1500}, false, 3, 0.0f, 0.5f},  {Shape{4, 5000}, true, -100, 10.0f, 2.0f},
      {Shape{37, 33}, true, 0, 0.0f, 1.0f},
  };
  for (DType t : kFloatTypes) {
    for (const Case& c : cases) {
      const int64_t V = c.s[c.s.ndim() - 1], N = c.s.numel() / V;
      Shape rows = c.s;
      rows.pop_back();
      const Tensor logits = rnd(c.s, t, seed++, 3.0f);
      const Tensor tg = reshape(targets_for(N, V, 3, c.ignore, seed++), rows);
      CrossEntropyOptions oc, og;
      oc.ignore_index = og.ignore_index = c.ignore;
      oc.normalizer = og.normalizer = c.normalizer;
      if (c.weights) {
        // Weights in [0, 1), every 4th zero (a masked row).
        Generator g(seed++);
        std::vector<float> wv = rand(rows, g).to_f32_vector();
        for (size_t i = 0; i < wv.size(); i += 4) wv[i] = 0.0f;
        oc.weights = from_vector(wv, rows);
        og.weights = on_gpu(oc.weights);
      }
      auto [zc, zg] = leaves(logits);
      const Tensor lc = cross_entropy(zc, tg, oc), lg = cross_entropy(zg, on_gpu(tg), og);
      const std::string what = label("cross_entropy", t, c.s) + (c.weights ? " weighted" : "") + " ignore " +
                               std::to_string(c.ignore) + " normalizer " + std::to_string(c.normalizer);
      expect_close(back(lg), lc.to_f32_vector(), tol(t), what.c_str());
      const Tensor gc = full(Shape{}, c.grad, t), gg = on_gpu(gc);
      expect_close(grads_of(lg, {zg}, gg)[0], grads_of(lc, {zc}, gc)[0], tol_backward(t), ("d " + what).c_str());
    }
  }
}

TEST(CudaRows, CrossEntropyOfAStridedInputAndOfNothingCounted) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    // Logits [7, 40] as the transpose of [40, 7] (the op copies it to rows).
    const Tensor z = rnd(Shape{40, 7}, t, 1100);
    const Tensor tg = targets_for(7, 40, 0, -100, 1101);
    const Tensor lc = cross_entropy(transpose(z, 0, 1), tg);
    const Tensor lg = cross_entropy(transpose(on_gpu(z), 0, 1), on_gpu(tg));
    expect_close(back(lg), lc.to_f32_vector(), tol(t), ("cross_entropy^T " + type_name(t)).c_str());
    // Every target ignored: the loss is 0 (not NaN), and so is the gradient.
    const Tensor all_ignored = from_vector(std::vector<int32_t>(5, -100), Shape{5});
    Tensor zg = on_gpu(rnd(Shape{5, 100}, t, 1102));
    zg.requires_grad_();
    const Tensor l0 = cross_entropy(zg, on_gpu(all_ignored));
    EXPECT_EQ(back(l0), std::vector<float>{0.0f}) << name(t);
    EXPECT_EQ(grads_of(l0, {zg}, on_gpu(full(Shape{}, 1.0, t)))[0], std::vector<float>(500, 0.0f)) << name(t);
  }
}
