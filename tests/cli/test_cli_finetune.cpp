// `toy finetune` and `--lora` as a user runs them: the --json summary, the run folder, an
// adapter applied by generate and eval, and clear errors for bad data and occupied folders.
#include <gtest/gtest.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "proc.h"

namespace fs = std::filesystem;
using toy::test::describe;
using toy::test::run_toy;

namespace {
std::string temp(const std::string& name) { return (fs::path(::testing::TempDir()) / ("toy_cli_ft_" + name)).string(); }

std::string last_line(const std::string& s) {
  const size_t end = s.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

struct Fixture {
  // (one per test process: ctest runs these tests in parallel processes)
  std::string model = temp("base_" + std::to_string(getpid()) + ".gguf");
  std::string data = temp("data_" + std::to_string(getpid()) + ".jsonl");
  Fixture() {
    const auto r = run_toy({"init", "--arch", "llama", "--shape", "tiny", "--out", model});
    EXPECT_EQ(r.status, 0) << describe(r);
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i)
      f << nlohmann::json({{"prompt", "count " + std::to_string(i)}, {"completion", " " + std::to_string(i + 1)}}).dump()
        << "\n";
  }
};
const Fixture& fixture() {
  static Fixture f;
  return f;
}
}  // namespace

TEST(CliFinetune, LoraRunPrintsItsSummaryAndWritesTheRunFolder) {
  const Fixture& fx = fixture();
  const std::string out = temp("lora");
  fs::remove_all(out);
  auto r = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--method", "lora", "--steps", "4", "--batch", "2",
                    "--lora-rank", "2", "--lr", "1e-2", "--out", out, "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const nlohmann::json j = nlohmann::json::parse(last_line(r.out));
  for (const char* k : {"steps", "train_loss", "val_loss", "tokens_per_s", "seconds", "out"})
    EXPECT_TRUE(j.contains(k)) << k << " missing from " << j.dump();
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["out"], out);
  EXPECT_TRUE(j["train_loss"].is_number() && j["val_loss"].is_number()) << j.dump();
  for (const char* f : {"model.gguf", "adapter.gguf", "events.jsonl"}) EXPECT_TRUE(fs::exists(out + "/" + f)) << f;

  // The adapter at load: scale 0 is the base exactly; scale 1 runs.
  auto gen = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"generate", "-m", fx.model, "-p", "count 7", "-n", "6", "--temp", "0", "--quiet"};
    a.insert(a.end(), extra.begin(), extra.end());
    auto g = run_toy(a);
    EXPECT_EQ(g.status, 0) << describe(g);
    return g.out;
  };
  EXPECT_EQ(gen({"--lora", out + "/adapter.gguf", "--lora-scale", "0"}), gen({}));
  gen({"--lora", out + "/adapter.gguf"});
  const std::string logits = temp("logits.bin");
  auto e = run_toy({"eval", "-m", fx.model, "--lora", out + "/adapter.gguf", "--tokens", "1,2,3", "--dump-logits", logits});
  EXPECT_EQ(e.status, 0) << describe(e);

  // A second run into the same folder is refused without --force.
  auto again = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--steps", "1", "--out", out});
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  // An adapter is not a model, and a model is not an adapter.
  auto bad = run_toy({"generate", "-m", fx.model, "--lora", fx.model, "-p", "x", "-n", "1"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("general.type"), std::string::npos) << bad.err;
}

TEST(CliFinetune, FullRunAndBadData) {
  const Fixture& fx = fixture();
  const std::string out = temp("full");
  fs::remove_all(out);
  auto r = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--method", "full", "--steps", "2", "--batch", "2",
                    "--merge-type", "q8_0", "--out", out, "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(fs::exists(out + "/model.gguf"));
  EXPECT_FALSE(fs::exists(out + "/adapter.gguf"));
  auto inspect = run_toy({"inspect", out + "/model.gguf"});
  EXPECT_NE(inspect.out.find("q8_0"), std::string::npos) << inspect.out;

  const std::string bad = temp("bad.jsonl");
  std::ofstream(bad) << R"({"prompt": "a", "completion": "b"})" << "\n" << R"({"prompt": "a", "completion": ""})" << "\n";
  auto b = run_toy({"finetune", "-m", fx.model, "--data", bad, "--steps", "1", "--out", temp("bad_run")});
  EXPECT_EQ(b.status, 1);
  EXPECT_NE(b.err.find("line 2: an empty completion"), std::string::npos) << b.err;
  EXPECT_FALSE(fs::exists(temp("bad_run"))) << "nothing is written for a run that cannot start";
  auto flags = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--lora-rank", "0", "--out", temp("x")});
  EXPECT_EQ(flags.status, 2) << describe(flags);
  // An empty --lora-targets is refused (it once meant the defaults, silently).
  auto empty = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--lora-targets", "", "--steps", "1", "--out",
                        temp("empty_targets")});
  EXPECT_EQ(empty.status, 1) << describe(empty);
  EXPECT_NE(empty.err.find("--lora-targets is empty"), std::string::npos) << empty.err;
  EXPECT_FALSE(fs::exists(temp("empty_targets")));
}

// --chat-template renders "messages" records (tool calls included) and goes into model.gguf,
// where toy chat then uses it; resuming with another template is refused.
TEST(CliFinetune, ChatTemplateFlagRendersMessagesAndTravelsWithTheModel) {
  const Fixture& fx = fixture();
  const std::string tmpl = temp("tools.jinja"), data = temp("tools.jsonl"), out = temp("tools_run");
  fs::remove_all(out);
  const std::string text =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(tmpl) << text;
  {
    std::ofstream f(data);
    for (int i = 0; i < 8; ++i)
      f << nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "weather?"}, {"role": "assistant",
            "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}]})").dump()
        << "\n";
  }
  auto r = run_toy({"finetune", "-m", fx.model, "--data", data, "--chat-template", tmpl, "--steps", "2", "--batch", "2",
                    "--save-every", "1", "--out", out, "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  auto inspect = run_toy({"inspect", out + "/model.gguf"});
  EXPECT_NE(inspect.out.find("<tool_call>"), std::string::npos) << "model.gguf carries the template";
  auto chat = run_toy({"chat", "-m", out + "/model.gguf", "-p", "hi", "-n", "2", "--temp", "0"});
  EXPECT_EQ(chat.status, 0) << describe(chat);
  // A template that cannot be read is an error naming the file.
  std::ofstream(temp("broken.jinja")) << "{% if %}";
  auto b = run_toy({"finetune", "-m", fx.model, "--data", data, "--chat-template", temp("broken.jinja"), "--steps", "1",
                    "--out", temp("broken_run")});
  EXPECT_EQ(b.status, 1) << describe(b);
  EXPECT_NE(b.err.find("broken.jinja"), std::string::npos) << b.err;
  // Resuming with another template is refused.
  auto again = run_toy({"finetune", "--resume", out, "--chat-template", temp("broken.jinja"), "--steps", "3"});
  EXPECT_EQ(again.status, 1) << describe(again);
  EXPECT_NE(again.err.find("--chat-template cannot change"), std::string::npos) << again.err;
}

// A run whose outputs cannot be written (here model.gguf.tmp is a folder, as a full disk would
// fail the write) says which checkpoint it can resume from, and the resume then finishes.
TEST(CliFinetune, AFailedOutputWriteNamesTheCheckpointToResumeFrom) {
  const Fixture& fx = fixture();
  const std::string dir = temp("failed_write_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto r = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--steps", "4", "--stop-after", "2", "--batch",
                    "2", "--lora-rank", "2", "--out", dir, "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  fs::create_directory(dir + "/model.gguf.tmp");
  r = run_toy({"finetune", "--resume", dir, "--quiet"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("model.gguf.tmp"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checkpoint.gguf', is whole"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("toy finetune --resume " + dir), std::string::npos) << r.err;
  fs::remove(dir + "/model.gguf.tmp");
  r = run_toy({"finetune", "--resume", dir, "--quiet", "--json"});
  EXPECT_EQ(r.status, 0) << describe(r);
}

// Ctrl-C writes a checkpoint and the outputs; `--resume` continues (the same command line with
// --resume added is accepted; a flag that says what the run is cannot change).
TEST(CliFinetune, CtrlCWritesACheckpointAndResumes) {
  const Fixture& fx = fixture();
  const std::string dir = temp("sigint_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path events = fs::path(dir) / "events.jsonl";
  size_t steps = 0;
  const auto run = toy::test::interrupt_toy_after_steps(
      {"finetune", "-m", fx.model, "--data", fx.data, "--method", "lora", "--steps", "100000", "--batch", "2",
       "--lora-rank", "2", "--lr", "1e-3", "--out", dir, "--quiet"},
      events.string(), 3, &steps, SIGTERM);
  ASSERT_FALSE(run.timed_out) << "toy finetune did not stop after SIGTERM";
  ASSERT_GT(steps, 3u) << "the run took no steps before it was interrupted";
  EXPECT_EQ(run.status, 128 + SIGTERM) << "a run a signal stopped is no success: " << describe(run);
  for (const char* f : {"checkpoint.gguf", "model.gguf", "adapter.gguf", "report.html"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f;
  std::ifstream in(events);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const nlohmann::json end = nlohmann::json::parse(last);
  EXPECT_EQ(end["event"], "run_end");
  EXPECT_EQ(end["stopped"], true);
  const int stopped_at = end["steps"];
  ASSERT_GT(stopped_at, 3);

  auto r = run_toy({"finetune", "--resume", dir, "--steps", std::to_string(stopped_at + 2), "--json", "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(nlohmann::json::parse(last_line(r.out))["steps"], stopped_at + 2);
  // The command line it started with, plus --resume: fine.
  auto same = run_toy({"finetune", "-m", fx.model, "--data", fx.data, "--method", "lora", "--steps",
                       std::to_string(stopped_at + 4), "--batch", "2", "--lora-rank", "2", "--lr", "1e-3", "--out", dir,
                       "--resume", dir, "--quiet", "--json"});
  ASSERT_EQ(same.status, 0) << describe(same);
  EXPECT_EQ(nlohmann::json::parse(last_line(same.out))["steps"], stopped_at + 4);
  auto changed = run_toy({"finetune", "--resume", dir, "--steps", std::to_string(stopped_at + 6), "--lr", "0.5"});
  EXPECT_EQ(changed.status, 1);
  EXPECT_NE(changed.err.find("--lr cannot change when resuming"), std::string::npos) << changed.err;
  auto other_base = run_toy({"finetune", "--resume", dir, "--steps", "1000000", "-m", fx.data});
  EXPECT_EQ(other_base.status, 1);
  EXPECT_NE(other_base.err.find("--model cannot change"), std::string::npos) << other_base.err;
  auto as_train = run_toy({"train", "--resume", dir});
  EXPECT_EQ(as_train.status, 1);
  EXPECT_NE(as_train.err.find("toy finetune --resume"), std::string::npos) << as_train.err;
}

// `toy bench finetune --json` on the tiny shape (the benchmark itself runs SmolLM2-135M): one
// line per mode with tokens/s and its own process's peak memory, then the summary.
TEST(CliFinetune, BenchPrintsEveryMode) {
  auto r = run_toy({"bench", "finetune", "--shape", "tiny", "--ctx", "32", "--batch", "2", "--steps", "1", "--no-peer",
                    "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  std::vector<std::string> modes;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    modes.push_back(j["mode"]);
    if (j["mode"] == "summary") {
      EXPECT_TRUE(j.contains("lora_q8_0_rss_vs_full_f32")) << line;
      continue;
    }
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << line;
    EXPECT_GT(j["peak_rss_mb"].get<double>(), 1) << line;
  }
  EXPECT_EQ(modes, (std::vector<std::string>{"full_f32", "full_bf16", "lora_f32_base", "lora_q8_0_base",
                                             "qlora_q4_k_base", "summary"}));
}
