// `toy finetune`'s checkpoints: a run stopped and resumed ends bit for bit where the same run
// without a stop ends (LoRA with dropout, packing and the best rule; full with F16 loss
// scaling and accumulation); what a resume refuses (other data, a finished run, a damaged
// checkpoint); the report.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "finetune/finetune_helpers.h"
#include "helpers.h"
#include "proc.h"
#include "toy/core/error.h"
#include "toy/io/gguf.h"
#include "toy/train/finetune.h"

using namespace toy;
using toy::test::error_of;
namespace fs = std::filesystem;

namespace {

std::string temp(const std::string& name) { return toy::test::process_temp("toy_ftr_", name); }

const std::string& tiny_model() { return toy::test::tiny_qwen2_model(); }

std::string write_data(const std::string& name, int n) {
  const std::string path = temp(name);
  std::ofstream f(path);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel"};
  for (int i = 0; i < n; ++i) {
    const std::string w = std::string(words[i % 8]) + words[(i * 3 + 1) % 8];
    f << nlohmann::json({{"prompt", w + " ="}, {"completion", " " + std::string(w.rbegin(), w.rend())}}).dump()
      << "\n";
  }
  return path;
}

std::string bytes_of(const std::string& path) { return toy::test::read_all(path); }

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Runs `o` straight through and as two sessions (stopped after `stop`, then resumed); the
// outputs must be the same bytes.
void expect_resume_is_bit_exact(FinetuneOptions o, int64_t stop, const std::vector<std::string>& outputs) {
  const std::string name = fs::path(o.out).filename().string();
  o.force = true, o.quiet = true;
  const std::string straight = o.out + "_straight", split = o.out + "_split";
  o.out = straight;
  const FinetuneResult a = finetune(o);
  o.out = split, o.stop_after = stop;
  const FinetuneResult first = finetune(o);
  EXPECT_TRUE(first.stopped);
  EXPECT_EQ(first.steps, stop);
  ASSERT_TRUE(fs::exists(split + "/checkpoint.gguf"));
  const FinetuneResult b = resume_finetune(split, [](FinetuneOptions& s) { s.quiet = true; });
  EXPECT_FALSE(b.stopped);
  EXPECT_EQ(b.steps, a.steps);
  EXPECT_EQ(b.train_loss, a.train_loss) << name;
  EXPECT_EQ(b.val_loss, a.val_loss) << name;
  EXPECT_EQ(b.best_step, a.best_step) << name;
  EXPECT_EQ(b.model, a.model) << name;
  EXPECT_EQ(b.skipped_steps, a.skipped_steps) << name;
  std::printf("%s: %lld steps (%lld skipped), outputs hold the %s weights (best step %lld)\n", name.c_str(),
              (long long)a.steps, (long long)a.skipped_steps, a.model.c_str(), (long long)a.best_step);
  for (const std::string& f : outputs)
    EXPECT_TRUE(bytes_of(straight + "/" + f) == bytes_of(split + "/" + f)) << name << ": " << f << " differs";
  // And the state each ends with (all but the time it took and the folder).
  auto state_of = [](const std::string& dir) {
    nlohmann::json st = nlohmann::json::parse(gguf::Reader(dir + "/checkpoint.gguf").get_str("toy.finetune.state"));
    st.erase("seconds");
    return st;
  };
  EXPECT_EQ(state_of(straight), state_of(split)) << name;
  // One event log: two sessions, every step once.
  const std::string events = bytes_of(split + "/events.jsonl");
  EXPECT_EQ(count_of(events, "\"event\":\"run_start\""), 2);
  EXPECT_EQ(count_of(events, "\"event\":\"step\""), int(a.steps));
  EXPECT_TRUE(fs::exists(split + "/report.html"));
}

}  // namespace

TEST(FinetuneResume, LoraWithDropoutAndPackingIsBitExact) {
  FinetuneOptions o;
  o.model = tiny_model(), o.data = write_data("lora.jsonl", 60), o.out = temp("lora");
  o.method = "lora", o.lora_rank = 4, o.lora_dropout = 0.1f, o.pack = true, o.ctx = 48, o.batch = 2;
  o.steps = 12, o.lr = 10.0f, o.clip = 0, o.eval_every = 2, o.val_fraction = 0.1, o.merge_type = "f32";
  expect_resume_is_bit_exact(o, 9, {"adapter.gguf", "model.gguf"});  // (the best is at step 8)
}

TEST(FinetuneResume, FullWithF16LossScalingAndAccumulationIsBitExact) {
  FinetuneOptions o;
  o.model = tiny_model(), o.data = write_data("full.jsonl", 40), o.out = temp("full");
  o.method = "full", o.precision = "f16", o.loss_scale = 1024;  // (the scale is state: it must resume too)
  o.steps = 10, o.batch = 3, o.accum = 2, o.lr = 3e-3f, o.eval_every = 2, o.val_fraction = 0.2, o.epochs = 1;
  expect_resume_is_bit_exact(o, 6, {"model.gguf"});
}

TEST(FinetuneResume, RefusesOtherFilesAFinishedRunAndABadCheckpoint) {
  FinetuneOptions o;
  o.model = tiny_model(), o.data = write_data("refuse.jsonl", 30), o.out = temp("refuse");
  o.steps = 6, o.stop_after = 2, o.quiet = true, o.force = true, o.lora_rank = 2;
  ASSERT_TRUE(finetune(o).stopped);
  const std::string data = o.data, ckpt = o.out + "/checkpoint.gguf", saved = bytes_of(o.data);
  {
    std::ofstream f(data, std::ios::app);
    f << R"({"prompt": "x", "completion": "y"})" << "\n";
  }
  EXPECT_NE(error_of([&] { resume_finetune(o.out); }).find("the training data changed"), std::string::npos);
  std::ofstream(data, std::ios::binary) << saved;
  // A longer run may continue; the finished one may not.
  EXPECT_EQ(resume_finetune(o.out).steps, 6);
  EXPECT_NE(error_of([&] { resume_finetune(o.out); }).find("already finished its 6 steps"), std::string::npos);
  EXPECT_EQ(resume_finetune(o.out, [](FinetuneOptions& s) { s.steps = 8; }).steps, 8);
  // A damaged checkpoint: a clear error, never a crash.
  std::string bytes = bytes_of(ckpt);
  std::ofstream(ckpt, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(error_of([&] { resume_finetune(o.out); }).find("checkpoint.gguf"), std::string::npos);
  EXPECT_NE(error_of([&] { resume_finetune(temp("no_such_run")); }).find("not a run folder"), std::string::npos);
  // The report names the command and what model.gguf holds.
  const std::string report = bytes_of(o.out + "/report.html");
  EXPECT_NE(report.find("toy finetune report"), std::string::npos);
  EXPECT_NE(report.find("<svg"), std::string::npos);
  EXPECT_NE(report.find("adapter.gguf"), std::string::npos);
}
