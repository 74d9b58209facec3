// Learning: vit-digits on the 1,797 8x8 digits (../shared/data/digits.csv.gz, split 80/20 by
// seed) reaches >= 95% held-out test accuracy, the median of three seeds, in about half a
// minute each on 2 cores. One run's accuracy is one trajectory's: the recipe measured
// 92.5-98.1% over nine seeds and both kernel forms (the AVX2 forms hand dW to OpenBLAS, so a
// Zen 3 host trains another trajectory), and one seed against 95% failed where another passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "requirements.h"

namespace fs = std::filesystem;

TEST(VisionLearning, VitDigitsReachesNinetyFivePercentOnHeldOutDigits) {
  const std::string data = toy::test::shared_path("digits.csv.gz");
  TOY_REQUIRE_FILE(data);
  std::vector<double> accuracies;
  std::string outputs;
  for (const char* seed : {"1337", "1", "2"}) {
    const fs::path out = fs::temp_directory_path() / ("toy_vit_digits_" + std::to_string(::getpid()) + "_" + seed);
    fs::remove_all(out);
    toy::test::ProcOptions po;
    po.timeout_s = 600;
    const auto r = toy::test::run_toy({"vision", "train", "--data", data, "--preset", "vit-digits", "--epochs", "60",
                                       "--batch", "32", "--lr", "1e-3", "--warmup", "200", "--wd", "0.1", "--seed",
                                       seed, "--out", out.string(), "--json", "--quiet"},
                                      po);
    ASSERT_EQ(r.status, 0) << toy::test::describe(r);
    const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
    accuracies.push_back(j["test_accuracy"].get<double>());
    outputs += r.out;
    // A run that learned: none of the eighteen measured at --wd 0.1 fell below 93.8%.
    EXPECT_GE(accuracies.back(), 0.90) << "seed " << seed << ": " << r.out;
    fs::remove_all(out);
  }
  std::sort(accuracies.begin(), accuracies.end());
  EXPECT_GE(accuracies[1], 0.95) << outputs;
}
