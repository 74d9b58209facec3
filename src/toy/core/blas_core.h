// OpenBLAS chooses its kernels once, when the library loads, from the CPU's model. A CPU it
// does not recognise — a virtual machine's generic "Intel(R) Xeon(R) Processor", a model newer
// than the library — gets its generic SSE3 kernels ("Prescott"): SGEMM at a quarter of the
// speed the CPU has (measured: 31 against 121 GFLOP/s on 1024^3 with AVX-512 here). toy then
// names the core itself, from CPUID, through OPENBLAS_CORETYPE, which OpenBLAS reads only as it
// loads — so `toy` re-executes itself once with it set (main.cpp). A user's own
// OPENBLAS_CORETYPE is always kept.
#pragma once
#include <string>

#include "toy/core/runtime.h"  // openblas_core, reexec_with_openblas_core

namespace toy {

// The core to ask for when OpenBLAS fell back to kernels older than this CPU (AVX-512 F, BW,
// DQ and VL with the OS saving their state: SkylakeX; AVX2 + FMA: Zen on AMD, else Haswell);
// "" when its choice stands or OPENBLAS_CORETYPE is set.
std::string openblas_core_override();
// reexec_with_openblas_core (runtime.h) re-executes the file /proc/self/exe points at, so
// `ps` still shows its name.

}  // namespace toy
