#include "toy/core/cpu_features.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

namespace {
#if defined(__x86_64__)
void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
// The state the OS saves (XCR0), 0 when it has no XSAVE.
unsigned long long saved_state() {
  unsigned r[4];
  cpuid(1, 0, r);
  if (!(r[2] & (1u << 27))) return 0;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
unsigned max_leaf() {
  unsigned r[4];
  cpuid(0, 0, r);
  return r[0];
}
// EAX of CPUID leaf 7 sub-leaf 1 (AVX-VNNI, AVX512-BF16, ...), 0 where there is none.
unsigned leaf7_sub1_eax() {
  if (max_leaf() < 7) return 0;
  unsigned r[4];
  cpuid(7, 0, r);
  if (r[0] < 1) return 0;
  cpuid(7, 1, r);
  return r[0];
}
#endif
}  // namespace

bool cpu_has_avx_vnni() {
#if defined(__x86_64__)
  if ((saved_state() & 0x6) != 0x6) return false;  // YMM state
  return leaf7_sub1_eax() & (1u << 4);
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni_vl() {
#if defined(__x86_64__)
  if (max_leaf() < 7 || (saved_state() & 0xe6) != 0xe6) return false;  // YMM, opmask and ZMM state
  unsigned r[4];
  cpuid(7, 0, r);
  const bool f = r[1] & (1u << 16), vl = r[1] & (1u << 31), vnni = r[2] & (1u << 11);
  return f && vl && vnni;
#else
  return false;
#endif
}

bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  if (max_leaf() < 7 || (saved_state() & 0x6) != 0x6) return false;
  unsigned r[4];
  cpuid(1, 0, r);
  const bool fma = r[2] & (1u << 12), avx = r[2] & (1u << 28);
  cpuid(7, 0, r);
  return fma && avx && (r[1] & (1u << 5));
#else
  return false;
#endif
}

bool cpu_has_avx512_skx() {
#if defined(__x86_64__)
  if (max_leaf() < 7 || (saved_state() & 0xe6) != 0xe6) return false;
  unsigned r[4];
  cpuid(7, 0, r);
  return (r[1] & (1u << 16)) && (r[1] & (1u << 17)) && (r[1] & (1u << 30)) && (r[1] & (1u << 31));
#else
  return false;
#endif
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  return cpu_has_avx512_skx() && (leaf7_sub1_eax() & (1u << 5));
#else
  return false;
#endif
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool granted = [] {
    // (AVX512-BF16 too: the operands are packed with it.)
    if (max_leaf() < 7 || !cpu_has_avx512_bf16()) return false;
    if ((saved_state() & 0x60000) != 0x60000) return false;  // XTILECFG and XTILEDATA state
    unsigned r[4];
    cpuid(7, 0, r);
    if (!(r[3] & (1u << 22)) || !(r[3] & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    // Linux hands the tile data state (8 KB per thread) to processes that ask for it.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

bool cpu_is_amd() {
#if defined(__x86_64__)
  unsigned r[4];
  cpuid(0, 0, r);
  return r[1] == 0x68747541 && r[3] == 0x69746e65 && r[2] == 0x444d4163;  // "AuthenticAMD"
#else
  return false;
#endif
}

namespace {
struct ChosenVariant {
  KernelVariant variant;
  bool forced;
};
ChosenVariant choose_variant() {
  const bool has512 = cpu_has_avx512_skx();
  const char* env = std::getenv("TOY_CPU");
  if (!env || !*env) return {has512 ? KernelVariant::Avx512 : KernelVariant::Avx2, false};
  const std::string v = env;
  if (v == "avx2") return {KernelVariant::Avx2, true};
  TOY_CHECK(v == "avx512", "[cpu] TOY_CPU='{}': expected avx2 or avx512", v);
  TOY_CHECK(has512, "[cpu] TOY_CPU=avx512, but this CPU lacks AVX-512 F/BW/VL/DQ (it runs the avx2 kernels)");
  return {KernelVariant::Avx512, true};
}
// Resolved on first use; a bad TOY_CPU throws every time it is asked, never runs a default.
const ChosenVariant& chosen_variant() {
  static const ChosenVariant v = choose_variant();
  return v;
}
}  // namespace

KernelVariant kernel_variant() { return chosen_variant().variant; }
bool kernel_variant_forced() { return chosen_variant().forced; }
namespace {
QuantDot choose_quant_dot() {
  if (kernel_variant() == KernelVariant::Avx512) return cpu_has_avx512_vnni_vl() ? QuantDot::Avx512Vnni : QuantDot::Avx2;
  return !kernel_variant_forced() && cpu_has_avx_vnni() ? QuantDot::AvxVnni : QuantDot::Avx2;
}
}  // namespace

// Once: CPUID is slow under a hypervisor (each one exits to it), and kernels ask per call.
QuantDot quant_dot() {
  static const QuantDot form = choose_quant_dot();
  return form;
}

std::string quant_products_form() {
  switch (quant_dot()) {
    case QuantDot::Avx512Vnni: return "AVX512-VNNI, 512-bit (two activation rows a register)";
    case QuantDot::AvxVnni: return "AVX-VNNI, 256-bit";
    default: return "AVX2 multiply-adds";
  }
}

namespace {
Bf16Products choose_bf16_products() {
  if (kernel_variant() != KernelVariant::Avx512) return Bf16Products::Widened;
  if (cpu_has_amx_bf16()) return Bf16Products::Amx;
  if (cpu_has_avx512_bf16() && cpu_is_amd()) return Bf16Products::Avx512Dot;
  return Bf16Products::Widened;
}
}  // namespace

Bf16Products bf16_products() {
  static const Bf16Products form = choose_bf16_products();
  return form;
}


std::string bf16_products_form() {
  switch (bf16_products()) {
    case Bf16Products::Amx: return "AMX-BF16 tiles";
    case Bf16Products::Avx512Dot: return "AVX512-BF16 (vdpbf16ps)";
    default: return "widened to f32 (SGEMM)";
  }
}

std::string kernel_variant_name() { return kernel_variant() == KernelVariant::Avx512 ? "avx512" : "avx2"; }

}  // namespace toy
