// The CUDA conv and misc kernels against the CPU, through the public ops (and autograd for the
// backward kernels): im2col / col2im (im2col's backward) and conv2d with strides, padding and
// dilation; ssm_conv (+backward) and conv1d; add_id; argsort and top_k with ties, NaN, -0 and
// infinities, rows in shared memory and rows past it (the global-scratch sort); the Gated
// DeltaNet q/k/v split with its L2 norms (+backward), directly and through
// gated_delta_rule_qkv (skipped while gated_delta_rule has no CUDA kernel). Inputs are seeded,
// in F32, F16 and BF16 where the CPU takes them, contiguous or strided views; where an op makes
// its inputs contiguous first, the kernels are also called directly on strided views.
// Tolerances (|got - want| <= rel * max(1, |want|)):
//  - exact: im2col (a copy), col2im (f32 adds in the CPU's order, then one rounding), add_id
//    (one f32 add), argsort / top_k (indices and values), v and dv (copies);
//  - ssm_conv, its dx, the split norms: F32 1e-5 (the same f32 terms in the same order, the
//    products possibly contracted to fma on one side only; the norms' sums in another order),
//    F16 2e-3 and BF16 1.6e-2 (those f32 results rounded to the type may land one ulp apart);
//  - ssm_conv's dw: sums over every (b, t) (f32 in order on the CPU, double in 8 strided
//    partials on the GPU), so F32 1e-4; F16 / BF16 as above;
//  - conv2d and gated_delta_rule_qkv add other kernels (matmul, the rule): F32 1e-4, F16 4e-3,
//    BF16 3.2e-2 (two ulps).
// Every test needs a GPU: without one it skips, or fails under TOY_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <algorithm>
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
double tol_sum(DType t) { return t == DType::F32 ? 1e-4 : tol(t); }
double tol_composite(DType t) { return t == DType::F32 ? 1e-4 : 2 * tol(t); }

std::string label(const std::string& what, DType t, const Shape& s) {
  return what + " " + std::string(name(t)) + s.str();
}

// Seeded normal values, cast to t.
Tensor rnd(const Shape& s, DType t, uint64_t seed, float std = 1.0f) {
  Generator g(seed);
  return cast(randn(s, g, 0.0f, std), t);
}

// A CPU leaf and its GPU copy, both tracking gradients.
std::pair<Tensor, Tensor> leaves(const Tensor& x) {
  Tensor c = x.detach(), d = on_gpu(x);
  c.requires_grad_();
  d.requires_grad_();
  return {c, d};
}

std::vector<std::vector<float>> grads_of(const Tensor& y, const std::vector<Tensor>& xs, const Tensor& gy) {
  std::vector<std::vector<float>> r;
  for (const Tensor& g : grad(y, xs, gy)) r.push_back(back(contiguous(g)));  // (a view's gradient may be strided)
  return r;
}

// Within rel (expect_close), except that an infinite `want` must be met exactly.
void expect_near(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
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

// The same values: NaN where want is NaN, equal elsewhere, zeros of the same sign.
void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: want NaN, got " << got[i];
      continue;
    }
    EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << what << " [" << i << "]: the sign of " << want[i];
  }
}

std::vector<int32_t> back_i32(const Tensor& t) { return transfer(t, Device::CPU).to_i32_vector(); }

}  // namespace

TEST(CudaMisc, EveryMiscKernelIsRegistered) {
  REQUIRE_GPU();
  EXPECT_TRUE(KernelRef<kern::Im2Col>("im2col").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::Col2Im>("col2im").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::SsmConv>("ssm_conv").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::SsmConvBackward>("ssm_conv_backward").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::AddId>("add_id").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::Argsort>("argsort").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::TopK>("top_k").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::GdnSplitNorm>("gdn_split_norm").available(Device::CUDA));
  EXPECT_TRUE(KernelRef<kern::GdnSplitNormBackward>("gdn_split_norm_backward").available(Device::CUDA));
}

// ---- conv ----------------------------------------------------------------------------------------

namespace {
struct ConvCase {
  Shape x;  // [N, C, H, W]
  int kh, kw;
  Conv2dOptions o;
};
// Overlapping windows, strides past the kernel (pixels no window reads), padding on each side,
// dilation, a kernel as large as the padded input.
const ConvCase kConvCases[] = {
    {Shape{2, 3, 7, 9}, 3, 3, {}},
    {Shape{1, 4, 10, 8}, 3, 2, {2, 3, 1, 2, 1, 1}},
    {Shape{2, 2, 11, 12}, 3, 3, {2, 2, 2, 2, 2, 3}},
    {Shape{3, 1, 6, 7}, 2, 4, {3, 1, 0, 3, 2, 1}},
    {Shape{1, 2, 9, 9}, 1, 2, {3, 2, 1, 0, 1, 1}},
    {Shape{1, 3, 3, 4}, 5, 6, {1, 1, 1, 1, 1, 1}},
};
std::string conv_label(const char* what, DType t, const ConvCase& c) {
  const Conv2dOptions& o = c.o;
  return label(what, t, c.x) + " k" + std::to_string(c.kh) + "x" + std::to_string(c.kw) + " s" +
         std::to_string(o.stride_h) + "," + std::to_string(o.stride_w) + " p" + std::to_string(o.pad_h) + "," +
         std::to_string(o.pad_w) + " d" + std::to_string(o.dilation_h) + "," + std::to_string(o.dilation_w);
}
}  // namespace

TEST(CudaMisc, Im2ColAndItsBackwardEqualTheCpuExactly) {
  REQUIRE_GPU();
  uint64_t seed = 10;
  for (DType t : kFloatTypes) {
    for (const ConvCase& c : kConvCases) {
      for (bool strided : {false, true}) {
        // The strided input: x stored as [N, H, W, C], viewed as [N, C, H, W].
        const Shape& s = c.x;
        const Tensor base = strided ? rnd(Shape{s[0], s[2], s[3], s[1]}, t, seed++) : rnd(s, t, seed++);
        auto [xc, xg] = leaves(base);
        const Tensor vc = strided ? permute(xc, {0, 3, 1, 2}) : xc;
        const Tensor vg = strided ? permute(xg, {0, 3, 1, 2}) : xg;
        const std::string what = conv_label(strided ? "im2col strided" : "im2col", t, c);
        const Tensor yc = im2col(vc, c.kh, c.kw, c.o), yg = im2col(vg, c.kh, c.kw, c.o);
        ASSERT_EQ(yg.shape(), yc.shape()) << what;
        expect_same(back(yg), yc.to_f32_vector(), what);
        const Tensor gy = rnd(yc.shape(), t, seed++);
        expect_same(grads_of(yg, {xg}, on_gpu(gy))[0], grads_of(yc, {xc}, gy)[0], "d " + what);
      }
    }
  }
}

TEST(CudaMisc, Conv2dForwardAndBackwardEqualTheCpu) {
  REQUIRE_GPU();
  uint64_t seed = 50;
  for (DType t : kFloatTypes) {
    for (const ConvCase& c : kConvCases) {
      const int64_t C = c.x[1], OC = 5;
      auto [xc, xg] = leaves(rnd(c.x, t, seed++));
      auto [wc, wg] = leaves(rnd(Shape{OC, C, c.kh, c.kw}, t, seed++, 0.5f));
      auto [bc, bg] = leaves(rnd(Shape{OC}, t, seed++));
      const std::string what = conv_label("conv2d", t, c);
      const Tensor yc = conv2d(xc, wc, bc, c.o), yg = conv2d(xg, wg, bg, c.o);
      expect_near(back(yg), yc.to_f32_vector(), tol_composite(t), what);
      const Tensor gy = rnd(yc.shape(), t, seed++);
      const auto want = grads_of(yc, {xc, wc, bc}, gy), got = grads_of(yg, {xg, wg, bg}, on_gpu(gy));
      for (size_t i = 0; i < want.size(); ++i)
        expect_near(got[i], want[i], tol_composite(t), ("d" + std::to_string(i) + " " + what));
    }
  }
}

TEST(CudaMisc, SsmConvAndItsBackwardEqualTheCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t B, TX, C, K;
  };
  // One step (T = 1), a single tap, channels past a 32-wide tile, a long sequence.
  const Case cases[] = {{2, 9, 5, 4}, {1, 4, 33, 4}, {3, 70, 40, 3}, {2, 300, 7, 1}, {2, 130, 70, 4}};
  uint64_t seed = 100;
  for (DType t : kFloatTypes) {
    for (const Case& c : cases) {
      for (bool strided : {false, true}) {
        // Strided: x stored [B, C, TX] and w stored [K, C], both viewed transposed.
        const Tensor xb = strided ? rnd(Shape{c.B, c.C, c.TX}, t, seed++) : rnd(Shape{c.B, c.TX, c.C}, t, seed++);
        const Tensor wb = strided ? rnd(Shape{c.K, c.C}, t, seed++, 0.5f) : rnd(Shape{c.C, c.K}, t, seed++, 0.5f);
        auto [xc, xg] = leaves(xb);
        auto [wc, wg] = leaves(wb);
        const auto view = [&](const Tensor& x, const Tensor& w) {
          return strided ? ssm_conv(transpose(x, 1, 2), transpose(w, 0, 1)) : ssm_conv(x, w);
        };
        const std::string what = label(strided ? "ssm_conv strided" : "ssm_conv", t, Shape{c.B, c.TX, c.C, c.K});
        const Tensor yc = view(xc, wc), yg = view(xg, wg);
        expect_near(back(yg), yc.to_f32_vector(), tol(t), what);
        const Tensor gy = rnd(yc.shape(), t, seed++);
        const auto want = grads_of(yc, {xc, wc}, gy), got = grads_of(yg, {xg, wg}, on_gpu(gy));
        expect_near(got[0], want[0], tol(t), ("dx " + what));
        expect_near(got[1], want[1], tol_sum(t), ("dw " + what));
      }
    }
  }
}

TEST(CudaMisc, SsmConvBackwardWithoutAWeightGradientAndConv1d) {
  REQUIRE_GPU();
  uint64_t seed = 150;
  for (DType t : kFloatTypes) {
    // Only x tracks gradients: the kernel gets an undefined dw.
    const Tensor x = rnd(Shape{2, 12, 6}, t, seed++), w = rnd(Shape{6, 4}, t, seed++, 0.5f);
    auto [xc, xg] = leaves(x);
    const Tensor yc = ssm_conv(xc, w), yg = ssm_conv(xg, on_gpu(w));
    const Tensor gy = rnd(yc.shape(), t, seed++);
    expect_near(grads_of(yg, {xg}, on_gpu(gy))[0], grads_of(yc, {xc}, gy)[0], tol(t), label("dx only", t, x.shape()));
    // conv1d: a left pad, ssm_conv and a bias.
    auto [x1c, x1g] = leaves(rnd(Shape{3, 17, 9}, t, seed++));
    auto [w1c, w1g] = leaves(rnd(Shape{9, 3}, t, seed++, 0.5f));
    auto [b1c, b1g] = leaves(rnd(Shape{9}, t, seed++));
    const Tensor zc = conv1d(x1c, w1c, b1c), zg = conv1d(x1g, w1g, b1g);
    const std::string what = label("conv1d", t, zc.shape());
    expect_near(back(zg), zc.to_f32_vector(), tol(t), what);
    const Tensor gz = rnd(zc.shape(), t, seed++);
    const auto want = grads_of(zc, {x1c, w1c, b1c}, gz), got = grads_of(zg, {x1g, w1g, b1g}, on_gpu(gz));
    for (size_t i = 0; i < want.size(); ++i)
      expect_near(got[i], want[i], tol_sum(t), ("d" + std::to_string(i) + " " + what));
  }
}

// ---- add_id --------------------------------------------------------------------------------------

TEST(CudaMisc, AddIdEqualsTheCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t T, U, N, E;
  };
  const Case cases[] = {{1, 1, 1, 1}, {5, 2, 7, 4}, {33, 4, 100, 8}};
  uint64_t seed = 200;
  for (const Case& c : cases) {
    for (bool strided : {false, true}) {
      Generator g(seed++);
      std::vector<int32_t> id(size_t(c.T * c.U));
      const std::vector<float> u = rand(Shape{c.T * c.U}, g, 0.0f, float(c.E)).to_f32_vector();
      for (size_t i = 0; i < id.size(); ++i) id[i] = std::min<int32_t>(int32_t(u[i]), int32_t(c.E - 1));
      const Tensor ids = from_vector(id, Shape{c.T, c.U});
      // Strided: x stored [N, U, T] viewed as [T, U, N].
      const Tensor xb = strided ? rnd(Shape{c.N, c.U, c.T}, DType::F32, seed++) : rnd(Shape{c.T, c.U, c.N}, DType::F32, seed++);
      auto [xc, xg] = leaves(xb);
      auto [bc, bg] = leaves(rnd(Shape{c.E, c.N}, DType::F32, seed++));
      const Tensor vc = strided ? permute(xc, {2, 1, 0}) : xc, vg = strided ? permute(xg, {2, 1, 0}) : xg;
      const std::string what = label(strided ? "add_id strided" : "add_id", DType::F32, Shape{c.T, c.U, c.N, c.E});
      const Tensor yc = add_id(vc, bc, ids), yg = add_id(vg, bg, on_gpu(ids));
      expect_same(back(yg), yc.to_f32_vector(), what);
      const Tensor gy = rnd(yc.shape(), DType::F32, seed++);
      const auto want = grads_of(yc, {xc, bc}, gy), got = grads_of(yg, {xg, bg}, on_gpu(gy));
      expect_same(got[0], want[0], "dx " + what);
      expect_near(got[1], want[1], tol(DType::F32), ("db " + what));
    }
  }
}

// The ops hand these kernels contiguous inputs; the kernels take strided views too (the backend's
// convention): each is called directly on the GPU with views of transposed storage, against the
// CPU kernel on contiguous copies.
TEST(CudaMisc, ConvAndAddIdKernelsReadStridedViews) {
  REQUIRE_GPU();
  // A [d0, d1, ...] view of [d1, d0, ...] storage on the GPU.
  const auto strided_gpu = [](const Tensor& t) { return transpose(on_gpu(contiguous(transpose(t, 0, 1))), 0, 1); };
  uint64_t seed = 250;
  for (DType t : kFloatTypes) {
    // im2col and col2im.
    const kern::Im2ColArgs a{3, 2, 2, 1, 1, 1, 1, 2};
    const Tensor x = rnd(Shape{2, 3, 7, 6}, t, seed++);
    const int64_t OH = (7 + 2 - 2 - 1) / 2 + 1, OW = (6 + 2 - 2 - 1) / 1 + 1;
    Tensor cc = empty(Shape{2, OH * OW, 3 * 3 * 2}, t), cg = empty(cc.shape(), t, Device::CUDA);
    KernelRef<kern::Im2Col>("im2col")(Device::CPU)(x, a, cc);
    KernelRef<kern::Im2Col>("im2col")(Device::CUDA)(strided_gpu(x), a, cg);
    expect_same(back(cg), cc.to_f32_vector(), label("im2col kernel, strided x", t, x.shape()));
    const Tensor cols = rnd(cc.shape(), t, seed++);
    Tensor dc = empty(x.shape(), t), dg = empty(x.shape(), t, Device::CUDA);
    KernelRef<kern::Col2Im>("col2im")(Device::CPU)(cols, a, dc);
    KernelRef<kern::Col2Im>("col2im")(Device::CUDA)(strided_gpu(cols), a, dg);
    expect_same(back(dg), dc.to_f32_vector(), label("col2im kernel, strided cols", t, cols.shape()));
    // ssm_conv and its backward (x [B, T+K-1, C], w [C, K], g [B, T, C]).
    const Tensor sx = rnd(Shape{3, 10, 5}, t, seed++), w = rnd(Shape{5, 3}, t, seed++, 0.5f);
    const Tensor g = rnd(Shape{3, 8, 5}, t, seed++);
    Tensor yc = empty(g.shape(), t), yg = empty(g.shape(), t, Device::CUDA);
    KernelRef<kern::SsmConv>("ssm_conv")(Device::CPU)(sx, w, yc);
    KernelRef<kern::SsmConv>("ssm_conv")(Device::CUDA)(strided_gpu(sx), strided_gpu(w), yg);
    expect_near(back(yg), yc.to_f32_vector(), tol(t), label("ssm_conv kernel, strided x and w", t, sx.shape()));
    Tensor dxc = empty(sx.shape(), t), dxg = empty(sx.shape(), t, Device::CUDA);
    Tensor dwc = rnd(w.shape(), t, seed++), dwg = on_gpu(dwc);  // (+=: from the same start)
    KernelRef<kern::SsmConvBackward>("ssm_conv_backward")(Device::CPU)(sx, w, g, dxc, dwc);
    KernelRef<kern::SsmConvBackward>("ssm_conv_backward")(Device::CUDA)(strided_gpu(sx), strided_gpu(w), strided_gpu(g),
                                                                       dxg, dwg);
    expect_near(back(dxg), dxc.to_f32_vector(), tol(t), label("ssm_conv_backward dx, strided inputs", t, sx.shape()));
    expect_near(back(dwg), dwc.to_f32_vector(), tol_sum(t), label("ssm_conv_backward dw +=, strided inputs", t, w.shape()));
  }
  // add_id (F32 only): x, b and ids strided.
  const Tensor x = rnd(Shape{6, 3, 10}, DType::F32, seed++), b = rnd(Shape{4, 10}, DType::F32, seed++);
  const Tensor ids = from_vector(std::vector<int32_t>{0, 3, 1, 2, 2, 0, 3, 3, 1, 0, 1, 2, 0, 0, 3, 2, 1, 1}, Shape{6, 3});
  Tensor oc = empty(x.shape(), DType::F32), og = empty(x.shape(), DType::F32, Device::CUDA);
  KernelRef<kern::AddId>("add_id")(Device::CPU)(x, b, ids, oc);
  KernelRef<kern::AddId>("add_id")(Device::CUDA)(strided_gpu(x), strided_gpu(b), strided_gpu(ids), og);
  expect_same(back(og), oc.to_f32_vector(), "add_id kernel, strided x, b and ids");
}

// ---- argsort / top_k -----------------------------------------------------------------------------

namespace {
// Values on a coarse grid (ties), with NaN, +-inf and -0 / +0 sprinkled in every `every`-th row.
Tensor sort_input(const Shape& s, DType t, uint64_t seed, bool specials) {
  Generator g(seed);
  std::vector<float> v = randn(s, g).to_f32_vector();
  for (float& e : v) e = std::round(e * 2.0f) / 2.0f;
  const int64_t L = s[s.ndim() - 1];
  if (specials && L > 0)
    for (int64_t r = 0; r * L < int64_t(v.size()); r += 2) {
      float* row = v.data() + r * L;
      const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, NAN, -INFINITY, -0.0f};
      for (int64_t j = 0; j < 8; ++j) row[(j * 7 + r) % L] = special[j];
    }
  return cast(from_vector(v, s), t);
}

void expect_sorts_equal(const Tensor& x, const Tensor& gx, const std::string& what) {
  for (bool descending : {false, true}) {
    const std::string w = what + (descending ? " descending" : " ascending");
    EXPECT_EQ(back_i32(argsort(gx, descending)), argsort(x, descending).to_i32_vector()) << "argsort " << w;
  }
  const int64_t L = x.size(-1);
  for (int64_t k : {int64_t(1), int64_t(3), L / 2, L}) {
    if (k > L) continue;
    const auto [vc, ic] = top_k(x, k);
    const auto [vg, ig] = top_k(gx, k);
    EXPECT_EQ(back_i32(ig), ic.to_i32_vector()) << "top_k indices " << what << " k " << k;
    expect_same(back(vg), vc.to_f32_vector(), "top_k values " + what + " k " + std::to_string(k));
  }
}
}  // namespace

TEST(CudaMisc, ArgsortAndTopKEqualTheCpuWithTiesNanAndInfinities) {
  REQUIRE_GPU();
  // Rows shorter than a warp, not a power of two, exactly the shared-memory sort's 4096, and
  // longer (the global-scratch sort), several rows each.
  const std::vector<Shape> shapes = {Shape{1}, Shape{5, 7}, Shape{3, 2, 100}, Shape{4, 1000}, Shape{2, 4096},
                                     Shape{3, 5000}, Shape{1, 20000}};
  uint64_t seed = 300;
  for (DType t : kFloatTypes) {
    for (const Shape& s : shapes) {
      for (bool specials : {false, true}) {
        const Tensor x = sort_input(s, t, seed++, specials);
        expect_sorts_equal(x, on_gpu(x), label(specials ? "x with NaN" : "x", t, s));
      }
    }
  }
}

TEST(CudaMisc, ArgsortAndTopKOfStridedAndEmptyInputs) {
  REQUIRE_GPU();
  for (DType t : kFloatTypes) {
    // Rows along a strided axis: the transpose of [300, 6].
    const Tensor base = sort_input(Shape{300, 6}, t, 400, true);
    expect_sorts_equal(transpose(base, 0, 1), transpose(on_gpu(base), 0, 1), label("x^T", t, Shape{6, 300}));
    // No rows, empty rows, k = 0.
    const Tensor none = zeros(Shape{0, 5}, t), empty_rows = zeros(Shape{3, 0}, t);
    EXPECT_TRUE(back_i32(argsort(on_gpu(none))).empty()) << name(t);
    EXPECT_TRUE(back_i32(argsort(on_gpu(empty_rows))).empty()) << name(t);
    const auto [v0, i0] = top_k(on_gpu(sort_input(Shape{4, 9}, t, 401, false)), 0);
    EXPECT_EQ(v0.shape(), (Shape{4, 0})) << name(t);
    EXPECT_TRUE(back_i32(i0).empty()) << name(t);
  }
}

TEST(CudaMisc, TopKPutsNanFirstAndBreaksTiesByPosition) {
  REQUIRE_GPU();
  const float nan = NAN, inf = INFINITY;
  const std::vector<float> v = {1, nan, 3, -0.0f, 3, 0.0f, inf, nan, -inf, 1};
  for (DType t : kFloatTypes) {
    const Tensor x = cast(from_vector(v, Shape{1, 10}), t);
    const auto [vals, idx] = top_k(on_gpu(x), 10);
    EXPECT_EQ(back_i32(idx), (std::vector<int32_t>{1, 7, 6, 2, 4, 0, 9, 3, 5, 8})) << name(t);
    EXPECT_EQ(back_i32(argsort(on_gpu(x))), (std::vector<int32_t>{8, 3, 5, 0, 9, 2, 4, 6, 1, 7})) << name(t);
    const std::vector<float> got = back(vals);
    EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[1])) << name(t);
    EXPECT_TRUE(std::signbit(got[7]) && !std::signbit(got[8])) << name(t) << ": -0 (position 3) before 0 (position 5)";
  }
}

// ---- Gated DeltaNet split ------------------------------------------------------------------------

namespace {
// c [B, T, (2 Hk + Hv) D] with q head 1 of row 0 and k head 0 of row 1 all zeros (norm
// clamped at eps) and one tiny head (norm just under eps).
Tensor gdn_input(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t D, uint64_t seed, float eps) {
  const int64_t C = (2 * Hk + Hv) * D;
  std::vector<float> v = rnd(Shape{B, T, C}, DType::F32, seed).to_f32_vector();
  if (Hk > 1) std::fill_n(v.begin() + D, D, 0.0f);
  if (B * T > 1) std::fill_n(v.begin() + C + Hk * D, D, 0.0f);
  if (B * T > 2)
    for (int64_t j = 0; j < D; ++j) v[size_t(2 * C + j)] = 0.5f * eps / std::sqrt(float(D));
  return from_vector(v, Shape{B, T, C});
}
}  // namespace

TEST(CudaMisc, GdnSplitNormAndItsBackwardEqualTheCpu) {
  REQUIRE_GPU();
  const KernelRef<kern::GdnSplitNorm> k_split("gdn_split_norm");
  const KernelRef<kern::GdnSplitNormBackward> k_split_bwd("gdn_split_norm_backward");
  struct Case {
    int64_t B, T, Hk, Hv, D;
  };
  const Case cases[] = {{1, 1, 1, 1, 4}, {2, 3, 2, 4, 32}, {1, 5, 2, 2, 100}, {2, 2, 1, 3, 8}};
  const float eps = 1e-6f;
  uint64_t seed = 500;
  for (const Case& cs : cases) {
    for (bool strided : {false, true}) {
      const int64_t B = cs.B, T = cs.T, Hk = cs.Hk, Hv = cs.Hv, D = cs.D, C = (2 * Hk + Hv) * D;
      const float q_scale = 1.0f / std::sqrt(float(D));
      const Tensor c = gdn_input(B, T, Hk, Hv, D, seed++, eps);
      // Strided: c stored [T, B, C], viewed as [B, T, C] (the CPU kernel reads c as contiguous:
      // it gets c itself, as the op gives it).
      const Tensor cg = strided ? transpose(on_gpu(contiguous(transpose(c, 0, 1))), 0, 1) : on_gpu(c);
      const std::string what = label(strided ? "gdn_split_norm strided" : "gdn_split_norm", DType::F32,
                                     Shape{B, T, Hk, Hv, D});
      struct Out {
        Tensor q, k, v, qi, ki;
      };
      const auto run = [&](const Tensor& in, Device d) {
        Out o{empty(Shape{B, T, Hk, D}, DType::F32, d), empty(Shape{B, T, Hk, D}, DType::F32, d),
              empty(Shape{B, T, Hv, D}, DType::F32, d), empty(Shape{B, T, Hk}, DType::F32, d),
              empty(Shape{B, T, Hk}, DType::F32, d)};
        k_split(d)(in, Hk, Hv, D, eps, q_scale, o.q, o.k, o.v, o.qi, o.ki);
        return o;
      };
      const Out want = run(c, Device::CPU), got = run(cg, Device::CUDA);
      expect_near(back(got.q), want.q.to_f32_vector(), tol(DType::F32), ("q " + what));
      expect_near(back(got.k), want.k.to_f32_vector(), tol(DType::F32), ("k " + what));
      expect_same(back(got.v), want.v.to_f32_vector(), "v " + what);
      // inv is 1/eps (1e6) where clamped: relative to |want|.
      expect_near(back(got.qi), want.qi.to_f32_vector(), tol(DType::F32), ("q_inv " + what));
      expect_near(back(got.ki), want.ki.to_f32_vector(), tol(DType::F32), ("k_inv " + what));
      // The backward from the CPU's forward results (so both sides start from the same bits).
      const Tensor dq = rnd(want.q.shape(), DType::F32, seed++), dk = rnd(want.k.shape(), DType::F32, seed++);
      const Tensor dv = rnd(want.v.shape(), DType::F32, seed++);
      Tensor dcc = empty(Shape{B, T, C}, DType::F32), dcg = empty(Shape{B, T, C}, DType::F32, Device::CUDA);
      k_split_bwd(Device::CPU)(want.q, want.k, want.qi, want.ki, eps, q_scale, dq, dk, dv, dcc);
      // (strided: the GPU reads dq, dk and dv through [T, B, ...] storage)
      const auto gpu_in = [&](const Tensor& t) {
        return strided ? transpose(on_gpu(contiguous(transpose(t, 0, 1))), 0, 1) : on_gpu(t);
      };
      k_split_bwd(Device::CUDA)(on_gpu(want.q), on_gpu(want.k), on_gpu(want.qi), on_gpu(want.ki), eps, q_scale,
                                gpu_in(dq), gpu_in(dk), gpu_in(dv), dcg);
      expect_near(back(dcg), dcc.to_f32_vector(), tol(DType::F32), ("dc " + what));
    }
  }
}

TEST(CudaMisc, GatedDeltaRuleQkvEqualsTheCpu) {
  REQUIRE_GPU();
  if (!KernelRef<kern::GatedDeltaRule>("gated_delta_rule").available(Device::CUDA) ||
      !KernelRef<kern::GatedDeltaRuleBackward>("gated_delta_rule_backward").available(Device::CUDA))
    GTEST_SKIP() << "gated_delta_rule has no CUDA kernel in this build (the split is checked on its own above)";
  const int64_t B = 2, T = 5, Hk = 2, Hv = 4, D = 16;
  const float eps = 1e-3f;  // (the clamped heads' gradients, 1/eps times dy, stay finite in F16)
  uint64_t seed = 600;
  for (DType t : kFloatTypes) {
    auto [cc, cg] = leaves(cast(gdn_input(B, T, Hk, Hv, D, seed++, eps), t));
    auto [gc, gg] = leaves(cast(mul(rnd(Shape{B, T, Hv}, DType::F32, seed++), full(Shape{1}, -0.1, DType::F32)), t));
    auto [bc, bg] = leaves(cast(sigmoid(rnd(Shape{B, T, Hv}, DType::F32, seed++)), t));
    const std::string what = label("gated_delta_rule_qkv", t, cc.shape());
    const auto [oc, sc] = gated_delta_rule_qkv(cc, gc, bc, Hk, Hv, D, eps);
    const auto [og, sg] = gated_delta_rule_qkv(cg, gg, bg, Hk, Hv, D, eps);
    expect_near(back(og), oc.to_f32_vector(), tol_composite(t), ("o " + what));
    expect_near(back(sg), sc.to_f32_vector(), tol_composite(t), ("state " + what));
    const Tensor go = rnd(oc.shape(), t, seed++);
    const auto want = grads_of(oc, {cc, gc, bc}, go), got = grads_of(og, {cg, gg, bg}, on_gpu(go));
    for (size_t i = 0; i < want.size(); ++i)
      expect_near(got[i], want[i], tol_composite(t), ("d" + std::to_string(i) + " " + what));
  }
}
