// Start-up CPU check. This file is compiled without AVX flags so that it runs on any x86-64
// and can explain what is missing instead of dying on an illegal instruction.
#pragma once
#include <string>

#include "toy/core/runtime.h"  // missing_cpu_features

namespace toy {

// Throws toy::Error naming the missing features.
void require_cpu_features();

// Optional extensions a kernel may use when present (CPUID, with the OS saving the state):
// AVX-VNNI (the VEX form of vpdpbusd), and AVX512-VNNI with AVX512-VL (its EVEX form on
// 256-bit registers).
bool cpu_has_avx_vnni();
bool cpu_has_avx512_vnni_vl();
// AVX2 with FMA; AVX-512 F, DQ, BW and VL (Skylake-X's set); the vendor is AMD.
bool cpu_has_avx2_fma();
bool cpu_has_avx512_skx();
// AVX512-BF16 (vdpbf16ps and the f32 -> bf16 conversions) with Skylake-X's set.
bool cpu_has_avx512_bf16();
bool cpu_is_amd();

// The set of kernel forms this process runs: AVX-512 forms (F, BW, VL, DQ; VNNI where the
// CPU has it) on CPUs that have Skylake-X's set, else the AVX2 forms. TOY_CPU=avx2|avx512
// forces one (tests and benchmarks run the AVX2 forms on any CPU that way). Read once; throws
// toy::Error naming TOY_CPU for another value or for avx512 on a CPU without it.
enum class KernelVariant { Avx2, Avx512 };
KernelVariant kernel_variant();
// Whether TOY_CPU chose the variant (TOY_CPU=avx2 also keeps AVX-VNNI off: the forms of a
// CPU that has AVX2 alone, such as AMD Zen 3).
bool kernel_variant_forced();

// The integer dot product the block-quant kernels use: AVX512-VNNI on 512-bit registers (the
// avx512 variant on a CPU with VNNI), AVX-VNNI's 256-bit form (the avx2 variant unforced, on a
// CPU that has it: Intel since Alder Lake), or AVX2's multiply-adds. The sums are exact
// integers in every form, so the products' bits do not depend on which.
enum class QuantDot { Avx2, AvxVnni, Avx512Vnni };
QuantDot quant_dot();
// Its name for `toy --version`.
std::string quant_products_form();

// AMX with its BF16 tiles (Intel since Sapphire Rapids), the OS saving the tile state and
// granting this process its use (asked once, on the first call).
bool cpu_has_amx_bf16();

// How products of two BF16 operands run (backend/cpu/gemm_bf16.h), under the avx512 variant:
// on AMX tiles where the CPU has them; else on vdpbf16ps on AMD CPUs with AVX512-BF16 (Zen 4
// and later: twice an f32 FMA's multiply-adds per instruction — an Intel core without AMX runs
// it at half the rate of its f32 FMAs, no gain); else widened to f32 for SGEMM.
enum class Bf16Products { Widened, Avx512Dot, Amx };
Bf16Products bf16_products();
// (Its name: bf16_products_form() of runtime.h.)

}  // namespace toy
