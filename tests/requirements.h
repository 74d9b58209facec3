// Outside requirements of some tests (../shared/data, llama.cpp from npm, the system's license
// texts). Locally a missing one skips the test with the reason; under CI=true (or
// TOY_REQUIRE_ALL=1) it fails instead, so "100% passed" in CI always means every check ran.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace toy::test {

inline bool requirements_enforced() {
  const char* ci = std::getenv("CI");
  const char* all = std::getenv("TOY_REQUIRE_ALL");
  return (ci && std::string(ci) == "true") || (all && std::string(all) == "1");
}

// ../shared/data beside the source tree, or $TOY_SHARED_DATA when the checkout lives elsewhere.
inline std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("TOY_SHARED_DATA");
  return std::string(env && *env ? env : TOY_SHARED_DATA_DIR) + "/" + rel;
}

}  // namespace toy::test

// Skips (locally) or fails (CI) the current test when `cond` is false.
#define TOY_REQUIRE(cond, what)                                                                         \
  do {                                                                                                  \
    if (!(cond)) {                                                                                      \
      if (::toy::test::requirements_enforced()) FAIL() << "missing requirement (CI=true): " << (what);   \
      GTEST_SKIP() << "missing requirement: " << (what);                                                \
    }                                                                                                   \
  } while (0)

#define TOY_REQUIRE_FILE(path) TOY_REQUIRE(std::filesystem::exists(path), std::string("file ") + (path))
