// `toy train --device sim`: a run on the simulated device writes the CPU run's model bit for
// bit, and a run stopped on sim continues on the CPU (or the other way) to the same model —
// with dropout, whose counters start at the step the loop's clock holds on the device.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "proc.h"
#include "requirements.h"

namespace fs = std::filesystem;
using namespace toy::test;

namespace {
// Each step of a run on sim read the device once (step events' device_reads); a CPU run's
// events have no such field.
void expect_one_read_per_step(const fs::path& run, bool on_sim) {
  std::ifstream in(run / "events.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.at("event") != "step") continue;
    ++steps;
    if (on_sim)
      EXPECT_EQ(e.value("device_reads", -1), 1) << run << " step " << e.at("step");
    else
      EXPECT_FALSE(e.contains("device_reads")) << run;
  }
  EXPECT_GT(steps, 0) << run;
}

std::vector<std::string> train_args(const std::string& data, const fs::path& out, const char* device) {
  return {"train", "--data", data, "--out", out.string(), "--layers", "2", "--heads", "2", "--dim", "32", "--ctx", "32",
          "--batch", "4", "--accum", "2", "--steps", "24", "--eval-every", "8", "--eval-batches", "2",
          "--sample-tokens", "16", "--dropout", "0.1", "--threads", "2", "--quiet", "--device", device};
}
}  // namespace

TEST(SimCli, TrainOnSimWritesTheCpusModelAndResumesAcrossDevices) {
  const std::string data = shared_path("tinyshakespeare.txt");
  TOY_REQUIRE_FILE(data);
  const fs::path dir = fs::path(::testing::TempDir()) / ("toy_sim_cli_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ProcResult cpu = run_toy(train_args(data, dir / "cpu", "cpu"));
  ASSERT_EQ(cpu.status, 0) << describe(cpu);
  ProcResult sim = run_toy(train_args(data, dir / "sim", "sim"));
  ASSERT_EQ(sim.status, 0) << describe(sim);
  EXPECT_EQ(read_all((dir / "sim" / "model.gguf").string()), read_all((dir / "cpu" / "model.gguf").string()));
  EXPECT_EQ(read_all((dir / "sim" / "last.gguf").string()), read_all((dir / "cpu" / "last.gguf").string()));
  expect_one_read_per_step(dir / "sim", true);
  expect_one_read_per_step(dir / "cpu", false);
  // Stopped on sim, continued on the CPU.
  std::vector<std::string> stop = train_args(data, dir / "mixed", "sim");
  stop.insert(stop.end(), {"--stop-after", "11"});
  ProcResult first = run_toy(stop);
  ASSERT_EQ(first.status, 0) << describe(first);
  ProcResult rest = run_toy({"train", "--resume", (dir / "mixed").string(), "--device", "cpu", "--quiet"});
  ASSERT_EQ(rest.status, 0) << describe(rest);
  EXPECT_EQ(read_all((dir / "mixed" / "model.gguf").string()), read_all((dir / "cpu" / "model.gguf").string()));
  // A device toy does not know is a usage error naming the flag.
  ProcResult bad = run_toy(train_args(data, dir / "bad", "tpu"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--device"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

namespace {
fs::path fresh(const std::string& name) {
  const fs::path d = fs::path(::testing::TempDir()) / ("toy_sim_cli_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
}  // namespace

// LoRA on a Q8_0 base (the frozen blocks copied to the device once) and full fine-tunes of a
// hybrid Gated DeltaNet model and of LFM2 (short convs): the same adapter and merged model bytes
// on sim as on the CPU.
TEST(SimCli, FinetuneOnSimWritesTheCpusAdapterAndModel) {
  const fs::path dir = fresh("finetune");
  {
    std::ofstream f(dir / "sft.jsonl");
    for (int i = 0; i < 24; ++i)
      f << "{\"prompt\": \"say " << i << "\", \"completion\": \" the number " << i << " is "
        << (i % 2 ? "odd" : "even") << "\"}\n";
  }
  for (const char* arch : {"llama", "qwen35", "lfm2"}) {
    const std::string base = (dir / (std::string(arch) + ".gguf")).string();
    const bool lora = std::string(arch) == "llama";
    ProcResult init = run_toy({"init", "--arch", arch, "--shape", "tiny", "--type", lora ? "q8_0" : "f32", "--out", base});
    ASSERT_EQ(init.status, 0) << describe(init);
    for (const char* device : {"cpu", "sim"}) {
      ProcResult r = run_toy({"finetune", "-m", base, "--data", (dir / "sft.jsonl").string(), "--out",
                              (dir / (std::string(arch) + "_" + device)).string(), "--method", lora ? "lora" : "full",
                              "--steps", "4", "--batch", "2", "--accum", "2", "--eval-every", "2", "--threads", "2",
                              "--quiet", "--device", device});
      ASSERT_EQ(r.status, 0) << arch << " " << device << ": " << describe(r);
    }
    const fs::path cpu = dir / (std::string(arch) + "_cpu"), sim = dir / (std::string(arch) + "_sim");
    EXPECT_EQ(read_all((sim / "model.gguf").string()), read_all((cpu / "model.gguf").string())) << arch;
    if (lora) EXPECT_EQ(read_all((sim / "adapter.gguf").string()), read_all((cpu / "adapter.gguf").string()));
    expect_one_read_per_step(sim, true);
  }
  fs::remove_all(dir);
}

TEST(SimCli, VisionTrainOnSimWritesTheCpusModel) {
  const std::string data = shared_path("digits.csv.gz");
  TOY_REQUIRE_FILE(data);
  const fs::path dir = fresh("vision");
  for (const char* device : {"cpu", "sim"}) {
    ProcResult r = run_toy({"vision", "train", "--data", data, "--out", (dir / device).string(), "--preset", "vit-digits",
                            "--epochs", "1", "--batch", "32", "--accum", "2", "--threads", "2", "--quiet", "--device",
                            device});
    ASSERT_EQ(r.status, 0) << device << ": " << describe(r);
  }
  EXPECT_EQ(read_all((dir / "sim" / "model.gguf").string()), read_all((dir / "cpu" / "model.gguf").string()));
  expect_one_read_per_step(dir / "sim", true);  // the training accuracy comes with the step's read
  fs::remove_all(dir);
}

// `toy bench run --device sim` decodes with the argmax taken on the device (one 4-byte read per
// token), never reading the logits on the host as the CPU path's shortcut does (that read is a
// host/device line violation on sim, and on a GPU).
TEST(SimCli, BenchRunOnSimDecodesWithoutTouchingDeviceMemory) {
  const fs::path dir = fresh("bench-run");
  const std::string model = (dir / "gpt2.gguf").string();
  ASSERT_EQ(run_toy({"init", "--arch", "gpt2", "--shape", "tiny", "--out", model}).status, 0);
  for (const char* device : {"cpu", "sim"}) {
    ProcResult r = run_toy({"bench", "run", "-m", model, "--reps", "1", "-p", "8", "-n", "4", "--json", "--device", device});
    ASSERT_EQ(r.status, 0) << device << ": " << describe(r);
    const std::string out = r.out.substr(r.out.find('{'));
    const nlohmann::json j = nlohmann::json::parse(out.substr(0, out.find('\n')));
    EXPECT_EQ(j.at("tg_tokens").get<int>(), 4) << device;
    EXPECT_GT(j.at("tg_tokens_per_s").get<double>(), 0.0) << device;
  }
  fs::remove_all(dir);
}

namespace {
// The losses of a run's step events, in order.
std::vector<double> step_losses(const fs::path& run) {
  std::ifstream in(run / "events.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.at("event") == "step") out.push_back(e.at("loss").get<double>());
  }
  return out;
}
// The run_start event's config.precision of each start (a resumed run has two).
std::vector<std::string> started_precisions(const fs::path& run) {
  std::ifstream in(run / "events.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.at("event") == "run_start") out.push_back(e.at("config").at("precision").get<std::string>());
  }
  return out;
}
}  // namespace

// `toy train --precision bf16`: the projections multiply in BF16 over F32 masters. The same
// bytes on sim as on the CPU (the rounding happens in ops, on whichever device); a curve close
// to f32's but not equal to it (the rounding is real); kept across a resume.
TEST(SimCli, TrainInBf16OnSimWritesTheCpusModelAndFollowsTheF32Curve) {
  const std::string data = shared_path("tinyshakespeare.txt");
  TOY_REQUIRE_FILE(data);
  const fs::path dir = fresh("bf16");
  auto args = [&](const char* name, const char* device, const char* precision) {
    std::vector<std::string> a = train_args(data, dir / name, device);
    a.insert(a.end(), {"--precision", precision});
    return a;
  };
  for (auto [name, device, precision] : {std::tuple{"f32", "cpu", "f32"}, std::tuple{"cpu", "cpu", "bf16"},
                                         std::tuple{"sim", "sim", "bf16"}}) {
    ProcResult r = run_toy(args(name, device, precision));
    ASSERT_EQ(r.status, 0) << name << ": " << describe(r);
  }
  EXPECT_EQ(read_all((dir / "sim" / "model.gguf").string()), read_all((dir / "cpu" / "model.gguf").string()));
  const std::vector<double> f32 = step_losses(dir / "f32"), bf16 = step_losses(dir / "cpu");
  ASSERT_EQ(f32.size(), bf16.size());
  ASSERT_FALSE(f32.empty());
  double most = 0;
  for (size_t i = 0; i < f32.size(); ++i) most = std::max(most, std::fabs(bf16[i] - f32[i]) / f32[i]);
  EXPECT_GT(most, 0.0) << "a bf16 run gave the f32 run's losses: nothing was rounded";
  EXPECT_LT(most, 0.02) << "bf16 strayed from the f32 curve";
  EXPECT_EQ(started_precisions(dir / "cpu"), std::vector<std::string>{"bf16"});
  // Stopped and resumed without the flag: the run keeps bf16 and ends on the same model.
  std::vector<std::string> stop = args("resumed", "cpu", "bf16");
  stop.insert(stop.end(), {"--stop-after", "11"});
  ProcResult first = run_toy(stop);
  ASSERT_EQ(first.status, 0) << describe(first);
  ProcResult rest = run_toy({"train", "--resume", (dir / "resumed").string(), "--quiet"});
  ASSERT_EQ(rest.status, 0) << describe(rest);
  EXPECT_EQ(started_precisions(dir / "resumed"), (std::vector<std::string>{"bf16", "bf16"}));
  EXPECT_EQ(read_all((dir / "resumed" / "model.gguf").string()), read_all((dir / "cpu" / "model.gguf").string()));
  ProcResult bad = run_toy(args("bad", "cpu", "f8"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--precision"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}
