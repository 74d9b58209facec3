// The unary CUDA kernels (unary.cu) against the CPU: every unary op forward and backward in
// every float dtype (contiguous and transposed inputs, ±0, ±inf and NaN included), swiglu in
// both forms, dropout, random fills and arange. Outputs start poisoned (gpu_test_util.h).
// Tolerances, |got - want| <= rel * max(1, |want|), NaN for NaN and the same infinity:
//  - F32 1e-5: the kernels evaluate the CPU's formulas with the device's expf/logf/tanhf/
//    log1pf (<= 2 ulp) where the CPU has its own vector approximations (a few ulp; its tanh up
//    to ~25 ulp where 2 sigmoid(2x) - 1 cancels), so results differ by well under 1e-6 relative
//    (host_unary_math.cpp checks the same functions against the CPU within 2e-6).
//  - F16 2e-3 and BF16 1e-2: both sides round one f32 result to nearest even, so they differ
//    by at most one unit in the last place (2^-10 and 2^-7 relative) where the f32 results
//    straddle a rounding boundary.
//  - The random kernels and arange: the same bits (Philox and the transforms are exact), but
//    normal draws within 4e-7 relative (their log and cos are taken in double on the GPU; the
//    CPU's are the C library's floats, not always correctly rounded); F16/BF16 normal fills
//    within one unit of the last place.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::gpu_test;

namespace {

const KernelRef<kern::Unary> k_unary("unary");
const KernelRef<kern::UnaryBackward> k_unary_bwd("unary_backward");
const KernelRef<kern::Swiglu> k_swiglu("swiglu");
const KernelRef<kern::SwigluBackward> k_swiglu_bwd("swiglu_backward");

constexpr int kNumOps = 16;
const char* const kOpNames[kNumOps] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "square", "abs", "tanh",
    "sigmoid", "relu", "silu", "gelu_tanh", "gelu_erf", "scale", "clamp", "softplus"};

const DType kFloatTypes[] = {DType::F32, DType::F16, DType::BF16};

std::string dt_name(DType t) { return std::string(name(t)); }

double tolerance(DType t) { return t == DType::F32 ? 1e-5 : t == DType::F16 ? 2e-3 : 1e-2; }

kern::UnaryArgs args_for(kern::UnaryOp op) {
  kern::UnaryArgs a;
  if (op == kern::UnaryOp::Scale) a.alpha = -1.75f;
  if (op == kern::UnaryOp::Clamp) a.lo = -1.5f, a.hi = 2.0f;
  return a;
}

// NaN for NaN, the same infinity, otherwise within rel * max(1, |want|).
void expect_agree(const std::vector<float>& got, const std::vector<float>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    bool ok;
    if (std::isnan(want[i]))
      ok = std::isnan(got[i]);
    else if (std::isinf(want[i]))
      ok = got[i] == want[i];
    else
      ok = std::isfinite(got[i]) &&
           std::fabs(double(got[i]) - double(want[i])) <= rel * std::max(1.0, std::fabs(double(want[i])));
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << " [" << i << "]: gpu " << got[i] << ", cpu " << want[i];
    }
  }
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      ++bad;
      ADD_FAILURE() << what << " [" << i << "]: gpu " << got[i] << ", cpu " << want[i];
    }
}

// [rows, cols] of inputs for op: random (positive for log, sqrt, rsqrt), with the first row
// holding special values.
Tensor unary_input(kern::UnaryOp op, int64_t rows, int64_t cols, uint64_t seed) {
  Generator g(seed);
  const bool positive = op == kern::UnaryOp::Log || op == kern::UnaryOp::Sqrt || op == kern::UnaryOp::Rsqrt;
  Tensor r = randn(Shape{rows, cols}, g, 0.0f, positive ? 1.0f : 4.0f);
  std::vector<float> v = (positive ? exp(r) : r).to_f32_vector();
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 100.0f, -100.0f, 30.0f, -30.0f, 20.0f, 1e-30f,
                            -1e-30f, 0.0625f, -1.28f, 88.0f, -90.0f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0] && i < size_t(cols); ++i) v[i] = specials[i];
  return from_vector(v, Shape{rows, cols});
}

// op's forward of x (any layout) on the CPU and on the GPU.
void check_forward(kern::UnaryOp op, const Tensor& x_cpu, const Tensor& x_gpu, const std::string& what) {
  const kern::UnaryArgs a = args_for(op);
  Tensor yc = empty(x_cpu.shape(), x_cpu.dtype());
  Tensor yg = empty(x_gpu.shape(), x_gpu.dtype(), Device::CUDA);
  k_unary(Device::CPU)(op, x_cpu, yc, a);
  k_unary(Device::CUDA)(op, x_gpu, yg, a);
  expect_agree(back(yg), yc.to_f32_vector(), tolerance(x_cpu.dtype()), what);
}

}  // namespace

TEST(CudaUnary, EveryOpForwardEqualsTheCpu) {
  REQUIRE_GPU();
  for (int o = 0; o < kNumOps; ++o) {
    const kern::UnaryOp op = kern::UnaryOp(o);
    for (DType t : kFloatTypes) {
      const std::string what = std::string(kOpNames[o]) + " " + dt_name(t);
      Tensor x = cast(unary_input(op, 37, 29, 100 + uint64_t(o)), t);
      check_forward(op, x, on_gpu(x), what);
      // A transposed view (strides 1, 29).
      check_forward(op, transpose(x), transpose(on_gpu(x)), what + " transposed");
    }
  }
  // No elements: nothing to launch.
  Tensor none = empty(Shape{0, 3}, DType::F32, Device::CUDA), out = empty(Shape{0, 3}, DType::F32, Device::CUDA);
  k_unary(Device::CUDA)(kern::UnaryOp::Exp, none, out, {});
  EXPECT_EQ(out.numel(), 0);
}

TEST(CudaUnary, EveryOpBackwardEqualsTheCpu) {
  REQUIRE_GPU();
  for (int o = 0; o < kNumOps; ++o) {
    const kern::UnaryOp op = kern::UnaryOp(o);
    const kern::UnaryArgs a = args_for(op);
    for (DType t : kFloatTypes) {
      const std::string what = std::string(kOpNames[o]) + "' " + dt_name(t);
      Tensor x = cast(unary_input(op, 29, 37, 200 + uint64_t(o)), t);
      Generator gen(300 + uint64_t(o));
      Tensor g = cast(randn(Shape{29, 37}, gen), t);
      for (bool strided : {false, true}) {
        // Strided: x and g transposed views; y (the forward's output) contiguous.
        Tensor xc = strided ? transpose(x) : x, gc = strided ? transpose(g) : g;
        Tensor y = empty(xc.shape(), t);
        k_unary(Device::CPU)(op, xc, y, a);
        Tensor want = empty(xc.shape(), t);
        k_unary_bwd(Device::CPU)(op, xc, y, gc, want, a);
        Tensor xg = strided ? transpose(on_gpu(x)) : on_gpu(x), gg = strided ? transpose(on_gpu(g)) : on_gpu(g);
        Tensor got = empty(xc.shape(), t, Device::CUDA);
        k_unary_bwd(Device::CUDA)(op, xg, on_gpu(y), gg, got, a);  // the same y on both sides
        expect_agree(back(got), want.to_f32_vector(), tolerance(t), what + (strided ? " strided" : ""));
      }
    }
  }
}

TEST(CudaUnary, AutogradThroughTheOpsEqualsTheCpu) {
  REQUIRE_GPU();
  struct Case {
    const char* name;
    Tensor (*f)(const Tensor&);
  };
  const Case cases[] = {
      {"gelu tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }},
      {"gelu erf", [](const Tensor& x) { return gelu(x, GeluApprox::None); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5f, 1.0f); }},
      {"exp of scale", [](const Tensor& x) { return exp(scale(x, 0.5f)); }},
      {"abs then sqrt", [](const Tensor& x) { return sqrt(add_scalar(abs(x), 0.1f)); }},
  };
  Generator gen(400);
  Tensor x = randn(Shape{16, 33}, gen, 0.0f, 3.0f), up = randn(Shape{16, 33}, gen);
  for (const Case& c : cases) {
    Tensor xc = x.detach().requires_grad_(true), xg = on_gpu(x).requires_grad_(true);
    Tensor yc = c.f(xc), yg = c.f(xg);
    ASSERT_EQ(yg.device(), Device::CUDA) << c.name;
    expect_agree(back(yg), yc.to_f32_vector(), 1e-5, c.name);
    yc.backward(up);
    yg.backward(on_gpu(up));
    ASSERT_TRUE(xg.grad().defined()) << c.name;
    expect_agree(back(xg.grad()), xc.grad().to_f32_vector(), 1e-5, std::string(c.name) + " grad");
  }
}

TEST(CudaUnary, InPlaceScaleEqualsTheCpu) {
  REQUIRE_GPU();
  Generator gen(500);
  for (DType t : kFloatTypes) {
    Tensor x = cast(randn(Shape{1001}, gen), t);
    Tensor xg = on_gpu(x), xc = contiguous_copy(x);
    scale_(xc, -0.3f);
    scale_(xg, -0.3f);
    expect_agree(back(xg), xc.to_f32_vector(), tolerance(t), std::string("scale_ ") + dt_name(t));
  }
}

TEST(CudaUnary, SwigluBothFormsForwardAndBackwardEqualTheCpu) {
  REQUIRE_GPU();
  Generator gen(600);
  for (DType t : kFloatTypes) {
    const double rel = tolerance(t);
    const std::string dt = dt_name(t);
    Tensor a = cast(randn(Shape{7, 45}, gen, 0.0f, 3.0f), t), b = cast(randn(Shape{7, 45}, gen), t);
    Tensor up = cast(randn(Shape{7, 45}, gen), t);
    // Two inputs, through the op and autograd.
    {
      Tensor ac = a.detach().requires_grad_(true), bc = b.detach().requires_grad_(true);
      Tensor ag = on_gpu(a).requires_grad_(true), bg = on_gpu(b).requires_grad_(true);
      Tensor yc = swiglu(ac, bc), yg = swiglu(ag, bg);
      expect_agree(back(yg), yc.to_f32_vector(), rel, "swiglu " + dt);
      yc.backward(up);
      yg.backward(on_gpu(up));
      expect_agree(back(ag.grad()), ac.grad().to_f32_vector(), rel, "swiglu da " + dt);
      expect_agree(back(bg.grad()), bc.grad().to_f32_vector(), rel, "swiglu db " + dt);
    }
    // The kernels on transposed views.
    {
      Tensor at = transpose(a), bt = transpose(b), gt = transpose(up);
      Tensor oc = empty(at.shape(), t), dac = empty(at.shape(), t), dbc = empty(at.shape(), t);
      k_swiglu(Device::CPU)(at, bt, oc);
      k_swiglu_bwd(Device::CPU)(at, bt, gt, dac, dbc);
      Tensor og = empty(at.shape(), t, Device::CUDA), dag = empty(at.shape(), t, Device::CUDA),
             dbg = empty(at.shape(), t, Device::CUDA);
      k_swiglu(Device::CUDA)(transpose(on_gpu(a)), transpose(on_gpu(b)), og);
      k_swiglu_bwd(Device::CUDA)(transpose(on_gpu(a)), transpose(on_gpu(b)), transpose(on_gpu(up)), dag, dbg);
      expect_agree(back(og), oc.to_f32_vector(), rel, "swiglu transposed " + dt);
      expect_agree(back(dag), dac.to_f32_vector(), rel, "swiglu transposed da " + dt);
      expect_agree(back(dbg), dbc.to_f32_vector(), rel, "swiglu transposed db " + dt);
    }
    // The packed form: x [3, 5, 2F] with F = 45 (its gradient in one buffer).
    {
      Tensor x = cast(randn(Shape{3, 5, 90}, gen, 0.0f, 3.0f), t), gp = cast(randn(Shape{3, 5, 45}, gen), t);
      Tensor xc = x.detach().requires_grad_(true), xg = on_gpu(x).requires_grad_(true);
      Tensor yc = swiglu(xc), yg = swiglu(xg);
      expect_agree(back(yg), yc.to_f32_vector(), rel, "swiglu packed " + dt);
      yc.backward(gp);
      yg.backward(on_gpu(gp));
      expect_agree(back(xg.grad()), xc.grad().to_f32_vector(), rel, "swiglu packed dx " + dt);
    }
  }
}

TEST(CudaUnary, DropoutGivesTheCpuBits) {
  REQUIRE_GPU();
  Generator data(700);
  for (DType t : kFloatTypes) {
    Tensor x = cast(randn(Shape{3, 1001}, data), t);  // 3003: a partial last block of 4
    Tensor up = cast(randn(Shape{3, 1001}, data), t);
    for (float p : {0.1f, 0.5f, 0.875f}) {
      const std::string what = std::string("dropout ") + dt_name(t) + " p " + std::to_string(p);
      Generator gc(42, 7), gg(42, 7);
      gc.set_offset(1000), gg.set_offset(1000);
      Tensor xc = x.detach().requires_grad_(true), xg = on_gpu(x).requires_grad_(true);
      Tensor yc = dropout(xc, p, true, gc), yg = dropout(xg, p, true, gg);
      expect_same_bits(back(yg), yc.to_f32_vector(), what);
      yc.backward(up);
      yg.backward(on_gpu(up));
      expect_same_bits(back(xg.grad()), xc.grad().to_f32_vector(), what + " backward");
      EXPECT_EQ(gg.offset(), gc.offset());
    }
  }
}

TEST(CudaUnary, DropoutReadsTheStepOnTheDevice) {
  REQUIRE_GPU();
  Generator data(701), base(43, 2);
  Tensor x = randn(Shape{2049}, data);
  Tensor step = on_gpu(from_vector(std::vector<int32_t>{5}, Shape{}));
  Generator on_device = base.for_micro_batch(step, 3);
  // The same numbers as a host-addressed generator at that step: counters from step * 2^32.
  Generator at5 = base.for_micro_batch(5, 3);
  expect_same_bits(back(dropout(on_gpu(x), 0.3f, true, on_device)), dropout(x, 0.3f, true, at5).to_f32_vector(),
                   "dropout at a device step 5");
  // The step's new value is read by the next launch (the generator holds the tensor).
  step = on_gpu(from_vector(std::vector<int32_t>{6}, Shape{}));
  on_device.set_offset(0);
  Generator at6 = base.for_micro_batch(6, 3);
  expect_same_bits(back(dropout(on_gpu(x), 0.3f, true, on_device)), dropout(x, 0.3f, true, at6).to_f32_vector(),
                   "dropout at a device step 6");
}

TEST(CudaUnary, RandomFillsGiveTheCpuBits) {
  REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1 << 20) + 5}) {
    Generator gc(800 + uint64_t(n), 4), gg(800 + uint64_t(n), 4);
    gc.set_offset(12345), gg.set_offset(12345);
    const std::string what = "n " + std::to_string(n);
    expect_close(back(randn(Shape{n}, gg, 0.5f, 2.0f, Device::CUDA)), randn(Shape{n}, gc, 0.5f, 2.0f).to_f32_vector(),
                 4e-7, ("randn " + what).c_str());
    expect_same_bits(back(rand(Shape{n}, gg, -1.0f, 3.0f, Device::CUDA)),
                     rand(Shape{n}, gc, -1.0f, 3.0f).to_f32_vector(), "rand " + what);
    for (DType t : {DType::F16, DType::BF16}) {
      Tensor c = empty(Shape{n}, t), g = empty(Shape{n}, t, Device::CUDA);
      fill_normal_(c, gc, 0.0f, 0.02f);
      fill_normal_(g, gg, 0.0f, 0.02f);
      expect_close(back(g), c.to_f32_vector(), t == DType::BF16 ? 1.0 / 128 : 1.0 / 1024,
                   (std::string("fill_normal_ ") + dt_name(t) + " " + what).c_str());
      fill_uniform_(c, gc, -0.1f, 0.1f);
      fill_uniform_(g, gg, -0.1f, 0.1f);
      expect_same_bits(back(g), c.to_f32_vector(), std::string("fill_uniform_ ") + dt_name(t) + " " + what);
    }
  }
}

TEST(CudaUnary, ArangeGivesTheCpuValues) {
  REQUIRE_GPU();
  // 70000: past f16's largest finite value (65504) and bf16's exact integers (256).
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    expect_same_bits(back(arange(70000, t, Device::CUDA)), arange(70000, t).to_f32_vector(),
                     std::string("arange ") + dt_name(t));
  EXPECT_EQ(transfer(arange(70000, DType::I32, Device::CUDA), Device::CPU).to_i32_vector(),
            arange(70000, DType::I32).to_i32_vector());
}
