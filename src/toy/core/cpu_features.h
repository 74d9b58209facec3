// Start-up CPU check. This file is compiled without AVX flags so that it runs on any x86-64
// and can explain what is missing instead of dying on an illegal instruction.
#pragma once
#include <string>

namespace toy {

// Empty when the CPU has everything the kernels use, else the names of what is missing.
std::string missing_cpu_features();
// Throws toy::Error naming the missing features.
void require_cpu_features();

}  // namespace toy
