// cuda-emu: what the harness asks the emulator's runtime (emu_runtime.cpp) without including
// emu_cuda.h, whose CUDA macros are only for the kernel files.
#pragma once
#include <cstdio>

namespace emu {

// Kernel launches so far, all kernels together.
long total_launches();
// The launches per kernel and the warnings (e.g. a __syncthreads() after some threads returned).
void write_report(std::FILE* out);

}  // namespace emu
