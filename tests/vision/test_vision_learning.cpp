// Learning: vit-digits on the 1,797 8x8 digits (../shared/data/digits.csv.gz, split 80/20 by
// seed) reaches >= 95% held-out test accuracy in about half a minute on 2 cores.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "requirements.h"

namespace fs = std::filesystem;

TEST(VisionLearning, VitDigitsReachesNinetyFivePercentOnHeldOutDigits) {
  const std::string data = toy::test::shared_path("digits.csv.gz");
  TOY_REQUIRE_FILE(data);
  const fs::path out = fs::temp_directory_path() / ("toy_vit_digits_" + std::to_string(::getpid()));
  fs::remove_all(out);
  toy::test::ProcOptions po;
  po.timeout_s = 600;
  const auto r = toy::test::run_toy({"vision", "train", "--data", data, "--preset", "vit-digits", "--epochs", "60",
                                     "--batch", "32", "--lr", "1e-3", "--warmup", "200", "--out", out.string(),
                                     "--json", "--quiet"},
                                    po);
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.95) << r.out;
  fs::remove_all(out);
}
