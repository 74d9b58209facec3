#include "toy/backend/cpu/variant.h"

#include <atomic>

#include "toy/core/cpu_features.h"

namespace toy::cpu {

namespace {
std::atomic<bool> g_avx512_off_for_tests{false};
}  // namespace

bool avx512_forms() {
  static const bool variant_has_them = kernel_variant() == KernelVariant::Avx512;
  return variant_has_them && !g_avx512_off_for_tests.load(std::memory_order_relaxed);
}

void use_avx512_forms(bool on) { g_avx512_off_for_tests.store(!on, std::memory_order_relaxed); }

}  // namespace toy::cpu
