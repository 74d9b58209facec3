// Matmuls (cuBLASLt) and fused attention on the GPU against the CPU, forward and backward, on
// seeded random inputs with poisoned outputs (gpu_test_util.h). Tolerances: F32 products differ
// from OpenBLAS's only in summation order (1e-5 relative to the row's scale at these sizes);
// F16/BF16 outputs are rounded once from an f32 accumulator on both sides, so they differ by at
// most one unit of the last place where the sums round differently (2^-7 for BF16, 2^-10 F16).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {

// f on the CPU and on the GPU copies of `inputs`; then the backward of sum(f * upstream) on
// both; outputs and every input's gradient compared within rel.
void expect_parity(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                   double rel, const char* what, bool backward = true) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : inputs) {
    cpu.push_back(contiguous(x).detach().requires_grad_(backward && is_float(x.dtype())));
    gpu.push_back(on_gpu(contiguous(x)).requires_grad_(backward && is_float(x.dtype())));
  }
  Tensor yc = f(cpu), yg = f(gpu);
  ASSERT_EQ(yg.device(), Device::CUDA) << what;
  expect_close(back(yg), yc.to_f32_vector(), rel, what);
  if (!backward) return;
  Generator g(99);
  Tensor up = cast(randn(yc.shape(), g), yc.dtype());
  yc.backward(up);
  yg.backward(on_gpu(up));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].requires_grad()) continue;
    ASSERT_TRUE(gpu[i].grad().defined()) << what << ": input " << i;
    expect_close(back(gpu[i].grad()), cpu[i].grad().to_f32_vector(), rel, what);
  }
}

}  // namespace

TEST(CudaMatmul, F32ProductsOfEveryLayoutEqualTheCpu) {
  REQUIRE_GPU();
  Generator g(11);
  Tensor a = randn(Shape{37, 53}, g), b = randn(Shape{53, 29}, g);
  expect_parity([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {a, b}, 1e-5, "a b");
  Tensor at = randn(Shape{53, 37}, g), bt = randn(Shape{29, 53}, g);
  expect_parity([](const std::vector<Tensor>& x) { return matmul(x[0], x[1], true, true); }, {at, bt}, 1e-5,
                "a^T b^T");
  // Batched, with b broadcast over the batch.
  Tensor ab = randn(Shape{3, 4, 17, 24}, g), bb = randn(Shape{24, 9}, g);
  expect_parity([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {ab, bb}, 1e-5, "batched");
  // A batch no single stride walks: a permuted view.
  Tensor ap = randn(Shape{5, 3, 8, 6}, g), bp = randn(Shape{3, 5, 6, 7}, g);
  expect_parity([](const std::vector<Tensor>& x) { return matmul(permute(x[0], {1, 0, 2, 3}), x[1]); }, {ap, bp},
                1e-5, "permuted batch");
  // Odd sizes and a single row (decode).
  Tensor a1 = randn(Shape{1, 769}, g), b1 = randn(Shape{769, 3}, g);
  expect_parity([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {a1, b1}, 1e-5, "one row");
}

TEST(CudaMatmul, HalfPrecisionProductsRoundOnceAsTheCpuDoes) {
  REQUIRE_GPU();
  Generator g(12);
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor a = cast(randn(Shape{2, 33, 64}, g), t), b = cast(randn(Shape{64, 48}, g), t);
    const double rel = t == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
    expect_parity([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); }, {a, b}, rel, name(t).data(),
                  false);
  }
}

TEST(CudaMatmul, LinearWithF32F16AndBf16WeightsEqualsTheCpu) {
  REQUIRE_GPU();
  Generator g(13);
  Tensor x = randn(Shape{2, 7, 96}, g), bias = randn(Shape{40}, g);
  Tensor w = randn(Shape{40, 96}, g);
  expect_parity([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); }, {x, w, bias}, 1e-5,
                "f32 weight");
  for (DType t : {DType::BF16, DType::F16}) {
    // A stored half weight (frozen): x rounded to its type on both sides, f32 accumulation.
    Tensor wt = cast(w, t);
    std::vector<Tensor> cpu{x.detach().requires_grad_(true)}, gpu{on_gpu(x).requires_grad_(true)};
    Tensor yc = linear(cpu[0], wt), yg = linear(gpu[0], on_gpu(wt));
    expect_close(back(yg), yc.to_f32_vector(), 1e-5, name(t).data());
    Tensor up = randn(yc.shape(), g);
    yc.backward(up);
    yg.backward(on_gpu(up));
    expect_close(back(gpu[0].grad()), cpu[0].grad().to_f32_vector(), 1e-5, name(t).data());
  }
}

TEST(CudaMatmul, AQuantizedWeightIsRefusedByName) {
  REQUIRE_GPU();
  Generator g(14);
  Tensor w = cast(randn(Shape{8, 64}, g), DType::Q8_0);
  try {
    (void)linear(on_gpu(randn(Shape{2, 64}, g)), on_gpu(w));
    FAIL() << "a Q8_0 weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

TEST(CudaAttention, ForwardAndBackwardEqualTheCpuForEveryMask) {
  REQUIRE_GPU();
  Generator g(21);
  struct Case {
    int64_t B, T, S, H, Hkv, D, Dv;
    bool causal;
    int64_t window;
    bool segments;
    const char* what;
  };
  const Case cases[] = {
      {2, 19, 19, 4, 4, 32, 32, true, 0, false, "causal"},
      {1, 23, 23, 6, 2, 64, 64, true, 0, false, "gqa"},
      {2, 17, 17, 2, 1, 80, 80, true, 5, false, "window, head of 80"},
      {1, 24, 24, 2, 2, 16, 16, true, 0, true, "segments"},
      {2, 13, 13, 3, 3, 48, 40, false, 0, false, "non-causal, Dv != D"},
      {1, 1, 12, 4, 2, 64, 64, true, 0, false, "one query over a cache"},
      {1, 5, 12, 2, 2, 128, 128, true, 0, false, "a prompt chunk after a cache"},
  };
  for (const Case& c : cases) {
    Tensor q = randn(Shape{c.B, c.T, c.H, c.D}, g), k = randn(Shape{c.B, c.S, c.Hkv, c.D}, g);
    Tensor v = randn(Shape{c.B, c.S, c.Hkv, c.Dv}, g);
    std::vector<int32_t> seg;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t) seg.push_back(int32_t(t < 7 ? 0 : t < 15 ? 1 : 2));
    Tensor segments = from_vector(seg, Shape{c.B, c.T});
    expect_parity(
        [&](const std::vector<Tensor>& x) {
          AttentionOptions o;
          o.causal = c.causal;
          o.window = c.window;
          if (c.segments) o.segments = x[0].device() == Device::CUDA ? on_gpu(segments) : segments;
          return attention(x[0], x[1], x[2], o);
        },
        {q, k, v}, 1e-5, c.what);
  }
}

TEST(CudaAttention, APackedQkvGradientComesBackPacked) {
  REQUIRE_GPU();
  Generator g(22);
  Tensor qkv = randn(Shape{2, 11, 4 + 2 * 2, 32}, g);
  expect_parity([](const std::vector<Tensor>& x) { return attention_qkv(x[0], 4, 2); }, {qkv}, 1e-5, "qkv");
}
