// Data-parallel training under mpirun (dist/data_parallel.h): N processes must give the
// weights, optimizer state, losses and gradient norms of one process running the same
// micro-batches, bit for bit; resume with any N; refuse what cannot work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "requirements.h"
#include "toy/dist/comm.h"
#include "toy/io/gguf.h"

namespace fs = std::filesystem;
using toy::test::describe;
using toy::test::ProcOptions;
using toy::test::ProcResult;
using toy::test::run_program;
using toy::test::run_toy;

namespace {

std::string temp(const std::string& name) {
  return (fs::path(::testing::TempDir()) / ("toy_dp_" + std::to_string(getpid()) + "_" + name)).string();
}

// OpenMPI in a container, as root, maybe on fewer cores than ranks.
ProcOptions mpi_env() {
  ProcOptions o;
  o.env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
           "OMPI_MCA_btl_vader_single_copy_mechanism=none", "OMPI_MCA_rmaps_base_oversubscribe=1"};
  o.timeout_s = 300;
  return o;
}

bool have_mpirun() { return std::string(TOY_MPIRUN).size() > 0 && fs::exists(TOY_MPIRUN); }

#define REQUIRE_MPI()                                                                                  \
  do {                                                                                                 \
    TOY_REQUIRE(toy::dist::built_with_mpi(), "toy built with MPI (apt-get install libopenmpi-dev)");   \
    TOY_REQUIRE(have_mpirun(), "mpirun (apt-get install openmpi-bin)");                                \
  } while (0)

ProcResult mpirun(int n, std::vector<std::string> args) {
  std::vector<std::string> a = {"-np", std::to_string(n), "--oversubscribe", TOY_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  return run_program(TOY_MPIRUN, a, mpi_env());
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Every tensor of two GGUF files, byte for byte (the metadata may differ: the options name
// the processes and micro-batches each run had).
void expect_same_tensors(const std::string& a, const std::string& b) {
  toy::gguf::Reader ra(a), rb(b);
  ASSERT_EQ(ra.tensors().size(), rb.tensors().size()) << a << " vs " << b;
  for (const toy::gguf::TensorInfo& t : ra.tensors()) {
    const toy::gguf::TensorInfo* u = rb.find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name << " missing from " << b;
    ASSERT_EQ(t.bytes, u->bytes) << t.name;
    EXPECT_EQ(std::memcmp(ra.tensor(t.name).raw_data(), rb.tensor(t.name).raw_data(), t.bytes), 0)
        << t.name << " differs between " << a << " and " << b;
  }
}

std::vector<nlohmann::json> events(const std::string& dir, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream f(dir + "/events.jsonl");
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["event"] == kind) out.push_back(j);
  }
  return out;
}

// Every step's loss and gradient norm (and the evaluations' losses) are the same numbers.
void expect_same_steps(const std::string& a, const std::string& b) {
  const auto sa = events(a, "step"), sb = events(b, "step");
  ASSERT_EQ(sa.size(), sb.size());
  ASSERT_FALSE(sa.empty());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i]["loss"].get<double>(), sb[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(sa[i]["grad_norm"].get<double>(), sb[i]["grad_norm"].get<double>()) << "step " << i + 1;
  }
  const auto ea = events(a, "eval"), eb = events(b, "eval");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_EQ(ea[i]["val_loss"], eb[i]["val_loss"]) << "evaluation " << i + 1;
}

// A small toy train run: 2 layers, one thread per process (the one process compared with
// uses one thread too: a kernel's sums may be split by thread).
// (`more` replaces a default flag it names.)
std::vector<std::string> train_args(const std::string& out, const std::vector<std::string>& more = {}) {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"--steps", "6"}, {"--batch", "4"}, {"--threads", "1"}, {"--layers", "2"}, {"--dim", "64"},
      {"--heads", "4"}, {"--ctx", "32"}, {"--eval-every", "3"}, {"--eval-batches", "3"}, {"--sample-tokens", "0"},
      {"--save-minutes", "0"}};
  std::vector<std::string> a = {"train", "--out", out, "--quiet"};
  for (const auto& [flag, value] : defaults)
    if (std::find(more.begin(), more.end(), flag) == more.end()) a.insert(a.end(), {flag, value});
  return with(a, more);
}

void expect_train_runs_equal(const std::string& one, const std::string& many) {
  expect_same_tensors(one + "/model.gguf", many + "/model.gguf");
  expect_same_tensors(one + "/checkpoint.gguf", many + "/checkpoint.gguf");
  expect_same_steps(one, many);
}

// One process with `one` added to its arguments, then `n` processes with `many`, into folders
// named after `name`: both must succeed and write the same run. Returns the N-process folder.
std::string expect_n_processes_equal_one(const std::string& name, int n, const std::vector<std::string>& one,
                                         const std::vector<std::string>& many) {
  const std::string a_dir = temp(name + "_one"), b_dir = temp(name + "_" + std::to_string(n));
  fs::remove_all(a_dir), fs::remove_all(b_dir);
  ProcResult a = run_toy(train_args(a_dir, one));
  EXPECT_EQ(a.status, 0) << describe(a);
  ProcResult b = mpirun(n, train_args(b_dir, many));
  EXPECT_EQ(b.status, 0) << describe(b);
  if (a.status == 0 && b.status == 0) expect_train_runs_equal(a_dir, b_dir);
  return b_dir;
}

}  // namespace

TEST(DataParallel, TwoProcessesTrainAsOneProcessAccumulatingTwoMicroBatches) {
  REQUIRE_MPI();
  const std::string two = expect_n_processes_equal_one("plain", 2, {"--accum", "2"}, {"--accum", "1"});
  const nlohmann::json start = events(two, "run_start").at(0);
  EXPECT_EQ(start["world_size"], 2);
  EXPECT_EQ(start["zero"], 1);
  ASSERT_EQ(start["shards"].size(), 2u);
  for (const nlohmann::json& s : events(two, "step")) {
    EXPECT_TRUE(s.contains("comm_s") && s.contains("exposed_comm_s")) << s.dump();
    EXPECT_GE(s["comm_s"].get<double>(), s["exposed_comm_s"].get<double>() - 1e-9);
  }
}

// As the issue states it: no --threads anywhere (one process takes both cores, each of the
// two processes one).
TEST(DataParallel, DefaultThreadCountsGiveTheSameRun) {
  REQUIRE_MPI();
  const std::string one = temp("one_dflt"), two = temp("two_dflt");
  fs::remove_all(one), fs::remove_all(two);
  auto args = [](const std::string& out, const char* accum) {
    return std::vector<std::string>{"train", "--out", out, "--batch", "4", "--accum", accum, "--steps", "4",
                                    "--layers", "2", "--dim", "96", "--heads", "4", "--ctx", "128", "--eval-every", "2",
                                    "--eval-batches", "2", "--sample-tokens", "0", "--quiet"};
  };
  ProcResult a = run_toy(args(one, "2"));
  ASSERT_EQ(a.status, 0) << describe(a);
  ProcResult b = mpirun(2, args(two, "1"));
  ASSERT_EQ(b.status, 0) << describe(b);
  expect_train_runs_equal(one, two);
}

TEST(DataParallel, ZeroOneHalvesEachRanksOptimizerState) {
  REQUIRE_MPI();
  const std::string dir = temp("zero1");
  fs::remove_all(dir);
  ProcResult r = mpirun(2, train_args(dir, {"--steps", "1", "--eval-every", "0"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  const nlohmann::json start = events(dir, "run_start").at(0);
  const double whole = 8.0 * start["params"].get<double>();  // m and v of every parameter (all train here)
  int64_t elements = 0;
  for (const nlohmann::json& s : start["shards"]) {
    EXPECT_LE(s["optimizer_bytes"].get<double>(), 0.55 * whole) << s.dump();
    elements += s["elements"].get<int64_t>();
  }
  EXPECT_EQ(elements, start["params"].get<int64_t>());
}

// A 4.8M-parameter model: its shards (2.4M elements) are cut into buckets of at most an
// eighth (not two 8 MB buckets, the first layers' sent only after backward).
TEST(DataParallel, ASmallModelHasBucketsOfAnEighthOfAShard) {
  REQUIRE_MPI();
  const std::string dir = temp("buckets");
  fs::remove_all(dir);
  ProcResult r = mpirun(2, train_args(dir, {"--steps", "1", "--eval-every", "0", "--layers", "6", "--dim", "256",
                                            "--ctx", "16", "--batch", "1"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  const nlohmann::json start = events(dir, "run_start").at(0);
  EXPECT_EQ(start["dp"]["bucket_mb"], 8.0);
  EXPECT_GE(start["dp"]["buckets"].get<int>(), 16) << start["dp"].dump();
}

TEST(DataParallel, WholeMomentsAndDropoutStayBitIdentical) {
  REQUIRE_MPI();
  const std::string two = expect_n_processes_equal_one("z0", 2, {"--accum", "2", "--dropout", "0.1"},
                                                       {"--accum", "1", "--dropout", "0.1", "--zero", "0"});
  EXPECT_EQ(events(two, "run_start").at(0)["zero"], 0);
}

TEST(DataParallel, FourProcessesOnTwoCoresEqualFourMicroBatchesOfAnUntiedLlama) {
  REQUIRE_MPI();
  const std::vector<std::string> shape = {"--preset", "llama", "--tied", "0", "--dp-bucket-mb", "0.01"};
  const std::string four =
      expect_n_processes_equal_one("llama", 4, with(shape, {"--accum", "4"}), with(shape, {"--accum", "1"}));
  EXPECT_GT(events(four, "run_start").at(0)["dp"]["buckets"].get<int>(), 4);  // small buckets: many in flight
}

TEST(DataParallel, TiedGpt2ShapeWithTwoMicroBatchesPerProcess) {
  REQUIRE_MPI();
  const std::vector<std::string> shape = {"--preset", "gpt", "--tied", "1", "--dp-overlap", "off"};
  expect_n_processes_equal_one("tied", 2, with(shape, {"--accum", "4"}), with(shape, {"--accum", "2"}));
}

TEST(DataParallel, ACheckpointResumesWithAnyNumberOfProcesses) {
  REQUIRE_MPI();
  const std::string whole = temp("whole"), split = temp("split"), back = temp("back");
  for (const auto& d : {whole, split, back}) fs::remove_all(d);
  ProcResult r = mpirun(2, train_args(whole, {"--accum", "1"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  // Two processes stop at step 3; one process (accum 2 from the checkpoint) finishes.
  r = mpirun(2, train_args(split, {"--accum", "1", "--stop-after", "3"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  r = run_toy({"train", "--resume", split, "--threads", "1", "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  expect_train_runs_equal(whole, split);
  // One process stops; two processes (accum 1 each) finish.
  r = run_toy(train_args(back, {"--accum", "2", "--stop-after", "2"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  r = mpirun(2, {"train", "--resume", back, "--threads", "1", "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  expect_train_runs_equal(whole, back);
  // Four processes cannot share two micro-batches.
  const std::string odd = temp("odd");
  fs::remove_all(odd);
  ASSERT_EQ(run_toy(train_args(odd, {"--accum", "2", "--stop-after", "1"})).status, 0);
  r = mpirun(4, {"train", "--resume", odd, "--threads", "1", "--quiet"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("cannot share them evenly"), std::string::npos) << describe(r);
}

// Check 2 of the issue: two processes with --batch 4 against one with --batch 8 (one big
// micro-batch holding the same windows). Not bit for bit (the sums are cut differently), but
// step 1 agrees to 1e-6 relative and 40 steps later every weight to 1e-5 of its tensor's
// largest; the numbers measured are printed.
TEST(DataParallel, TwoProcessesOfFourEqualOneBigMicroBatchOfEight) {
  REQUIRE_MPI();
  const std::string one = temp("big8"), two = temp("two4");
  fs::remove_all(one), fs::remove_all(two);
  const std::vector<std::string> common = {"--steps", "40", "--eval-every", "20", "--preset", "llama"};
  ProcResult a = run_toy(train_args(one, with(common, {"--batch", "8"})));
  ASSERT_EQ(a.status, 0) << describe(a);
  ProcResult b = mpirun(2, train_args(two, with(common, {"--batch", "4"})));
  ASSERT_EQ(b.status, 0) << describe(b);
  const auto sa = events(one, "step"), sb = events(two, "step");
  ASSERT_EQ(sa.size(), 40u);
  ASSERT_EQ(sb.size(), 40u);
  for (const char* k : {"loss", "grad_norm"}) {
    const double x = sa[0][k].get<double>(), y = sb[0][k].get<double>();
    EXPECT_LE(std::abs(x - y), 1e-6 * std::abs(x)) << "step 1 " << k << ": " << x << " vs " << y;
    std::printf("step 1 %s: relative difference %.3g\n", k, std::abs(x - y) / std::abs(x));
  }
  toy::gguf::Reader ra(one + "/model.gguf"), rb(two + "/model.gguf");
  double worst = 0;
  for (const toy::gguf::TensorInfo& t : ra.tensors()) {
    const std::vector<float> x = ra.tensor(t.name).to_f32_vector(), y = rb.tensor(t.name).to_f32_vector();
    ASSERT_EQ(x.size(), y.size()) << t.name;
    double peak = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) peak = std::max(peak, double(std::abs(x[i]))), diff = std::max(diff, double(std::abs(x[i] - y[i])));
    EXPECT_LE(diff, 1e-5 * peak) << t.name;
    worst = std::max(worst, diff / peak);
  }
  std::printf("after 40 steps: largest |difference| / max |w| over the tensors %.3g\n", worst);
}

TEST(DataParallel, RanksStartedWithDifferentOptionsAreRefusedBeforeTheFirstStep) {
  REQUIRE_MPI();
  const std::string dir = temp("disagree");
  fs::remove_all(dir);
  std::vector<std::string> a = {"-np", "1", TOY_BINARY};
  for (const std::string& s : train_args(dir, {"--lr", "1e-3"})) a.push_back(s);
  a.push_back(":");
  a.insert(a.end(), {"-np", "1", TOY_BINARY});
  for (const std::string& s : train_args(dir, {"--lr", "2e-3"})) a.push_back(s);
  ProcResult r = run_program(TOY_MPIRUN, a, mpi_env());
  EXPECT_NE(r.status, 0) << describe(r);
  EXPECT_NE(r.err.find("rank 1 was started with options.lr"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(dir + "/checkpoint.gguf"));
  EXPECT_FALSE(fs::exists(dir + "/events.jsonl"));
}

TEST(DataParallel, CommandsThatRunAsOneProcessRefuseMpirun) {
  REQUIRE_MPI();
  ProcResult r = mpirun(2, {"generate", "-m", "nothing.gguf", "-p", "x"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("toy generate runs as one process"), std::string::npos) << describe(r);
}

TEST(DataParallel, LoraFinetuneOnTwoProcessesIsTheOneProcessRun) {
  REQUIRE_MPI();
  const std::string base = temp("base.gguf"), data = temp("sft.jsonl");
  ASSERT_EQ(run_toy({"init", "--arch", "llama", "--shape", "tiny", "--out", base}).status, 0);
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i)
      f << nlohmann::json({{"prompt", "count " + std::to_string(i)}, {"completion", " " + std::to_string(i + 1)}}).dump()
        << "\n";
  }
  const std::string one = temp("ft_one"), two = temp("ft_two");
  fs::remove_all(one), fs::remove_all(two);
  auto args = [&](const std::string& out, const std::string& accum) {
    return std::vector<std::string>{"finetune", "-m", base, "--data", data, "--method", "lora", "--steps", "5",
                                    "--batch", "2", "--accum", accum, "--lora-rank", "2", "--lr", "1e-2",
                                    "--lora-dropout", "0.1", "--threads", "1", "--eval-every", "2", "--quiet",
                                    "--out", out};
  };
  ProcResult a = run_toy(args(one, "2"));
  ASSERT_EQ(a.status, 0) << describe(a);
  ProcResult b = mpirun(2, args(two, "1"));
  ASSERT_EQ(b.status, 0) << describe(b);
  expect_same_tensors(one + "/adapter.gguf", two + "/adapter.gguf");
  expect_same_tensors(one + "/checkpoint.gguf", two + "/checkpoint.gguf");
  expect_same_steps(one, two);
}

TEST(DataParallel, VisionTrainOnTwoProcessesIsTheOneProcessRun) {
  REQUIRE_MPI();
  const std::string digits = toy::test::shared_path("digits.csv.gz");
  TOY_REQUIRE_FILE(digits);
  const std::string one = temp("v_one"), two = temp("v_two");
  fs::remove_all(one), fs::remove_all(two);
  auto args = [&](const std::string& out, const std::string& accum) {
    return std::vector<std::string>{"vision", "train", "--data", digits, "--preset", "vit-digits", "--epochs", "1",
                                    "--batch", "16", "--accum", accum, "--threads", "1", "--quiet", "--out", out};
  };
  ProcResult a = run_toy(args(one, "2"));
  ASSERT_EQ(a.status, 0) << describe(a);
  ProcResult b = mpirun(2, args(two, "1"));
  ASSERT_EQ(b.status, 0) << describe(b);
  expect_same_tensors(one + "/model.gguf", two + "/model.gguf");
  expect_same_tensors(one + "/checkpoint.gguf", two + "/checkpoint.gguf");
  const auto ea = events(one, "epoch"), eb = events(two, "epoch");
  ASSERT_EQ(ea.size(), 1u);
  ASSERT_EQ(eb.size(), 1u);
  for (const char* k : {"train_accuracy", "train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss"})
    EXPECT_EQ(ea[0][k], eb[0][k]) << k;
}


TEST(DataParallel, BenchTrainPrintsOneObjectForTheRun) {
  REQUIRE_MPI();
  ProcResult r = mpirun(2, {"bench", "train", "--preset", "cpu-small", "--threads", "1", "--json", "--steps", "2",
                            "--warmup", "1", "--reps", "1"});
  ASSERT_EQ(r.status, 0) << describe(r);
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 1u) << r.out;  // rank 0's alone
  const nlohmann::json& j = lines[0];
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["rank_batch"], 6);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["comm_s"].get<double>(), 0);
  EXPECT_GE(j["comm_s"].get<double>(), j["exposed_comm_s"].get<double>());
  EXPECT_GE(j["overlap_fraction"].get<double>(), 0);
  EXPECT_LE(j["overlap_fraction"].get<double>(), 1);
}

namespace {

// The pid of rank `rank` of a run whose command line names `marker` (from /proc).
pid_t rank_pid(const std::string& marker, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = toy::test::read_all(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(marker) == std::string::npos || cmd.find("mpirun") != std::string::npos) continue;
    std::string env = toy::test::read_all(e.path().string() + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (env.find("\nOMPI_COMM_WORLD_RANK=" + std::to_string(rank) + "\n") != std::string::npos) return pid_t(std::stoi(name));
  }
  return -1;
}

struct Interrupted {
  ProcResult r;
  double seconds_after_signal = 0;
  size_t steps_before = 0;
};

// Starts `mpirun -np 2 toy ARGS`, waits for `steps` step events, sends `sig` to rank
// `rank`, and waits for the whole job (up to 120 s).
Interrupted signal_rank_after(const std::vector<std::string>& args, const std::string& dir, size_t steps, int rank,
                              int sig) {
  std::vector<std::string> a = {"-np", "2", "--oversubscribe", TOY_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  const std::string base = temp("signal_" + std::to_string(sig));
  Interrupted out;
  const pid_t pid = toy::test::spawn_program(TOY_MPIRUN, a, mpi_env(), base + ".out", base + ".err");
  for (int i = 0; i < 2400 && out.steps_before < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    out.steps_before = toy::test::step_events(dir + "/events.jsonl");
  }
  const pid_t victim = rank_pid(dir, rank);
  EXPECT_GT(victim, 0) << "rank " << rank << " not found";
  if (victim > 0) kill(victim, sig);
  const auto t0 = std::chrono::steady_clock::now();
  toy::test::wait_toy(pid, 120, out.r);
  out.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sig == SIGSTOP && victim > 0) kill(victim, SIGKILL);
  out.r.out = toy::test::take_file(base + ".out");
  out.r.err = toy::test::take_file(base + ".err");
  return out;
}

// A run long enough to be interrupted (checkpoints every 5 steps).
std::vector<std::string> long_args(const std::string& out, const std::vector<std::string>& more = {}) {
  std::vector<std::string> a = {"--dim", "128", "--ctx", "64", "--save-every", "5", "--eval-every", "0"};
  if (std::find(more.begin(), more.end(), "--steps") == more.end()) a.insert(a.end(), {"--steps", "400"});
  return train_args(out, with(a, more));
}

}  // namespace

TEST(DataParallel, SigtermToOneRankStopsEveryRankAtOneStepWithACheckpoint) {
  REQUIRE_MPI();
  const std::string dir = temp("sigterm"), whole = temp("sigterm_whole");
  fs::remove_all(dir), fs::remove_all(whole);
  Interrupted s = signal_rank_after(long_args(dir, {"--accum", "1"}), dir, 3, 1, SIGTERM);
  ASSERT_EQ(s.r.status, 0) << describe(s.r);
  const auto ends = events(dir, "run_end");
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_TRUE(ends[0]["stopped"].get<bool>());
  const int64_t stopped_at = ends[0]["steps"].get<int64_t>();
  ASSERT_LT(stopped_at, 400);
  const auto cks = events(dir, "checkpoint");
  ASSERT_FALSE(cks.empty());
  EXPECT_EQ(cks.back()["reason"], "stop");
  EXPECT_EQ(cks.back()["step"], stopped_at);
  // One process finishes what two started; it equals one process from the start.
  ProcResult r = run_toy({"train", "--resume", dir, "--threads", "1", "--steps", std::to_string(stopped_at + 3),
                          "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  r = run_toy(long_args(whole, {"--accum", "2", "--steps", std::to_string(stopped_at + 3)}));
  ASSERT_EQ(r.status, 0) << describe(r);
  expect_same_tensors(whole + "/model.gguf", dir + "/model.gguf");
  expect_same_tensors(whole + "/checkpoint.gguf", dir + "/checkpoint.gguf");
}

TEST(DataParallel, AKilledRankEndsTheRunNamingItAndTheLastCheckpointResumes) {
  REQUIRE_MPI();
  const std::string dir = temp("kill9"), whole = temp("kill9_whole");
  fs::remove_all(dir), fs::remove_all(whole);
  Interrupted s = signal_rank_after(long_args(dir, {"--accum", "1"}), dir, 7, 1, SIGKILL);
  EXPECT_NE(s.r.status, 0) << describe(s.r);
  EXPECT_FALSE(s.r.timed_out);
  EXPECT_LT(s.seconds_after_signal, 30) << describe(s.r);
  EXPECT_NE(s.r.err.find("rank 1"), std::string::npos) << describe(s.r);
  ASSERT_TRUE(fs::exists(dir + "/checkpoint.gguf"));
  ProcResult r = run_toy({"train", "--resume", dir, "--threads", "1", "--steps", "12", "--quiet"});
  ASSERT_EQ(r.status, 0) << describe(r);
  r = run_toy(long_args(whole, {"--accum", "2", "--steps", "12"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  expect_same_tensors(whole + "/model.gguf", dir + "/model.gguf");
}

TEST(DataParallel, ARankThatStopsAnsweringEndsTheRunAfterTheTimeout) {
  REQUIRE_MPI();
  const std::string dir = temp("stopped");
  fs::remove_all(dir);
  Interrupted s = signal_rank_after(long_args(dir, {"--accum", "1", "--dp-timeout", "3"}), dir, 7, 1, SIGSTOP);
  EXPECT_NE(s.r.status, 0) << describe(s.r);
  EXPECT_FALSE(s.r.timed_out);
  EXPECT_LT(s.seconds_after_signal, 25) << describe(s.r);
  EXPECT_NE(s.r.err.find("no answer from rank 1"), std::string::npos) << describe(s.r);
  EXPECT_NE(s.r.err.find("--resume"), std::string::npos) << describe(s.r);
}

// A failure after a step (here the periodic save's write: checkpoint.gguf.tmp is a folder, as
// a full disk would fail it; a rank that stops answering while the save gathers its values
// is the same path) ends the run naming the checkpoint kept and how to continue. (CI saw the
// stopped-rank test above fail once when the timeout fell in the save, not in a step.)
TEST(DataParallel, AFailedPeriodicSaveNamesTheCheckpointKeptAndHowToContinue) {
  REQUIRE_MPI();
  const std::string dir = temp("failed_save");
  fs::remove_all(dir);
  ProcResult r = mpirun(2, train_args(dir, {"--accum", "1", "--stop-after", "2", "--save-every", "2"}));
  ASSERT_EQ(r.status, 0) << describe(r);
  fs::create_directory(dir + "/checkpoint.gguf.tmp");
  r = mpirun(2, {"train", "--resume", dir, "--threads", "1", "--quiet"});
  EXPECT_NE(r.status, 0) << describe(r);
  EXPECT_NE(r.err.find("checkpoint.gguf.tmp"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("(after step 4); the checkpoint of step 2 and the model files are kept"), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("continue with mpirun -np 2 toy train --resume " + dir), std::string::npos) << describe(r);
  const auto errors = events(dir, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["step"], 4);
  fs::remove(dir + "/checkpoint.gguf.tmp");
  r = mpirun(2, {"train", "--resume", dir, "--threads", "1", "--quiet"});
  EXPECT_EQ(r.status, 0) << describe(r);
}

namespace {

const std::string kHosts = std::string(TOY_SOURCE_DIR) + "/scripts/netns-hosts.sh";

// Brings up the two namespace "hosts" (scripts/netns-hosts.sh); false, with the reason, when
// this machine does not allow it (no CAP_NET_ADMIN).
bool hosts_up(std::string& why) {
  ProcOptions o;
  o.timeout_s = 60;
  ProcResult r = run_program("/bin/bash", {kHosts, "up"}, o);
  why = r.err;
  return r.status == 0;
}

ProcResult on_two_hosts(const std::vector<std::string>& args, double timeout_s = 300) {
  std::vector<std::string> a = {kHosts, "mpirun", TOY_BINARY};
  a.insert(a.end(), args.begin(), args.end());
  ProcOptions o = mpi_env();
  o.timeout_s = timeout_s;
  return run_program("/bin/bash", a, o);
}

}  // namespace

TEST(DataParallelTwoHosts, TwoNetworkNamespacesOverTcpEqualOneProcess) {
  REQUIRE_MPI();
  std::string why;
  if (!hosts_up(why)) GTEST_SKIP() << "skipped: cannot make network namespaces here (CAP_NET_ADMIN): " << why;
  const std::string one = temp("h_one"), two = temp("h_two");
  fs::remove_all(one), fs::remove_all(two);
  ProcResult a = run_toy(train_args(one, {"--accum", "2"}));
  ASSERT_EQ(a.status, 0) << describe(a);
  ProcResult b = on_two_hosts(train_args(two, {"--accum", "1"}));
  ASSERT_EQ(b.status, 0) << describe(b);
  expect_train_runs_equal(one, two);
}

// A slow link (20 Mbit/s): the updated values arrive while the next forward pass runs, and
// every kernel that reads a parameter waits for its piece (the kernel gate), so the run is
// still the one process's bit for bit, with overlap on and off and small buckets.
TEST(DataParallelTwoHosts, ASlowLinkStillGivesTheOneProcessRun) {
  REQUIRE_MPI();
  std::string why;
  if (!hosts_up(why)) GTEST_SKIP() << "skipped: cannot make network namespaces here (CAP_NET_ADMIN): " << why;
  ASSERT_EQ(run_program("/bin/bash", {kHosts, "rate", "20mbit"}).status, 0);
  struct LiftRate {
    ~LiftRate() { run_program("/bin/bash", {kHosts, "rate", "off"}); }
  } lift;
  const std::string one = temp("slow_one");
  fs::remove_all(one);
  ProcResult a = run_toy(train_args(one, {"--accum", "2"}));
  ASSERT_EQ(a.status, 0) << describe(a);
  for (const char* overlap : {"on", "off"}) {
    const std::string two = temp(std::string("slow_two_") + overlap);
    fs::remove_all(two);
    ProcResult b = on_two_hosts(train_args(two, {"--accum", "1", "--dp-overlap", overlap, "--dp-bucket-mb", "0.05"}));
    EXPECT_EQ(b.status, 0) << describe(b);
    if (b.status == 0) expect_train_runs_equal(one, two);
  }
}

TEST(DataParallelTwoHosts, ANetworkThatGoesAwayEndsBothSidesAfterTheTimeout) {
  REQUIRE_MPI();
  std::string why;
  if (!hosts_up(why)) GTEST_SKIP() << "skipped: cannot make network namespaces here (CAP_NET_ADMIN): " << why;
  const std::string dir = temp("h_down");
  fs::remove_all(dir);
  std::vector<std::string> a = {kHosts, "mpirun", TOY_BINARY};
  for (const std::string& s : long_args(dir, {"--accum", "1", "--dp-timeout", "10"})) a.push_back(s);
  const std::string base = temp("h_down_proc");
  const pid_t pid = toy::test::spawn_program("/bin/bash", a, mpi_env(), base + ".out", base + ".err");
  size_t steps = 0;
  for (int i = 0; i < 2400 && steps < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    steps = toy::test::step_events(dir + "/events.jsonl");
  }
  ASSERT_GE(steps, 3u);
  ASSERT_EQ(run_program("/bin/bash", {kHosts, "link", "down"}).status, 0);
  const auto t0 = std::chrono::steady_clock::now();
  ProcResult r;
  toy::test::wait_toy(pid, 60, r);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run_program("/bin/bash", {kHosts, "link", "up"});
  r.err = toy::test::take_file(base + ".err");
  std::remove((base + ".out").c_str());
  EXPECT_NE(r.status, 0) << describe(r);
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_LT(took, 25) << describe(r);
  // toy's timeout ("no answer from rank 1") or, first, the launcher's own probe of its daemons
  // (netns-hosts.sh sets it to about 8 s) names the lost host.
  EXPECT_TRUE(r.err.find("no answer from rank") != std::string::npos ||
              r.err.find("lost communication with a remote daemon") != std::string::npos)
      << describe(r);
  // No process of the run is left on either "host".
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(rank_pid(dir, 0), -1);
  EXPECT_EQ(rank_pid(dir, 1), -1);
}
