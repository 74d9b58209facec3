#include "toy/core/blas_core.h"

#include <cblas.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

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

void reexec_with_openblas_core(char** argv) {
  const std::string core = openblas_core_override();
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  execv(!ec && !self.empty() ? self.c_str() : "/proc/self/exe", argv);
}

}  // namespace toy
