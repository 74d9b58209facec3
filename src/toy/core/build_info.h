// What this binary is: version, the git commit it was built from, the compiler, and the CPU
// features its kernels use (for `toy --version` and run provenance).
#pragma once
#include <string>

namespace toy {

const char* version();     // "0.1.0"
const char* git_commit();  // full hash, "-dirty" when built from uncommitted changes
std::string compiler();    // "g++ 12.2.0" / "clang 14.0.6"
// Multi-line text for `toy --version`.
std::string version_text();

}  // namespace toy
