// Shared by the libFuzzer targets: only toy::Error may escape a parser of outside input (any
// other exception, a crash, a sanitizer report, a hang or runaway memory is a finding), and
// property violations abort with a message.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "toy/core/error.h"

namespace toy::fuzz {

[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

#define FUZZ_ASSERT(cond) \
  do {                    \
    if (!(cond)) ::toy::fuzz::violated(#cond); \
  } while (0)

// A scratch folder of this process (fuzzers may run in parallel).
inline std::string scratch_dir(const char* target) {
  const auto p = std::filesystem::temp_directory_path() / (std::string("toy_fuzz_") + target + "_" +
                                                           std::to_string(getpid()));
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace toy::fuzz
