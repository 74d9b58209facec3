// Hostile input, one test per defect found by trying toy as a hostile user would (issue 6):
// each of these failed before its fix. Runs the real program (tests/proc.h) and makes damaged
// files from good ones (tests/gguf_edit.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "gguf_edit.h"
#include "proc.h"
#include "requirements.h"
#include "toy/core/files.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"

namespace fs = std::filesystem;
using namespace toy;
using namespace toy::test;

namespace {

const char* kGpl3 = "/usr/share/common-licenses/GPL-3";

std::vector<std::string> tiny_args() {
  return {"--layers", "1", "--heads", "2", "--dim", "32", "--ctx", "16", "--batch", "4", "--eval-batches", "2",
          "--sample-tokens", "0", "--quiet", "--threads", "1"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string fresh_dir(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("toy_hostile_" + name);
  fs::remove_all(p);
  return p.string();
}

// A private copy of GPL-3 (tests edit it).
std::string text_file(const std::string& dir, const std::string& name = "text.txt") {
  fs::create_directories(dir);
  const std::string p = (fs::path(dir) / name).string();
  fs::copy_file(kGpl3, p, fs::copy_options::overwrite_existing);
  return p;
}

// Every file of a folder with its bytes, to show that a refused command changed nothing.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir)) m[e.path().filename().string()] = read_all(e.path().string());
  return m;
}

ProcResult train_run(const std::string& data, const std::string& out, std::vector<std::string> extra = {}) {
  return run_toy(std::vector<std::string>{"train", "--data", data, "--out", out} + tiny_args() + extra);
}

nlohmann::json last_json(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return nlohmann::json::parse(s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1));
}

std::vector<nlohmann::json> events(const std::string& dir) {
  std::vector<nlohmann::json> v;
  std::ifstream in((fs::path(dir) / "events.jsonl").string());
  for (std::string line; std::getline(in, line);) {
    // The run may be writing its last line right now: a torn line is not an event yet.
    nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
    if (!e.is_discarded()) v.push_back(e);
  }
  return v;
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

#define REQUIRE_GPL3() \
  TOY_REQUIRE_FILE(kGpl3)

// A stopped run (checkpoint at step 5 of 40) to resume from.
std::string stopped_run(const std::string& name, std::string* data = nullptr) {
  const std::string dir = fresh_dir(name);
  const std::string text = text_file(dir + "_data");
  if (data) *data = text;
  ProcResult r = train_run(text, dir, {"--steps", "40", "--stop-after", "5"});
  EXPECT_EQ(r.status, 0) << describe(r);
  return dir;
}

}  // namespace

// ---- data loss ------------------------------------------------------------------------------

TEST(Hostile, OutHoldingARunIsRefusedAndForceReplacesIt) {
  REQUIRE_GPL3();
  const std::string dir = fresh_dir("out_run"), text = text_file(dir + "_data");
  ASSERT_EQ(train_run(text, dir, {"--steps", "3"}).status, 0);
  const auto before = snapshot(dir);
  ProcResult again = train_run(text, dir, {"--steps", "4", "--seed", "9"});
  EXPECT_NE(again.status, 0);
  EXPECT_TRUE(has(again.err, "already holds a run")) << again.err;
  EXPECT_TRUE(has(again.err, "--force") && has(again.err, "--resume")) << again.err;
  EXPECT_EQ(snapshot(dir), before) << "a refused run changed the folder";
  ProcResult forced = train_run(text, dir, {"--steps", "4", "--seed", "9", "--force", "--json"});
  ASSERT_EQ(forced.status, 0) << describe(forced);
  EXPECT_EQ(last_json(forced.out)["steps"], 4);
  EXPECT_NE(read_all(dir + "/model.gguf"), before.at("model.gguf"));
}

TEST(Hostile, OutHoldingOtherFilesIsRefusedEvenWithForce) {
  REQUIRE_GPL3();
  const std::string dir = fresh_dir("out_other"), text = text_file(dir + "_data");
  ASSERT_EQ(train_run(text, dir, {"--steps", "2"}).status, 0);
  std::ofstream(dir + "/notes.txt") << "mine";
  const auto before = snapshot(dir);
  ProcResult r = train_run(text, dir, {"--steps", "2", "--force"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(has(r.err, "notes.txt")) << r.err;
  EXPECT_EQ(snapshot(dir), before);
  // A folder of something else entirely is refused without --force too, and nothing is made.
  const std::string other = fresh_dir("out_foreign");
  fs::create_directories(other + "/src");
  EXPECT_NE(train_run(text, other, {"--steps", "2"}).status, 0);
  EXPECT_EQ(std::distance(fs::directory_iterator(other), fs::directory_iterator()), 1);
}

// --force replaces toy's runs only: a folder holding a user's own model.gguf (a file name a
// run also writes) with no sign of a run (events.jsonl, checkpoint.gguf) is not a run.
TEST(Hostile, ForceDoesNotReplaceAUsersOwnModelFile) {
  REQUIRE_GPL3();
  const std::string dir = fresh_dir("out_users_model"), text = text_file(dir + "_data");
  fs::create_directories(dir);
  std::ofstream(dir + "/model.gguf") << "the user's own model";
  const auto before = snapshot(dir);
  ProcResult r = train_run(text, dir, {"--steps", "2", "--force"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(has(r.err, "model.gguf")) << r.err;
  EXPECT_EQ(snapshot(dir), before) << "the user's file was replaced";
}

class HostileSignal : public ::testing::TestWithParam<int> {};

TEST_P(HostileSignal, StopsWithACheckpointThatResumes) {
  REQUIRE_GPL3();
  const int sig = GetParam();
  const std::string dir = fresh_dir("signal_" + std::to_string(sig)), text = text_file(dir + "_data");
  const std::string out = dir + ".out", err = dir + ".err";
  const pid_t pid = spawn_toy(std::vector<std::string>{"train", "--data", text, "--out", dir, "--steps", "1000000"} +
                                  tiny_args(), {}, out, err);
  size_t steps = 0;
  for (int i = 0; i < 1200 && steps < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    steps = 0;
    if (fs::exists(dir + "/events.jsonl"))
      for (const auto& e : events(dir)) steps += e["event"] == "step";
  }
  ASSERT_GE(steps, 5u) << "the run took no steps: " << read_all(err);
  kill(pid, sig);
  ProcResult r;
  wait_toy(pid, 60, r);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, 0) << "killed by the signal instead of stopping cleanly";
  EXPECT_EQ(r.status, 128 + sig) << "a run a signal stopped exits as the shell reports the signal: " << read_all(err);
  ASSERT_TRUE(fs::exists(dir + "/checkpoint.gguf"));
  const auto ev = events(dir);
  EXPECT_EQ(ev.back()["event"], "run_end");
  EXPECT_EQ(ev.back()["stopped"], true);
  const int64_t at = ev.back()["steps"];
  const std::string until = std::to_string(at + 2);
  ProcResult res = run_toy({"train", "--resume", dir, "--stop-after", until, "--json", "--quiet"});
  ASSERT_EQ(res.status, 0) << describe(res);
  EXPECT_EQ(last_json(res.out)["steps"], at + 2);
  // Bit for bit where a run that was never interrupted stands after the same steps.
  const std::string whole = fresh_dir("signal_whole_" + std::to_string(sig));
  ProcResult w = run_toy(std::vector<std::string>{"train", "--data", text, "--out", whole, "--steps", "1000000",
                                                  "--stop-after", until} + tiny_args());
  ASSERT_EQ(w.status, 0) << describe(w);
  GgufContents a = read_gguf(dir + "/checkpoint.gguf"), b = read_gguf(whole + "/checkpoint.gguf");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (auto& [name, t] : a.tensors) EXPECT_EQ(t.to_f32_vector(), b.tensor(name)->to_f32_vector()) << name;
}

INSTANTIATE_TEST_SUITE_P(Signals, HostileSignal, ::testing::Values(SIGTERM, SIGHUP, SIGINT), [](const auto& info) {
  return std::string(info.param == SIGTERM ? "SIGTERM" : info.param == SIGHUP ? "SIGHUP" : "SIGINT");
});

TEST(Hostile, SaveEveryWritesCheckpointsAKilledRunCanResumeFrom) {
  REQUIRE_GPL3();
  const std::string dir = fresh_dir("save_every"), text = text_file(dir + "_data");
  ProcResult r = train_run(text, dir, {"--steps", "12", "--save-every", "5"});
  ASSERT_EQ(r.status, 0) << describe(r);
  std::vector<int64_t> periodic;
  for (const auto& e : events(dir))
    if (e["event"] == "checkpoint" && e["reason"] == "periodic") periodic.push_back(e["step"]);
  EXPECT_EQ(periodic, (std::vector<int64_t>{5, 10}));

  // SIGKILL: nothing runs at exit, so only the periodic checkpoint can be there.
  const std::string killed = fresh_dir("sigkill");
  const pid_t pid = spawn_toy(std::vector<std::string>{"train", "--data", text, "--out", killed, "--steps", "1000000",
                                                       "--save-every", "3"} + tiny_args(),
                              {}, killed + ".out", killed + ".err");
  for (int i = 0; i < 2400 && !fs::exists(killed + "/checkpoint.gguf"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_TRUE(fs::exists(killed + "/checkpoint.gguf")) << read_all(killed + ".err");
  kill(pid, SIGKILL);
  ProcResult k;
  wait_toy(pid, 30, k);
  // However far the run got before the kill, the checkpoint is a multiple of 3 and resumes.
  const int64_t saved = nlohmann::json::parse(read_gguf(killed + "/checkpoint.gguf").find("toy.train.state")->s)["step"];
  EXPECT_EQ(saved % 3, 0);
  const std::string until = std::to_string(saved + 2);
  ProcResult res = run_toy({"train", "--resume", killed, "--steps", until, "--json", "--quiet"});
  ASSERT_EQ(res.status, 0) << describe(res);
  EXPECT_EQ(last_json(res.out)["steps"], saved + 2);
}

TEST(Hostile, ALeftOverTemporaryCheckpointIsRemovedAtTheNextStart) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("stale_tmp");
  std::ofstream(dir + "/checkpoint.gguf.tmp") << "half a checkpoint";
  ProcResult r = run_toy({"train", "--resume", dir, "--stop-after", "6", "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.gguf.tmp"));
  EXPECT_TRUE(has(r.err, "checkpoint.gguf.tmp")) << r.err;
}

TEST(Hostile, ACheckpointWithNonFiniteStateIsRefused) {
  REQUIRE_GPL3();
  for (const char* which : {"opt.m.token_embd.weight", "opt.v.blk.0.ffn_up.weight", "token_embd.weight"}) {
    const std::string dir = stopped_run(std::string("nan_") + which);
    const std::string model_before = read_all(dir + "/model.gguf");
    edit_gguf(dir + "/checkpoint.gguf", [&](GgufContents& c) { c.tensor(which)->data<float>()[3] = NAN; });
    ProcResult r = run_toy({"train", "--resume", dir, "--quiet"});
    EXPECT_EQ(r.status, 1) << describe(r);
    EXPECT_TRUE(has(r.err, which) && has(r.err, "non-finite")) << r.err;
    EXPECT_EQ(read_all(dir + "/model.gguf"), model_before) << which;
  }
  const std::string dir = stopped_run("inf_v");
  edit_gguf(dir + "/checkpoint.gguf", [](GgufContents& c) { c.tensor("opt.v.output_norm.weight")->data<float>()[0] = -1; });
  ProcResult r = run_toy({"train", "--resume", dir, "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "negative")) << r.err;
}

TEST(Hostile, ACheckpointWithAStepOutOfRangeIsRefused) {
  REQUIRE_GPL3();
  for (const int64_t step : {int64_t(-1), int64_t(41), int64_t(1) << 40}) {
    const std::string dir = stopped_run("step_" + std::to_string(step));
    edit_gguf(dir + "/checkpoint.gguf", [&](GgufContents& c) {
      gguf::Value* v = c.find("toy.train.state");
      nlohmann::json st = nlohmann::json::parse(v->s);
      st["step"] = step;
      st["optimizer_steps"] = step;
      v->s = st.dump();
    });
    ProcResult r = run_toy({"train", "--resume", dir, "--quiet"});
    EXPECT_EQ(r.status, 1) << step;
    EXPECT_TRUE(has(r.err, "toy.train.state") && has(r.err, "step")) << r.err;
  }
}

TEST(Hostile, ANonFiniteStepStopsTheRunAndKeepsTheFiles) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("diverge");
  // Finite but enormous weights pass validation; the next step's loss is not finite.
  edit_gguf(dir + "/checkpoint.gguf", [](GgufContents& c) {
    Tensor* t = c.tensor("blk.0.ffn_up.weight");
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = 3e38f;
  });
  const std::string ckpt = read_all(dir + "/checkpoint.gguf"), model = read_all(dir + "/model.gguf");
  ProcResult r = run_toy({"train", "--resume", dir, "--quiet"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_TRUE(has(r.err, "the loss became") && has(r.err, "not applied") && has(r.err, "step 6") &&
              has(r.err, "kept")) << r.err;
  EXPECT_EQ(read_all(dir + "/checkpoint.gguf"), ckpt);
  EXPECT_EQ(read_all(dir + "/model.gguf"), model);
  EXPECT_EQ(events(dir).back()["event"], "run_end");
}

TEST(Hostile, ACheckpointOfAnotherFormatVersionIsRefusedNamingBoth) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("version");
  edit_gguf(dir + "/checkpoint.gguf", [](GgufContents& c) { c.find("toy.checkpoint.version")->u = 7; });
  ProcResult r = run_toy({"train", "--resume", dir, "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "version 7") && has(r.err, "version 1")) << r.err;
  edit_gguf(dir + "/checkpoint.gguf", [](GgufContents& c) {
    c.kv.erase(std::remove_if(c.kv.begin(), c.kv.end(), [](auto& kv) { return kv.first == "toy.checkpoint.version"; }),
               c.kv.end());
  });
  r = run_toy({"train", "--resume", dir, "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "toy.checkpoint.version")) << r.err;
}

TEST(Hostile, BadValuesWriteNothing) {
  REQUIRE_GPL3();
  const std::string text = text_file(fresh_dir("nothing_data"));
  const std::vector<std::vector<std::string>> bad = {
      {"--batch", "1048576"}, {"--dim", "1048576", "--heads", "1"}, {"--lr", "1e30"}, {"--init-scale", "inf"},
      {"--ctx", "16777216"}};
  for (const auto& extra : bad) {
    const std::string dir = fresh_dir("nothing");
    std::vector<std::string> args = {"train", "--data", text, "--out", dir, "--layers", "1", "--quiet"};
    // Under an address-space limit: a run that slipped past the checks fails fast, not by
    // exhausting the machine.
    ProcResult r = run_toy(args + extra, {.address_space = under_asan() ? 0 : uint64_t(4) << 30});
    EXPECT_NE(r.status, 0) << extra[0];
    EXPECT_FALSE(fs::exists(dir)) << extra[0] << " created the run folder: " << r.err;
  }
}

TEST(Hostile, AChangedCorpusIsRefusedUnlessAllowed) {
  REQUIRE_GPL3();
  std::string text;
  const std::string dir = stopped_run("corpus_change", &text);
  // Same characters, other order: the vocabulary cannot notice.
  std::string s = read_all(text);
  std::reverse(s.begin(), s.end());
  std::ofstream(text, std::ios::binary) << s;
  ProcResult r = run_toy({"train", "--resume", dir, "--stop-after", "7", "--quiet"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "changed") && has(r.err, "text.txt") && has(r.err, "--allow-data-change")) << r.err;
  ProcResult ok = run_toy({"train", "--resume", dir, "--stop-after", "7", "--allow-data-change", "--quiet", "--json"});
  EXPECT_EQ(ok.status, 0) << describe(ok);
  // A character the vocabulary lacks is blamed on the changed text, not on the vocabulary alone.
  std::ofstream(text, std::ios::app) << "\xe2\x98\x83";
  ProcResult snow = run_toy({"train", "--resume", dir, "--allow-data-change", "--quiet"});
  EXPECT_EQ(snow.status, 1);
  EXPECT_TRUE(has(snow.err, "vocabulary was built from the text it started with")) << snow.err;
}

// ---- crashes, hangs, memory -------------------------------------------------------------------

TEST(Hostile, ToyThreadsIsParsedStrictly) {
  for (const char* v : {"abc", "0", "-1", "2abc", "1025", "", " 2"}) {
    ProcResult r = run_toy({"ops"}, {.env = {std::string("TOY_THREADS=") + v}});
    EXPECT_EQ(r.status, 1) << "TOY_THREADS='" << v << "'";
    EXPECT_TRUE(has(r.err, "TOY_THREADS")) << r.err;
  }
  EXPECT_EQ(run_toy({"ops"}, {.env = {"TOY_THREADS=3"}}).status, 0);
}

TEST(Hostile, AThreadCountTheSystemCannotStartIsAnError) {
  if (under_asan()) GTEST_SKIP() << "AddressSanitizer cannot run under an address-space limit";
  // 1000 threads of 8 MiB stacks cannot fit in 2 GiB of address space.
  ProcResult r = run_toy({"demo", "--steps", "1"}, {.env = {"TOY_THREADS=1000"}, .address_space = uint64_t(2) << 30});
  EXPECT_EQ(r.signal, 0) << "aborted: " << r.err;
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_TRUE(has(r.err, "could not start thread")) << r.err;
}

TEST(Hostile, FifosAreRefusedNotWaitedOn) {
  REQUIRE_GPL3();
  const std::string dir = fresh_dir("fifo");
  fs::create_directories(dir);
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const ProcOptions quick{.timeout_s = 20};
  std::vector<ProcResult> rs = {
      run_toy({"train", "--data", fifo, "--out", dir + "/run"}, quick),
      run_toy({"generate", "-m", fifo}, quick),
      run_toy({"ops"}, {.env = {"TOY_TRACE=" + fifo}, .timeout_s = 20}),
  };
  const std::string run = stopped_run("fifo_ckpt");
  fs::remove(run + "/checkpoint.gguf");
  ASSERT_EQ(mkfifo((run + "/checkpoint.gguf").c_str(), 0644), 0);
  rs.push_back(run_toy({"train", "--resume", run}, quick));
  for (const ProcResult& r : rs) {
    EXPECT_FALSE(r.timed_out) << "hung on a FIFO";
    EXPECT_EQ(r.status, 1) << describe(r);
    EXPECT_TRUE(has(r.err, "FIFO")) << r.err;
  }
  ProcResult dev = run_toy({"train", "--data", "/dev/zero", "--out", dir + "/run"}, quick);
  EXPECT_EQ(dev.status, 1);
  EXPECT_TRUE(has(dev.err, "character device")) << dev.err;
}

TEST(Hostile, ATokenCacheWithAnImpossibleCountIsRebuilt) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("token_cache");
  {
    std::fstream f(dir + "/tokens.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(16);
    const uint64_t n = uint64_t(1) << 31;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  for (int i = 0; i < 2; ++i) {  // the first resume rebuilds it, the second reads it
    // Under an address-space limit, so trusting the count (an 8 GiB allocation) would fail.
    ProcResult r = run_toy({"train", "--resume", dir, "--stop-after", std::to_string(6 + i), "--quiet"},
                           {.address_space = under_asan() ? 0 : uint64_t(3) << 30});
    EXPECT_EQ(r.status, 0) << describe(r);
  }
}

TEST(Hostile, AModelConfigClaimingAHugeContextFailsBeforeAllocating) {
  if (under_asan()) GTEST_SKIP() << "AddressSanitizer cannot run under an address-space limit";
  REQUIRE_GPL3();
  const std::string dir = stopped_run("huge_ctx");
  edit_gguf(dir + "/model.gguf", [](GgufContents& c) {
    gguf::Value* v = c.find("toy.config");
    nlohmann::json j = nlohmann::json::parse(v->s);
    j["ctx"] = int64_t(1) << 24;  // a 2 GiB position table for dim 32
    v->s = j.dump();
  });
  ProcResult r = run_toy({"generate", "-m", dir + "/model.gguf", "-n", "2"}, {.address_space = uint64_t(1) << 30});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_TRUE(has(r.err, "position_embd.weight") && has(r.err, "the config says")) << r.err;
}

// ---- messages ---------------------------------------------------------------------------------

TEST(Hostile, CorruptJsonInACheckpointNamesTheFileAndTheKey) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("bad_json");
  edit_gguf(dir + "/checkpoint.gguf", [](GgufContents& c) { c.find("toy.train.state")->s = "{\"step\": 5,"; });
  ProcResult r = run_toy({"train", "--resume", dir});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "checkpoint.gguf") && has(r.err, "toy.train.state") && has(r.err, "not valid JSON")) << r.err;
  EXPECT_FALSE(has(r.err, "internal error")) << r.err;
}

TEST(Hostile, ASymlinkLoopInADataFolderIsSkippedWithANote) {
  REQUIRE_GPL3();
  const std::string data = fresh_dir("loop_data");
  text_file(data);
  fs::create_symlink("loop", data + "/loop");
  fs::create_symlink(data + "/missing", data + "/dangling");
  ProcResult r = train_run(data, fresh_dir("loop"), {"--steps", "2"});
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_TRUE(has(r.err, "skipped") && has(r.err, "loop")) << r.err;
}

TEST(Hostile, AFolderGivenAsAModelSaysSo) {
  ProcResult r = run_toy({"generate", "-m", ::testing::TempDir()});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "is a folder")) << r.err;
}

TEST(Hostile, ControlCharactersFromAFileAreEscaped) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("escapes");
  edit_gguf(dir + "/model.gguf", [](GgufContents& c) {
    c.kv.erase(std::remove_if(c.kv.begin(), c.kv.end(), [](auto& kv) { return kv.first == "toy.tokenizer.kind"; }),
               c.kv.end());
    c.find("tokenizer.ggml.model")->s = std::string("\x1b[2J\x1b[H evil\0after", 18);
  });
  ProcResult r = run_toy({"generate", "-m", dir + "/model.gguf"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "an escape sequence reached the terminal";
  EXPECT_TRUE(has(r.err, "\\x1b[2J\\x1b[H evil\\0after")) << r.err;  // all of it, past the NUL
  edit_gguf(dir + "/model.gguf", [](GgufContents& c) { c.find("toy.config")->s = std::string("\x1b[31m", 5); });
  r = run_toy({"generate", "-m", dir + "/model.gguf"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  // A key with a NUL and an escape inside, echoed by the reader's own checks (written by hand:
  // toy's writer cannot write a key twice).
  std::string raw("GGUF\3\0\0\0", 8);
  auto u64 = [&](uint64_t v) { raw.append(reinterpret_cast<const char*>(&v), 8); };
  auto u32 = [&](uint32_t v) { raw.append(reinterpret_cast<const char*>(&v), 4); };
  u64(0), u64(2);
  for (uint32_t value : {1u, 2u}) {
    const std::string key("dup\0\x1b[2J", 8);
    u64(key.size()), raw += key, u32(4), u32(value);
  }
  std::ofstream(dir + "/dup.gguf", std::ios::binary) << raw;
  r = run_toy({"generate", "-m", dir + "/dup.gguf"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos);
  EXPECT_TRUE(has(r.err, "duplicate key 'dup\\0\\x1b[2J'")) << r.err;
}

TEST(Hostile, EveryErrorLooksAlikeUsageExits2RuntimeExits1) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"train", "--bogus"}, {"train", "--dim", "x"}, {"generate"}, {"nosuchcommand"}, {"train", "--keep", "x"}}) {
    ProcResult r = run_toy(args);
    EXPECT_EQ(r.status, 2) << args[1] << ": " << r.err;
    EXPECT_EQ(r.err.rfind("toy: ", 0), 0u) << r.err;
  }
  ProcResult rt = run_toy({"generate", "-m", "/nonexistent.gguf"});
  EXPECT_EQ(rt.status, 1);
  EXPECT_EQ(rt.err.rfind("toy: ", 0), 0u) << rt.err;
}

TEST(Hostile, ZeroAndNonsenseModelValuesAreRejectedNamingTheFlag) {
  const std::vector<std::vector<std::string>> bad = {
      {"--dim", "0"},       {"--heads", "0"},       {"--layers", "0"},        {"--ctx", "0"},
      {"--kv-heads", "0"},  {"--dropout", "-0.5"},  {"--dropout", "nan"},     {"--init-scale", "-1"},
      {"--init-scale", "nan"}, {"--bias", "-5"},    {"--bias", "2"},          {"--tied", "7"},
      {"--seed", "18446744073709551616"}, {"--steps", "99999999999999999999"}, {"--batch", ""},
      {"--lr", "0x1p-3"},   {"--accum", "65537"},   {"--log-every", "0"},     {"--threads", "2abc"}};
  for (const auto& b : bad) {
    ProcResult r = run_toy({"train", "--out", fresh_dir("nonsense"), b[0], b[1]});
    EXPECT_EQ(r.status, 2) << b[0] << " " << b[1] << ": " << r.err;
    EXPECT_TRUE(has(r.err, b[0] + " must be")) << r.err;
  }
  ProcResult accum = run_toy({"train", "--out", fresh_dir("nonsense"), "--accum", "65537"});
  EXPECT_TRUE(has(accum.err, "1..65536")) << accum.err;
  for (const auto& b : std::vector<std::vector<std::string>>{{"-n", "99999999999999999999"}, {"-n", ""}, {"-n", "-3"},
                                                              {"--top-p", "0"}, {"--temp", "inf"}}) {
    ProcResult r = run_toy({"generate", "-m", "x.gguf", b[0], b[1]});
    EXPECT_EQ(r.status, 2) << b[0] << " " << b[1];
  }
}

TEST(Hostile, AFractionalIntegerInAModelConfigIsRejected) {
  REQUIRE_GPL3();
  const std::string dir = stopped_run("fraction");
  edit_gguf(dir + "/model.gguf", [](GgufContents& c) {
    gguf::Value* v = c.find("toy.config");
    nlohmann::json j = nlohmann::json::parse(v->s);
    j["dim"] = 32.7;
    v->s = j.dump();
  });
  ProcResult r = run_toy({"generate", "-m", dir + "/model.gguf"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "'dim'") && has(r.err, "integer") && has(r.err, "toy.config")) << r.err;
}

TEST(Hostile, AnUnreadableDataFileSaysWhy) {
  // The OS's reason is named (here: a path through a file is "Not a directory").
  ProcResult r = run_toy({"train", "--data", std::string(kGpl3) + "/x", "--out", fresh_dir("unreadable")});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "Not a directory") && has(r.err, "GPL-3/x")) << r.err;
  try {
    read_regular_file(std::string(kGpl3) + "/x", "[data]");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "Not a directory")) << e.what();
  }
}

TEST(Hostile, AnIgnoredSighupStaysIgnored) {
  // `nohup toy train ...`: a closed terminal must not stop the run.
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = fresh_dir("nohup"), text = text_file(dir + "_data");
  ProcOptions o;
  o.ignore_sighup = true;
  const pid_t pid = spawn_toy(std::vector<std::string>{"train", "--data", text, "--out", dir, "--steps", "1000000"} +
                                  tiny_args(), o, dir + ".out", dir + ".err");
  for (int i = 0; i < 1200 && events(dir).size() < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  kill(pid, SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the run stopped on an ignored SIGHUP";
  kill(pid, SIGTERM);
  ProcResult r;
  wait_toy(pid, 60, r);
  EXPECT_EQ(r.status, 128 + SIGTERM) << "stopped by SIGTERM, with a checkpoint";
  EXPECT_TRUE(fs::exists(dir + "/checkpoint.gguf"));
}

TEST(Hostile, AFifoAmongTheRunFilesIsRefusedOnResume) {
  TOY_REQUIRE_FILE(kGpl3);
  const std::string dir = stopped_run("fifo_events");
  fs::remove(dir + "/events.jsonl");
  ASSERT_EQ(mkfifo((dir + "/events.jsonl").c_str(), 0644), 0);
  ProcResult r = run_toy({"train", "--resume", dir, "--quiet"}, {.timeout_s = 20});
  EXPECT_FALSE(r.timed_out) << "hung on a FIFO";
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.err, "events.jsonl") && has(r.err, "FIFO")) << r.err;
}

TEST(Hostile, ThreadsFlagOverridesAToyThreadsTheSystemCannotStart) {
  if (under_asan()) GTEST_SKIP() << "AddressSanitizer cannot run under an address-space limit";
  ProcResult r = run_toy({"demo", "--steps", "1"}, {.env = {"TOY_THREADS=1000"}, .address_space = uint64_t(2) << 30});
  EXPECT_EQ(r.status, 1);  // as asked, 1000 threads do not fit...
  const std::string dir = fresh_dir("threads_flag"), text = text_file(dir + "_data");
  ProcResult ok = run_toy(std::vector<std::string>{"train", "--data", text, "--out", dir, "--steps", "2"} + tiny_args(),
                          {.env = {"TOY_THREADS=1000"}, .address_space = uint64_t(2) << 30});
  EXPECT_EQ(ok.status, 0) << describe(ok);  // ...but --threads 1 (in tiny_args) asks for fewer
}

TEST(Hostile, FlagsThatContradictEachOtherAreUsageErrors) {
  EXPECT_EQ(run_toy({"train", "--resume", "x", "--force"}).status, 2);
  EXPECT_EQ(run_toy({"train", "--out", "x", "--allow-data-change"}).status, 2);
}

TEST(Hostile, TraceMayGoToACharacterDevice) {
  ProcResult r = run_toy({"demo", "--steps", "1"}, {.env = {"TOY_TRACE=/dev/null"}});
  EXPECT_EQ(r.status, 0) << r.err;
}

// ---- what users expect of a training run -----------------------------------------------------

TEST(Hostile, ResumeAcceptsTheOriginalFlagsAndRefusesOtherValues) {
  REQUIRE_GPL3();
  std::string text;
  const std::string dir = stopped_run("same_flags", &text);
  const std::vector<std::string> original =
      std::vector<std::string>{"train", "--data", text, "--out", dir} + tiny_args() + std::vector<std::string>{"--steps", "40"};
  ProcResult r = run_toy(original + std::vector<std::string>{"--resume", dir, "--stop-after", "8"});
  EXPECT_EQ(r.status, 0) << describe(r);
  ProcResult lr = run_toy(original + std::vector<std::string>{"--resume", dir, "--lr", "0.5"});
  EXPECT_EQ(lr.status, 1);
  EXPECT_TRUE(has(lr.err, "--lr") && has(lr.err, "0.001") && has(lr.err, "0.5")) << lr.err;
  ProcResult dim = run_toy({"train", "--resume", dir, "--dim", "64"});
  EXPECT_TRUE(has(dim.err, "--dim") && has(dim.err, "32") && has(dim.err, "64")) << dim.err;
}

TEST(Hostile, ModelGgufHoldsTheBestValidationWeights) {
  REQUIRE_GPL3();
  // A small text and a high learning rate: validation gets worse while training loss falls.
  const std::string data_dir = fresh_dir("best_data");
  fs::create_directories(data_dir);
  std::string text = read_all(kGpl3).substr(0, 6000);
  std::ofstream(data_dir + "/small.txt") << text;
  const std::string dir = fresh_dir("best");
  ProcResult r = run_toy({"train", "--data", data_dir + "/small.txt", "--out", dir, "--layers", "2", "--heads", "2",
                          "--dim", "64", "--ctx", "32", "--batch", "16", "--steps", "300", "--lr", "0.01",
                          "--min-lr", "0.01", "--warmup", "0", "--eval-every", "25", "--eval-batches", "4",
                          "--sample-tokens", "0", "--threads", "1", "--quiet", "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto j = last_json(r.out);
  EXPECT_EQ(j["model"], "best");
  ASSERT_LT(j["best_step"].get<int64_t>(), 300) << "validation kept improving: the test needs overfitting";
  double best = INFINITY;
  int64_t best_step = -1;
  for (const auto& e : events(dir))
    if (e["event"] == "eval" && e["val_loss"].get<double>() < best) best = e["val_loss"], best_step = e["step"];
  EXPECT_EQ(j["best_step"], best_step);
  // model.gguf is the best weights (as the checkpoint keeps them); last.gguf the final ones.
  GgufContents model = read_gguf(dir + "/model.gguf"), last = read_gguf(dir + "/last.gguf"),
               ckpt = read_gguf(dir + "/checkpoint.gguf");
  EXPECT_NE(model.tensor("token_embd.weight")->to_f32_vector(), last.tensor("token_embd.weight")->to_f32_vector());
  EXPECT_EQ(model.tensor("token_embd.weight")->to_f32_vector(), ckpt.tensor("best.token_embd.weight")->to_f32_vector());
  EXPECT_EQ(last.tensor("token_embd.weight")->to_f32_vector(), ckpt.tensor("token_embd.weight")->to_f32_vector());
  EXPECT_TRUE(has(read_all(dir + "/report.html"), "best validation")) << "the report must say which weights";
  // --keep last: the reverse, with best.gguf.
  const std::string dir2 = fresh_dir("keep_last");
  ProcResult r2 = run_toy({"train", "--data", data_dir + "/small.txt", "--out", dir2, "--layers", "2", "--heads", "2",
                           "--dim", "64", "--ctx", "32", "--batch", "16", "--steps", "300", "--lr", "0.01",
                           "--min-lr", "0.01", "--warmup", "0", "--eval-every", "25", "--eval-batches", "4",
                           "--sample-tokens", "0", "--threads", "1", "--quiet", "--json", "--keep", "last"});
  ASSERT_EQ(r2.status, 0);
  EXPECT_EQ(last_json(r2.out)["model"], "last");
  EXPECT_EQ(read_gguf(dir2 + "/model.gguf").tensor("token_embd.weight")->to_f32_vector(),
            last.tensor("token_embd.weight")->to_f32_vector());
  EXPECT_EQ(read_gguf(dir2 + "/best.gguf").tensor("token_embd.weight")->to_f32_vector(),
            model.tensor("token_embd.weight")->to_f32_vector());
  EXPECT_FALSE(fs::exists(dir2 + "/last.gguf"));
}

TEST(Hostile, VersionNamesTheCommitCompilerAndCpuFeatures) {
  ProcResult r = run_toy({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^toy [0-9]+\\.[0-9]+\\.[0-9]+\n")));
  EXPECT_TRUE(has(r.out, "commit: ") && has(r.out, "compiler: ") && has(r.out, "AVX2")) << r.out;
}

TEST(Hostile, AJsonNumberTooLargeForADoubleIsAnError) {
  // Found by fuzz_model_config: nlohmann throws out_of_range (not parse_error) for 1e400,
  // which escaped as an internal error.
  try {
    json_fields::parse_object("{\"lr\": 1e400}", "[train] checkpoint 'x' key toy.train.options");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "toy.train.options") && has(e.what(), "not valid JSON")) << e.what();
  }
}

// ---- model files from elsewhere (the inference issue) --------------------------------------

namespace {
// A valid random-weight qwen2 file (toy init), copied to `name` for editing.
std::string init_model(const std::string& name, const std::string& arch = "qwen2") {
  const std::string dir = fresh_dir("model_" + name);
  fs::create_directories(dir);
  const std::string path = dir + "/m.gguf";
  const ProcResult r = run_toy({"init", "--arch", arch, "--shape", "tiny", "--type", "q8_0", "--out", path});
  EXPECT_EQ(r.status, 0) << describe(r);
  return path;
}

// Runs `toy generate` on the file: a clean error (exit 1, "toy: ..." naming `expect`), never a
// crash or a hang.
void expect_clean_refusal(const std::string& path, const std::string& expect) {
  const ProcResult r = run_toy({"generate", "-m", path, "-p", "hi", "-n", "2", "--quiet"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_EQ(r.signal, 0) << describe(r);
  EXPECT_EQ(r.err.rfind("toy: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.err;
}
}  // namespace

TEST(HostileModel, TruncatedAtEverySectionIsACleanError) {
  const std::string path = init_model("truncated");
  const std::string bytes = read_all(path);
  gguf::Reader g(path);
  // Cut points: inside the header, the metadata (keys, the long token arrays), the tensor
  // table, between tensors' data and just before the end.
  std::vector<size_t> cuts = {0, 3, 4, 8, 16, 23, 40, 200, 5000, 30000, 60000};
  for (size_t i = 1; i < 12; ++i) cuts.push_back(bytes.size() * i / 12);
  cuts.push_back(bytes.size() - 1);
  const std::string cut_path = path + ".cut.gguf";
  for (size_t n : cuts) {
    SCOPED_TRACE(n);
    { std::ofstream(cut_path, std::ios::binary) << bytes.substr(0, n); }
    const ProcResult r = run_toy({"generate", "-m", cut_path, "-p", "hi", "-n", "2", "--quiet"});
    EXPECT_EQ(r.status, 1) << describe(r);
    EXPECT_EQ(r.signal, 0) << describe(r);
    EXPECT_EQ(r.err.rfind("toy: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("cut.gguf"), std::string::npos) << "the message names the file: " << r.err;
  }
}

TEST(HostileModel, WrongMagicAndAbsurdCounts) {
  const std::string path = init_model("magic");
  std::string bytes = read_all(path);
  bytes[0] = 'X';
  { std::ofstream(path, std::ios::binary) << bytes; }
  expect_clean_refusal(path, "not a GGUF file");
  bytes[0] = 'G';
  // The tensor count (u64 at byte 8) and the key count (u64 at byte 16) set absurdly high.
  for (size_t at : {size_t(8), size_t(16)}) {
    std::string b = bytes;
    const uint64_t huge = uint64_t(1) << 50;
    std::memcpy(b.data() + at, &huge, 8);
    { std::ofstream(path, std::ios::binary) << b; }
    expect_clean_refusal(path, "implausible counts");
  }
}

TEST(HostileModel, OverlappingTensorDataIsRefused) {
  const std::string path = init_model("overlap");
  std::string bytes = read_all(path);
  gguf::Reader g(path);
  // Point the second tensor's offset at the first tensor's data: find its entry in the table
  // (name, u32 dims, u64 ne[dims], i32 type, u64 offset).
  const gguf::TensorInfo& first = g.tensors()[0];
  const gguf::TensorInfo& second = g.tensors()[1];
  const size_t at = bytes.find(second.name + std::string(1, char(second.shape.ndim())));
  ASSERT_NE(at, std::string::npos);
  const size_t offset_at = at + second.name.size() + 4 + 8 * size_t(second.shape.ndim()) + 4;
  uint64_t was = 0;
  std::memcpy(&was, bytes.data() + offset_at, 8);
  ASSERT_EQ(was, second.offset);
  std::memcpy(bytes.data() + offset_at, &first.offset, 8);
  { std::ofstream(path, std::ios::binary) << bytes; }
  expect_clean_refusal(path, "overlap");
}

TEST(HostileModel, KeysOfTheWrongTypeShapesThatDisagreeAndUnknownArchitectures) {
  struct Case {
    std::string what, expect;
    std::function<void(GgufContents&)> edit;
  };
  const std::vector<Case> cases = {
      {"block_count as a string", "qwen2.block_count",
       [](GgufContents& c) { *c.find("qwen2.block_count") = gguf::Value::str("2"); }},
      {"rms epsilon as an integer", "layer_norm_rms_epsilon",
       [](GgufContents& c) { *c.find("qwen2.attention.layer_norm_rms_epsilon") = gguf::Value::u32(1); }},
      {"a width that disagrees with the tensors", "the config says",
       [](GgufContents& c) { *c.find("qwen2.feed_forward_length") = gguf::Value::u32(512); }},
      {"more layers than tensors", "missing tensor 'blk.2.",
       [](GgufContents& c) { *c.find("qwen2.block_count") = gguf::Value::u32(3); }},
      {"a missing tensor", "missing tensor 'blk.1.ffn_up.weight'",
       [](GgufContents& c) {
         c.tensors.erase(std::remove_if(c.tensors.begin(), c.tensors.end(),
                                        [](auto& t) { return t.first == "blk.1.ffn_up.weight"; }),
                         c.tensors.end());
       }},
      {"an unknown architecture", "architecture 'mamba' is not supported",
       [](GgufContents& c) { *c.find("general.architecture") = gguf::Value::str("mamba"); }},
      {"heads that do not divide", "head",
       [](GgufContents& c) { *c.find("qwen2.attention.head_count_kv") = gguf::Value::u32(3); }},
      {"a chat template of the wrong type", "",  // generate does not read it; chat does (below)
       [](GgufContents& c) { *c.find("tokenizer.chat_template") = gguf::Value::u32(7); }},
      {"a RoPE scaling toy does not know", "RoPE scaling 'llama3'",
       [](GgufContents& c) { c.kv.emplace_back("qwen2.rope.scaling.type", gguf::Value::str("llama3")); }},
      {"a token id out of range", "tokenizer.ggml.eos_token_id",
       [](GgufContents& c) { *c.find("tokenizer.ggml.eos_token_id") = gguf::Value::u32(5000); }},
      {"RoPE sections that are garbage", "rope.dimension_sections' is [1000000, -7]",
       [](GgufContents& c) { c.kv.emplace_back("qwen2.rope.dimension_sections", gguf::Value::i32_array({1000000, -7})); }},
      {"RoPE sections as strings", "rope.dimension_sections' must be an array of integers",
       [](GgufContents& c) { c.kv.emplace_back("qwen2.rope.dimension_sections", gguf::Value::str_array({"a"})); }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const std::string path = init_model("keys");
    edit_gguf(path, k.edit);
    if (k.expect.empty()) {
      const ProcResult r = run_toy({"chat", "-m", path, "-p", "hi", "-n", "1"});
      EXPECT_EQ(r.status, 1) << describe(r);
      EXPECT_NE(r.err.find("tokenizer.chat_template has type"), std::string::npos) << r.err;
      continue;
    }
    expect_clean_refusal(path, k.expect);
  }
}

// LFM2's per-layer kv head counts (0: a short-conv layer) and its conv taps, damaged: each a
// clean error naming the key, never a model of the wrong shape.
TEST(HostileModel, Lfm2LayerKeysThatMakeNoSenseAreRefused) {
  struct Case {
    std::string what, expect;
    std::function<void(GgufContents&)> edit;
  };
  const std::vector<Case> cases = {
      {"a count per layer too few", "has 3 entries for 4 layers",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::i32_array({0, 2, 0}); }},
      {"attention layers with different counts", "different kv head counts",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::i32_array({0, 2, 0, 1}); }},
      {"a negative count", "-2 kv heads for layer 1",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::i32_array({0, -2, 0, 2}); }},
      {"one number instead of a list", "one count per layer",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::u32(2); }},
      {"no attention layer at all", "gives no layer any kv heads",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::i32_array({0, 0, 0, 0}); }},
      {"no short-conv layer", "no short-conv layer",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::i32_array({2, 2, 2, 2}); }},
      {"counts as strings", "must be an integer or an array of integers",
       [](GgufContents& c) { *c.find("lfm2.attention.head_count_kv") = gguf::Value::str_array({"0", "2", "0", "2"}); }},
      {"no conv taps", "missing key 'lfm2.shortconv.l_cache'",
       [](GgufContents& c) {
         c.kv.erase(std::remove_if(c.kv.begin(), c.kv.end(), [](auto& kv) { return kv.first == "lfm2.shortconv.l_cache"; }),
                    c.kv.end());
       }},
      {"taps that disagree with the tensors", "shortconv.conv.weight' has shape",
       [](GgufContents& c) { *c.find("lfm2.shortconv.l_cache") = gguf::Value::u32(4); }},
      {"a single tap", "shortconv.l_cache 1 must be in 2..64",
       [](GgufContents& c) { *c.find("lfm2.shortconv.l_cache") = gguf::Value::u32(1); }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const std::string path = init_model("lfm2_keys", "lfm2");
    edit_gguf(path, k.edit);
    expect_clean_refusal(path, k.expect);
  }
}
