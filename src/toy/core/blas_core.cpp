#include "toy/core/blas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

namespace toy {

namespace {

#if defined(__x86_64__)
void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
unsigned long long xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

// Kernels OpenBLAS has for CPUs without AVX2: a fallback when the CPU has it.
bool predates_avx2(const std::string& core) {
  for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge", "Katmai",
                          "Coppermine", "Northwood", "Banias", "Opteron", "Opteron(SSE3)", "Barcelona", "Bobcat"})
    if (core == old) return true;
  return false;
}

}  // namespace

std::string openblas_core() {
  const char* name = openblas_get_corename();
  std::string core = name ? name : "";
  while (!core.empty() && core.back() == ' ') core.pop_back();
  return core;
}

std::string openblas_core_override() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  if (!predates_avx2(openblas_core())) return "";
  unsigned r[4];
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4), std::memcpy(vendor + 4, &r[3], 4), std::memcpy(vendor + 8, &r[2], 4);
  if (max_leaf < 7) return "";
  cpuid(1, 0, r);
  const bool fma = r[2] & (1u << 12), osxsave = r[2] & (1u << 27), avx = r[2] & (1u << 28);
  if (!osxsave || !avx || !fma) return "";
  const unsigned long long xcr0 = xgetbv0();
  if ((xcr0 & 0x6) != 0x6) return "";  // the OS saves the YMM state
  cpuid(7, 0, r);
  const bool avx2 = r[1] & (1u << 5);
  if (!avx2) return "";
  const bool avx512 = (r[1] & (1u << 16)) && (r[1] & (1u << 17)) && (r[1] & (1u << 30)) && (r[1] & (1u << 31));
  if (avx512 && (xcr0 & 0xe0) == 0xe0) return "SkylakeX";  // F, DQ, BW, VL, with opmask/ZMM state saved
  return std::strcmp(vendor, "AuthenticAMD") == 0 ? "Zen" : "Haswell";
#else
  return "";
#endif
}

}  // namespace toy
