// toy train / toy generate as a user runs them: JSON summary, streaming generation with
// seeds, Ctrl-C leaves a resumable checkpoint, errors exit non-zero without output files.
#include <gtest/gtest.h>

#include <csignal>

#include "proc.h"
#include "requirements.h"
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/ops/ops.h"

namespace fs = std::filesystem;

namespace {

struct Out {
  int status;
  std::string stdout_text;
};

Out sh(const std::string& args) {
  std::string cmd = std::string(TOY_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

const char* kGpl3 = "/usr/share/common-licenses/GPL-3";
const std::string kTiny = "--layers 1 --heads 2 --dim 32 --ctx 16 --batch 4 --eval-batches 2 --sample-tokens 0 --quiet";

std::string run_dir(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("toy_cli_" + name);
  fs::remove_all(p);
  return p.string();
}

}  // namespace

TEST(CliTrain, JsonSummaryIsTheLastLine) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("json");
  Out o = sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 3 --json " + kTiny);
  ASSERT_EQ(o.status, 0) << o.stdout_text;
  auto j = nlohmann::json::parse(last_line(o.stdout_text));
  for (const char* k : {"steps", "train_loss", "val_loss", "tokens_per_s", "seconds", "out"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["out"], dir);
}

TEST(CliTrain, WithoutDataItUsesTheSystemLicenses) {
  TOY_REQUIRE_FILE("/usr/share/common-licenses");
  const std::string dir = run_dir("nodata");
  Out o = sh("train --out " + dir + " --steps 2 --json " + kTiny);
  ASSERT_EQ(o.status, 0);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.gguf"));
}

TEST(CliTrain, GenerateIsSeededAndPrintsOnlyText) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("gen");
  ASSERT_EQ(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 20 " + kTiny).status, 0);
  const std::string m = "generate -m " + dir + "/model.gguf -p \"The \" -n 40 ";
  Out a = sh(m + "--temp 0.9 --seed 5"), b = sh(m + "--temperature 0.9 --seed 5"), c = sh(m + "--temp 0.9 --seed 6");
  ASSERT_EQ(a.status, 0);
  EXPECT_EQ(a.stdout_text, b.stdout_text);  // same seed, same text (and --temperature aliases --temp)
  EXPECT_NE(a.stdout_text, c.stdout_text);
  Out g1 = sh(m + "--temp 0"), g2 = sh(m + "--temp 0 --seed 99");
  EXPECT_EQ(g1.stdout_text, g2.stdout_text);  // greedy ignores the seed
  EXPECT_GE(a.stdout_text.size(), 20u);
  EXPECT_EQ(a.stdout_text.find("toy"), std::string::npos);  // no diagnostics on stdout
  // Generating past the context window keeps going (the cache is re-primed).
  Out longer = sh("generate -m " + dir + "/model.gguf -n 60 --temp 0.7");
  EXPECT_EQ(longer.status, 0);
  EXPECT_NE(sh("generate -m " + dir + "/missing.gguf -n 5").status, 0);
  EXPECT_NE(sh(m + "--temp -1").status, 0);
}

TEST(CliTrain, AContextOfOneTokenTrainsSamplesAndGenerates) {
  // Regression: ctx = 1 left no prompt token and re-primed the cache with none.
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("ctx1");
  Out t = sh("train --data " + std::string(kGpl3) + " --out " + dir +
             " --steps 3 --layers 1 --heads 2 --dim 32 --ctx 1 --batch 4 --eval-batches 2 --sample-tokens 10 --json");
  ASSERT_EQ(t.status, 0) << t.stdout_text;
  Out g = sh("generate -m " + dir + "/model.gguf -p \"The \" -n 10");
  EXPECT_EQ(g.status, 0) << g.stdout_text;
  EXPECT_GE(g.stdout_text.size(), 5u);
}

TEST(CliTrain, CtrlCWritesACheckpointAndResumes) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("sigint");
  const fs::path events = fs::path(dir) / "events.jsonl";
  size_t steps = 0;
  const auto run = toy::test::interrupt_toy_after_steps(
      {"train", "--data", kGpl3, "--out", dir, "--steps", "100000", "--layers", "1", "--heads", "2", "--dim", "32",
       "--ctx", "16", "--batch", "4", "--eval-batches", "2", "--sample-tokens", "0", "--quiet"},
      events.string(), 5, &steps);
  ASSERT_FALSE(run.timed_out) << "toy train did not stop after SIGINT";
  ASSERT_GT(steps, 5u) << "the run took no steps before it was interrupted";
  EXPECT_EQ(run.status, 128 + SIGINT) << "a run a signal stopped is no success: " << toy::test::describe(run);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoint.gguf"));
  std::ifstream in(events);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  auto j = nlohmann::json::parse(last);
  EXPECT_EQ(j["event"], "run_end");
  EXPECT_EQ(j["stopped"], true);
  const int stopped_at = j["steps"];
  Out r = sh("train --resume " + dir + " --steps " + std::to_string(stopped_at + 3) + " --json --quiet");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(nlohmann::json::parse(last_line(r.stdout_text))["steps"], stopped_at + 3);
  // What a run is cannot change on resume.
  EXPECT_NE(sh("train --resume " + dir + " --lr 0.5").status, 0);
}

TEST(CliTrain, BadInputExitsNonZeroAndWritesNothing) {
  const std::string dir = run_dir("bad");
  EXPECT_NE(sh("train --data /nonexistent --out " + dir + " " + kTiny).status, 0);
  EXPECT_NE(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --preset bert " + kTiny).status, 0);
  EXPECT_NE(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 0 " + kTiny).status, 0);
  EXPECT_NE(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --lr nan " + kTiny).status, 0);
  EXPECT_NE(sh("train --data " + std::string(kGpl3) + " " + kTiny).status, 0);  // no --out
  EXPECT_FALSE(fs::exists(dir));
}

TEST(CliTrain, EvalDumpsRawLogitsAndInspectListsTensors) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("eval");
  ASSERT_EQ(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 5 " + kTiny).status, 0);
  const std::string dump = dir + "/logits.bin";
  ASSERT_EQ(sh("eval -m " + dir + "/model.gguf --tokens 3,1,4,1,5 --dump-logits " + dump).status, 0);
  // Raw little-endian float32 [n_tokens, vocab]: the model's own logits for those ids.
  toy::LoadedModel lm = toy::load_model(dir + "/model.gguf");
  toy::NoGradGuard ng;
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
  const std::vector<float> want = lm.model->logits(toy::from_vector(ids, toy::Shape{1, 5})).to_f32_vector();
  std::ifstream in(dump, std::ios::binary);
  std::vector<float> got(want.size() + 1);
  in.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
  ASSERT_EQ(size_t(in.gcount()), want.size() * 4) << "the file must hold exactly n_tokens x vocab floats";
  got.pop_back();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
  EXPECT_NE(sh("eval -m " + dir + "/model.gguf --tokens 1,x").status, 0);
  EXPECT_NE(sh("eval -m " + dir + "/model.gguf --tokens 99999").status, 0);
  Out ins = sh("inspect " + dir + "/model.gguf");
  ASSERT_EQ(ins.status, 0);
  EXPECT_NE(ins.stdout_text.find("general.architecture"), std::string::npos);
  EXPECT_NE(ins.stdout_text.find("token_embd.weight"), std::string::npos);
  EXPECT_NE(ins.stdout_text.find("[32]"), std::string::npos);
}

TEST(CliTrain, TokenizePrintsIdsWithOptionalBosAndSpecialTokens) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("tokenize");
  ASSERT_EQ(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 2 --tokenizer bpe:50:llama-bpe " +
               kTiny).status, 0);
  const std::string m = "tokenize -m " + dir + "/model.gguf --json ";
  auto ids = [](const Out& o) { return nlohmann::json::parse(last_line(o.stdout_text))["ids"].get<std::vector<int>>(); };
  const std::vector<int> plain = ids(sh(m + "-p 'the <|endoftext|>'"));
  const std::vector<int> bos = ids(sh(m + "-p 'the <|endoftext|>' --bos"));
  const std::vector<int> special = ids(sh(m + "-p 'the <|endoftext|>' --special"));
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(bos.size(), plain.size() + 1);  // BOS only when asked
  EXPECT_EQ(std::vector<int>(bos.begin() + 1, bos.end()), plain);
  // The special token's text is one id with --special, plain text (several ids) without.
  EXPECT_LT(special.size(), plain.size());
  const int eot = special.back();
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
}

TEST(CliTrain, GenerateStopsAtAStopStringWithoutPrintingIt) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = run_dir("stop");
  ASSERT_EQ(sh("train --data " + std::string(kGpl3) + " --out " + dir + " --steps 40 " + kTiny).status, 0);
  const std::string m = "generate -m " + dir + "/model.gguf -p \"The \" -n 60 --temp 0 --quiet ";
  const std::string all = sh(m).stdout_text;
  ASSERT_GE(all.size(), 20u);
  // Stop at a string that first appears part-way through: the text before it, nothing more.
  // (letters and spaces only, so the shell passes it as it is)
  size_t at = 10;
  while (at + 3 < all.size() && !std::all_of(all.begin() + long(at), all.begin() + long(at + 3),
                                              [](char c) { return std::isalpha(uint8_t(c)) || c == ' '; }))
    ++at;
  ASSERT_LT(at + 3, all.size());
  const std::string needle = all.substr(at, 3);
  const size_t first = all.find(needle);
  Out cut = sh(m + "--stop '" + needle + "'");
  EXPECT_EQ(cut.status, 0);
  EXPECT_EQ(cut.stdout_text, all.substr(0, first));
  // A stop string that never appears changes nothing.
  EXPECT_EQ(sh(m + "--stop 'QQQ-never'").stdout_text, all);
  // A prompt longer than --ctx leaves room for is cut, and the user is told (it was silent).
  const toy::test::ProcResult small = toy::test::run_toy(
      {"generate", "-m", dir + "/model.gguf", "-p", "The quick brown fox", "--ctx", "2", "-n", "1", "--temp", "0"});
  EXPECT_EQ(small.status, 0) << toy::test::describe(small);
  EXPECT_NE(small.err.find("more than --ctx 2 holds"), std::string::npos) << small.err;
  EXPECT_NE(small.err.find("only its last 1 are used"), std::string::npos) << small.err;
}

// The thread count changes how work is spread, never the bits: a kernel's partial sums and
// its BLAS calls follow the shape alone (a data-parallel run of one-thread processes equals
// one process on many threads because of it). GPT-2 (LayerNorm, tied) and Llama (RMSNorm,
// SwiGLU) shapes, with dropout, on 1, 2 and 3 threads.
TEST(CliTrain, TheTrainedBitsDoNotDependOnTheThreadCount) {
  for (const char* preset : {"gpt", "llama"}) {
    std::string first;
    for (const char* threads : {"1", "2", "3"}) {
      const std::string out = (std::filesystem::path(::testing::TempDir()) /
                               ("toy_threads_" + std::to_string(getpid()) + "_" + preset + "_" + threads))
                                  .string();
      std::filesystem::remove_all(out);
      const auto r = toy::test::run_toy({"train", "--out", out, "--preset", preset, "--steps", "4", "--batch", "4",
                                         "--layers", "2", "--dim", "96", "--heads", "4", "--ctx", "128", "--dropout",
                                         "0.1", "--threads", threads, "--eval-every", "0", "--sample-tokens", "0",
                                         "--quiet"});
      ASSERT_EQ(r.status, 0) << toy::test::describe(r);
      // Every tensor's bytes (the options name the thread count).
      toy::gguf::Reader rd(out + "/checkpoint.gguf");
      std::string bytes;
      for (const toy::gguf::TensorInfo& t : rd.tensors())
        bytes += t.name + std::string(static_cast<const char*>(rd.tensor(t.name).raw_data()), t.bytes);
      ASSERT_FALSE(bytes.empty());
      if (first.empty())
        first = bytes;
      else
        EXPECT_TRUE(bytes == first) << preset << ": the checkpoint on " << threads << " threads differs from 1 thread's";
      std::filesystem::remove_all(out);
    }
  }
}
