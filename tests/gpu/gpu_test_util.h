// What the GPU tests share: the skip-or-fail guard (no GPU: skip with the driver's reason;
// TOY_REQUIRE_GPU=1: fail), copies across the line, and a closeness check that refuses NaN.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "toy/core/device_access.h"
#include "toy/core/tensor.h"

namespace toy::gpu_test {

inline bool gpu_required() {
  const char* v = std::getenv("TOY_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

#define REQUIRE_GPU()                                                                       \
  do {                                                                                      \
    const std::string why = ::toy::device_unavailable(::toy::Device::CUDA);                 \
    if (!why.empty()) {                                                                     \
      if (::toy::gpu_test::gpu_required()) FAIL() << "TOY_REQUIRE_GPU=1 and " << why;       \
      GTEST_SKIP() << "skipped: " << why;                                                   \
    }                                                                                       \
  } while (0)

// Every GPU block handed out is poisoned (NaN) first: an output element a kernel forgets to
// write shows. (Set before main: the allocator reads it at its first allocation.)
inline const bool kPoisonGpuAllocations = [] { return ::setenv("TOY_CUDA_POISON", "1", 0) == 0; }();

inline Tensor on_gpu(const Tensor& t) { return transfer(t, Device::CUDA); }
inline std::vector<float> back(const Tensor& t) { return transfer(t, Device::CPU).to_f32_vector(); }

// |got - want| <= rel * max(1, |want|) element by element; NaN in got fails unless want is NaN there.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: want NaN, got " << got[i];
      continue;
    }
    ASSERT_FALSE(std::isnan(got[i])) << what << " [" << i << "]";
    EXPECT_NEAR(got[i], want[i], rel * std::max(1.0, double(std::fabs(want[i])))) << what << " [" << i << "]";
  }
}

}  // namespace toy::gpu_test
