// Helpers shared by the fine-tuning tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "proc.h"

namespace toy::test {

// A path in the test temp folder, private to this test process (ctest runs tests in parallel
// processes).
inline std::string process_temp(const std::string& prefix, const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / (prefix + std::to_string(getpid()) + "_" + name)).string();
}

// A tiny qwen2 file from `toy init` (tied head, vocabulary of 1024 byte-level BPE tokens, no
// BOS, EOS <|im_end|>), made once per test process.
inline const std::string& tiny_qwen2_model() {
  static const std::string path = [] {
    const std::string p = process_temp("toy_ft_", "tiny.gguf");
    const auto r = run_toy({"init", "--arch", "qwen2", "--shape", "tiny", "--out", p});
    EXPECT_EQ(r.status, 0) << r.err;
    return p;
  }();
  return path;
}

}  // namespace toy::test
