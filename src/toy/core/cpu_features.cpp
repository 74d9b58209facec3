#include "toy/core/cpu_features.h"

#include "toy/core/error.h"

namespace toy {

std::string missing_cpu_features() {
  std::string missing;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) missing += " avx2";
  if (!__builtin_cpu_supports("fma")) missing += " fma";
  // F16C has no __builtin_cpu_supports name in older compilers: read CPUID leaf 1, ECX bit 29.
  unsigned a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  if (!(c & (1u << 29))) missing += " f16c";
#else
  missing = " x86-64 with avx2 fma f16c";
#endif
  return missing;
}

void require_cpu_features() {
  std::string m = missing_cpu_features();
  TOY_CHECK(m.empty(), "[cpu] this CPU lacks{}; toy's kernels need AVX2, FMA and F16C (Intel Haswell / AMD Zen or newer)",
            m);
}

}  // namespace toy
