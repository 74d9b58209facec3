#include "toy/core/blas_core.h"

#include <cblas.h>

#include <cstdlib>

#include "toy/core/cpu_features.h"

namespace toy {

namespace {

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
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  if (!predates_avx2(openblas_core()) || !cpu_has_avx2_fma()) return "";
  if (cpu_has_avx512_skx()) return "SkylakeX";
  return cpu_is_amd() ? "Zen" : "Haswell";
}

}  // namespace toy
