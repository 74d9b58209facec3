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
bool cpu_is_amd();

}  // namespace toy
