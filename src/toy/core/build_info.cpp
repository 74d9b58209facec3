#include "toy/core/build_info.h"

#include <cstdlib>

#include "toy/core/blas_core.h"

#include <fstream>

#include <fmt/core.h>

#include "toy/core/cpu_features.h"
#include "toy/core/error.h"
#include "toy/version.h"

#ifndef TOY_VERSION
#define TOY_VERSION "unknown"
#endif

namespace toy {

const char* version() { return TOY_VERSION; }
const char* git_commit() { return TOY_GIT_COMMIT; }

std::string compiler() {
#if defined(__clang__)
  return fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("g++ {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

std::string version_text() {
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  const std::string missing = missing_cpu_features();
  std::string build =
#ifdef __OPTIMIZE__
      "optimized";
#else
      "not optimized";
#endif
#if defined(__SANITIZE_ADDRESS__)
  build += ", AddressSanitizer";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  build += ", AddressSanitizer";
#endif
#endif
  std::string variant, products = "-", bf16 = "-";
  try {
    products = quant_products_form();
    bf16 = bf16_products_form();
    variant = kernel_variant_name();
    variant += kernel_variant_forced() ? " (TOY_CPU)" : " (this CPU's best; TOY_CPU=avx2 forces the AVX2 forms)";
  } catch (const Error& e) {
    variant = e.what();
  }
  return fmt::format(
      "toy {}\ncommit: {}\ncompiler: {} (C++{}, {})\nCPU features used: AVX2, FMA, F16C (CPU kernels); {}\n"
      "kernel variant: {}\nblock-quant products: {}\nbf16 products: {}\nthis CPU: {}\nOpenBLAS kernels: {}{}\n",
      version(), git_commit(), compiler(), __cplusplus / 100 % 100, build,
      missing.empty() ? "this CPU has them" : "this CPU lacks" + missing, variant, products, bf16, cpu,
      openblas_core(), std::getenv("OPENBLAS_CORETYPE") ? " (OPENBLAS_CORETYPE)" : "");
}

}  // namespace toy
