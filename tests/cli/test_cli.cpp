// The toy program: the stable interfaces other tools and the acceptance checks rely on.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct RunResult {
  int status;
  std::string out;
};

RunResult run(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " " + TOY_BINARY + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

const char* kCanonical[] = {
    "add", "sub", "mul", "div", "scale", "neg", "exp", "log", "sqrt", "rsqrt", "square", "abs", "tanh",
    "sigmoid", "relu", "silu", "gelu", "clamp", "swiglu", "dropout", "matmul", "linear", "out_prod", "sum",
    "mean", "max", "argmax", "argsort", "top_k", "rms_norm", "layer_norm", "l2_norm", "softmax", "log_softmax",
    "diag_mask_inf", "rope", "attention", "view", "reshape", "permute", "transpose", "contiguous", "concat",
    "slice", "pad", "repeat", "cast", "get_rows", "set_rows", "cross_entropy", "im2col", "conv2d", "conv1d",
    "mul_mat_id", "add_id", "ssm_conv", "ssm_scan", "sgd", "adamw"};

}  // namespace

TEST(Cli, OpsJsonListsEveryCanonicalOp) {
  RunResult r = run("ops --json");
  ASSERT_EQ(r.status, 0);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  std::set<std::string> names;
  const std::set<std::string> no_backward = {"argmax",       "argsort", "top_k",  "sgd",
                                             "adamw",        "optimizer_clock", "step_clock", "sample_token",
                                             "full",         "arange",  "random_fill"};
  // Every grad_test must be a test of the op test binary: its listing, parsed into full
  // "Suite.Test" names (a test name alone would match the same name in any suite).
  std::set<std::string> tests;
  {
    FILE* p = popen((std::string(TOY_OP_TESTS_BINARY) + " --gtest_list_tests").c_str(), "r");
    std::string listing;
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) listing.append(buf.data(), n);
    pclose(p);
    std::istringstream lines(listing);
    std::string line, suite;
    while (std::getline(lines, line)) {
      const std::string name = line.substr(0, line.find("  #"));  // drop "# GetParam() = ..." notes
      if (name.empty()) continue;
      if (name[0] != ' ')
        suite = name;  // "OpGrad."
      else
        tests.insert(suite + name.substr(name.find_first_not_of(' ')));
    }
  }
  ASSERT_GT(tests.size(), 100u);
  for (const auto& op : j) {
    const std::string name = op.at("name");
    names.insert(name);
    EXPECT_TRUE(op.at("primitive").is_boolean());
    EXPECT_TRUE(op.at("cpu").get<bool>()) << name;
    EXPECT_TRUE(op.at("cuda").is_boolean());
    EXPECT_EQ(op.at("backward").get<bool>(), no_backward.count(name) == 0) << name;
    const std::string test = op.at("grad_test");
    EXPECT_EQ(test, "OpGrad." + name);
    EXPECT_TRUE(tests.count(test)) << test << " is not a test of toy_op_tests";
  }
  for (const char* c : kCanonical) EXPECT_TRUE(names.count(c)) << c;
}

TEST(Cli, OpsTableIsReadable) {
  RunResult r = run("ops");
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("rms_norm"), std::string::npos);
  EXPECT_NE(r.out.find("composite"), std::string::npos);
}

TEST(Cli, BenchOpsJsonLines) {
  RunResult r = run("bench ops --json --case rms_norm --reps 1");
  ASSERT_EQ(r.status, 0);
  std::istringstream lines(r.out);
  std::string line;
  std::set<std::string> cases;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"case", "value", "unit", "baseline", "ratio"}) EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j.at("value").get<double>(), 0);
    cases.insert(j.at("case"));
  }
  EXPECT_TRUE(cases.count("rms_norm"));
}

TEST(Cli, DemoLossFalls) {
  RunResult r = run("demo --steps 75");
  ASSERT_EQ(r.status, 0);
  double first = 0, last = 0;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    double loss;
    int step;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) {
      if (step == 1) first = loss;
      last = loss;
    }
  }
  EXPECT_GT(first, 3.0);
  EXPECT_LT(last, first - 0.8) << r.out;
}

TEST(Cli, TraceEnvironmentWritesValidChromeTrace) {
  const std::string path = ::testing::TempDir() + "toy_cli_trace.json";
  RunResult r = run("demo --steps 2", "TOY_TRACE=" + path);
  ASSERT_EQ(r.status, 0);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  ASSERT_TRUE(j.is_array());
  std::set<std::string> cats;
  for (const auto& e : j) cats.insert(e.at("cat").get<std::string>());
  EXPECT_TRUE(cats.count("op"));
  EXPECT_TRUE(cats.count("backward"));
  std::remove(path.c_str());
}

TEST(Cli, BadUsageFailsWithAMessage) {
  EXPECT_NE(run("no-such-command").status, 0);
  EXPECT_NE(run("bench ops --reps 0").status, 0);
  EXPECT_NE(run("").status, 0);
}

// `toy bench train` prints one JSON line per preset. The PyTorch peer is optional (CI has no
// torch): with it the peer fields are filled, without it they are null and toy's numbers are
// still printed. The second run forces the no-peer path with an interpreter that does not exist.
TEST(Cli, BenchTrainJsonLines) {
  auto check = [](const RunResult& r, bool expect_null_peer) {
    ASSERT_EQ(r.status, 0);
    std::istringstream lines(r.out);
    std::string line;
    int n = 0;
    while (std::getline(lines, line)) {
      auto j = nlohmann::json::parse(line);
      for (const char* k : {"preset", "tokens_per_s", "peer", "peer_tokens_per_s", "ratio"})
        EXPECT_TRUE(j.contains(k)) << k;
      EXPECT_EQ(j.at("preset"), "cpu-small");
      const double tps = j.at("tokens_per_s").get<double>();
      EXPECT_GT(tps, 0);
      if (expect_null_peer) {
        EXPECT_TRUE(j.at("peer").is_null()) << line;
      }
      if (j.at("peer").is_null()) {
        EXPECT_TRUE(j.at("peer_tokens_per_s").is_null());
        EXPECT_TRUE(j.at("ratio").is_null());
      } else {
        EXPECT_TRUE(j.at("peer").is_string());
        const double peer = j.at("peer_tokens_per_s").get<double>();
        EXPECT_GT(peer, 0);
        EXPECT_NEAR(j.at("ratio").get<double>(), tps / peer, 1e-6 * tps / peer);
      }
      ++n;
    }
    EXPECT_EQ(n, 1) << r.out;
  };
  check(run("bench train --preset cpu-small --json --steps 3 --warmup 1 --reps 1"), false);
  check(run("bench train --preset cpu-small --json --steps 2 --warmup 1 --reps 1 --python /nonexistent/python3"), true);
  EXPECT_NE(run("bench train --preset no-such-preset").status, 0);
}
