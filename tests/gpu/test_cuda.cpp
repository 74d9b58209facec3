// The CUDA backend against the CPU: each op the backend has ported, on fresh random inputs,
// with its output poisoned first, must give the CPU's result (F32 within 1e-6 relative for
// these exact ops; F16/BF16 equal after the same rounding). Every test needs a GPU: without
// one it skips with the driver's reason, or fails under TOY_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "toy/core/allocator.h"
#include "toy/core/device_access.h"
#include "toy/core/registry.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

using namespace toy;

using namespace toy::gpu_test;

TEST(Cuda, TensorsCrossTheLineAndBackUnchanged) {
  REQUIRE_GPU();
  Generator g(1);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    Tensor x = cast(randn(Shape{3, 37}, g), t);
    EXPECT_EQ(back(on_gpu(x)), x.to_f32_vector()) << name(t);
  }
  Tensor ids = from_vector(std::vector<int32_t>{7, -1, 300000}, Shape{3});
  EXPECT_EQ(transfer(on_gpu(ids), Device::CPU).to_i32_vector(), ids.to_i32_vector());
}

TEST(Cuda, FillAndStridedCopyConvertAsTheCpuDoes) {
  REQUIRE_GPU();
  Generator g(2);
  Tensor x = randn(Shape{5, 6, 7}, g);
  for (DType to : {DType::F32, DType::F16, DType::BF16}) {
    // A transposed view copied (converted) into a fresh contiguous tensor.
    Tensor want = cast(permute(x, {2, 0, 1}), to);
    // (contiguous: an F32 cast of an F32 view is the view itself, and views cross the line contiguous)
    Tensor got = contiguous(cast(permute(on_gpu(x), {2, 0, 1}), to));
    EXPECT_EQ(back(got), want.to_f32_vector()) << name(to);
  }
  Tensor z = full(Shape{4, 5}, 2.5, DType::BF16, Device::CUDA);
  EXPECT_EQ(back(z), std::vector<float>(20, 2.5f));
}

TEST(Cuda, BinaryOpsWithBroadcastEqualTheCpu) {
  REQUIRE_GPU();
  Generator g(3);
  Tensor a = randn(Shape{4, 3, 8}, g), b = randn(Shape{3, 1}, g);
  Tensor ga = on_gpu(a), gb = on_gpu(b);
  expect_close(back(add(ga, gb)), add(a, b).to_f32_vector(), 1e-6, "add");
  expect_close(back(sub(ga, gb)), sub(a, b).to_f32_vector(), 1e-6, "sub");
  expect_close(back(mul(ga, gb)), mul(a, b).to_f32_vector(), 1e-6, "mul");
  expect_close(back(div(ga, add(gb, full(Shape{1}, 4.0, DType::F32, Device::CUDA)))),
               div(a, add(b, full(Shape{1}, 4.0))).to_f32_vector(), 1e-6, "div");
  for (DType t : {DType::F16, DType::BF16})
    EXPECT_EQ(back(add(cast(ga, t), cast(gb, t))), add(cast(a, t), cast(b, t)).to_f32_vector()) << name(t);
}

TEST(Cuda, AWarmLoopAllocatesNoGpuMemory) {
  REQUIRE_GPU();
  Generator g(4);
  Tensor a = on_gpu(randn(Shape{64, 64}, g));
  for (int i = 0; i < 3; ++i) (void)back(add(mul(a, a), a));  // (the measured loop's two live blocks)
  const int64_t before = allocator(Device::CUDA).stats().system_allocs;
  for (int i = 0; i < 20; ++i) (void)back(add(mul(a, a), a));
  EXPECT_EQ(allocator(Device::CUDA).stats().system_allocs, before);
}

TEST(Cuda, AGpuNumberOutOfRangeIsRefusedNamingTheCount) {
  REQUIRE_GPU();
  try {
    select_device("cuda:99", "[test]");
    FAIL() << "cuda:99 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this machine has"), std::string::npos) << e.what();
  }
}
