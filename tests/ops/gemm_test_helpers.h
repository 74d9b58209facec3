// Helpers shared by the tests of toy's own matmul tiles (test_gemm_half.cpp, test_gemm_f32.cpp):
// the kernel forms this CPU runs, a scope that forces one, seeded operands, bit equality.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "toy/backend/cpu/variant.h"
#include "toy/core/cpu_features.h"

namespace toy::test {

// The forms this CPU runs: AVX2 always, AVX-512 where the kernel variant has it.
inline std::vector<bool> forms_here() {
  std::vector<bool> f{false};
  if (kernel_variant() == KernelVariant::Avx512) f.push_back(true);
  return f;
}

// Forces the AVX-512 (true) or AVX2 (false) forms for the scope.
struct FormScope {
  explicit FormScope(bool avx512) { cpu::use_avx512_forms(avx512); }
  ~FormScope() { cpu::use_avx512_forms(kernel_variant() == KernelVariant::Avx512); }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> normal;
  for (float& x : v) x = normal(rng);
  return v;
}

inline bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

struct Shape3 {
  int64_t M, N, K;
};

}  // namespace toy::test
