// `toy bench finetune`: fine-tuning speed and peak memory per mode, against a PyTorch LoRA
// peer (bench/peers/finetune_lora_peer.py) run in the same invocation.
//   full_f32, full_bf16        --method full, F32 base, --precision f32 / bf16
//   lora_f32_base              --method lora on the F32 base
//   lora_q8_0_base             --method lora on a Q8_0 copy
//   qlora_q4_k_base            --method lora on a Q4_K copy (llama.cpp's per-row fallbacks)
//   peer_lora                  PyTorch, LoRA on the seven projections, checkpoint per block
// Every mode fine-tunes a random-weight model of a published shape (toy init; default
// SmolLM2-135M) on plain text (windows of --ctx + 1 tokens, every token counted, as the peer
// counts them), with --recompute and the chunked loss, in its own process, so its peak
// resident memory (getrusage of that child) is its own. Tokens per second count every step,
// the first included, on both sides. One JSON object per line with --json: {"mode",
// "tokens_per_s", "peak_rss_mb", ...}; the last line compares LoRA on the F32 base with the
// peer and LoRA on Q8_0 with full F32 in memory.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/error.h"
#include "toy/core/runtime.h"
#include "toy/models/shapes.h"
#include "toy/obs/events.h"

namespace toy::cli {

namespace {

struct FinetuneBenchOptions {
  std::string arch = "llama", shape = "smollm2-135m";
  int64_t ctx = 512, batch = 4, steps = 2, rank = 8;
  int threads = 0;
  bool json = false, no_peer = false;
  std::string python = "/usr/bin/python3";
  std::string data = "/usr/share/common-licenses/GPL-3";
  Device device = Device::CPU;  // where toy's fine-tunes run (--device)
};

struct Child {
  int status = -1;
  double peak_rss_mb = 0;
  std::string out;
};

// Runs argv[0] with argv, stdout and stderr to a file; its exit status and peak RSS.
Child run_child(const std::vector<std::string>& argv, const std::string& log) {
  Child c;
  std::fflush(stdout);  // else the child inherits (and prints) what is still buffered
  std::fflush(stderr);
  const pid_t pid = fork();
  TOY_CHECK(pid >= 0, "[bench] cannot start {}", argv[0]);
  if (pid == 0) {
    std::FILE* f = std::freopen(log.c_str(), "w", stdout);
    if (f) dup2(fileno(stdout), 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int st = 0;
  rusage ru{};
  wait4(pid, &st, 0, &ru);
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  c.peak_rss_mb = double(ru.ru_maxrss) / 1024.0;
  std::ifstream in(log);
  c.out.assign(std::istreambuf_iterator<char>(in), {});
  return c;
}

// The last line of text that parses as a JSON object.
std::optional<nlohmann::json> last_json(const std::string& text) {
  std::optional<nlohmann::json> found;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] != '{') continue;
    try {
      found = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
    }
  }
  return found;
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

int run_finetune_bench(const FinetuneBenchOptions& o) {
  const ModelConfig cfg = shape_config(o.arch, o.shape);
  TOY_CHECK(std::filesystem::is_regular_file(o.data), "[bench] --data '{}' is not a file", o.data);
  const int threads = o.threads ? o.threads : num_threads();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("toy_bench_finetune_{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string toy = self_exe();
  auto fail_child = [&](const std::string& what, const Child& c) {
    fail("[bench] {} failed (exit {}): {}", what, c.status, c.out.substr(c.out.size() > 2000 ? c.out.size() - 2000 : 0));
  };
  // The bases: one random model, then its quantized copies.
  const std::string f32 = (dir / "base_f32.gguf").string();
  for (const auto& [type, path] : std::vector<std::pair<std::string, std::string>>{
           {"f32", f32}, {"q8_0", (dir / "base_q8_0.gguf").string()}, {"q4_k", (dir / "base_q4_k.gguf").string()}}) {
    Child c = run_child({toy, "init", "--arch", o.arch, "--shape", o.shape, "--type", type, "--seed", "1", "--out", path},
                        (dir / "init.log").string());
    if (c.status != 0) fail_child("toy init", c);
  }
  if (!o.json)
    std::printf("toy bench finetune: %s %s (dim %lld, %lld layers), ctx %lld, batch %lld, %lld steps, %d threads, %s\n",
                o.arch.c_str(), o.shape.c_str(), (long long)cfg.dim, (long long)cfg.layers, (long long)o.ctx,
                (long long)o.batch, (long long)o.steps, threads, cpu_label().c_str());
  if (!o.json && o.device != Device::CPU) std::printf("toy's fine-tunes on device %s\n", std::string(name(o.device)).c_str());
  struct Mode {
    std::string name, base, method, precision;
  };
  const std::vector<Mode> modes = {{"full_f32", "f32", "full", "f32"},
                                   {"full_bf16", "f32", "full", "bf16"},
                                   {"lora_f32_base", "f32", "lora", "f32"},
                                   {"lora_q8_0_base", "q8_0", "lora", "f32"},
                                   {"qlora_q4_k_base", "q4_k", "lora", "f32"}};
  nlohmann::json results = nlohmann::json::object();
  auto emit = [&](const nlohmann::json& j) {
    if (o.json) {
      std::printf("%s\n", bench_line(j).c_str());
    } else {
      std::printf("%-16s %10.1f tok/s   peak RSS %8.1f MB\n", j["mode"].get<std::string>().c_str(),
                  j["tokens_per_s"].get<double>(), j["peak_rss_mb"].get<double>());
    }
    std::fflush(stdout);
  };
  for (const Mode& m : modes) {
    const std::string out = (dir / m.name).string();
    Child c = run_child({toy, "finetune", "-m", (dir / ("base_" + m.base + ".gguf")).string(), "--data", o.data,
                         "--method", m.method, "--precision", m.precision, "--recompute", "--ctx",
                         std::to_string(o.ctx), "--batch", std::to_string(o.batch), "--steps", std::to_string(o.steps),
                         "--lora-rank", std::to_string(o.rank), "--val-fraction", "0", "--threads",
                         std::to_string(threads), "--device", std::string(name(o.device)), "--out", out, "--force",
                         "--quiet", "--json"},
                        (dir / (m.name + ".log")).string());
    const auto j = last_json(c.out);
    if (c.status != 0 || !j) fail_child("toy finetune (" + m.name + ")", c);
    nlohmann::json r = {{"mode", m.name},
                        {"tokens_per_s", (*j)["tokens_per_s"]},
                        {"peak_rss_mb", c.peak_rss_mb},
                        {"trainable_params", (*j)["trainable_params"]},
                        {"train_loss", (*j)["train_loss"]}};
    results[m.name] = r;
    emit(r);
    std::filesystem::remove_all(out);
  }
  if (!o.no_peer) {
    // The peer at 1 and 2 threads (never fewer cores than toy); the faster is reported.
    std::optional<nlohmann::json> best;
    for (int t : {1, 2}) {
      Child c = run_child({o.python, std::string(TOY_SOURCE_DIR) + "/bench/peers/finetune_lora_peer.py", "--dim",
                           std::to_string(cfg.dim), "--layers", std::to_string(cfg.layers), "--heads",
                           std::to_string(cfg.heads), "--kv-heads", std::to_string(cfg.kv_heads), "--ffn",
                           std::to_string(cfg.ffn), "--vocab", std::to_string(cfg.vocab), "--ctx", std::to_string(o.ctx),
                           "--batch", std::to_string(o.batch), "--steps", std::to_string(o.steps), "--rank",
                           std::to_string(o.rank), "--threads", std::to_string(t)},
                          (dir / "peer.log").string());
      const auto j = last_json(c.out);
      if (c.status != 0 || !j) fail_child("the PyTorch peer (" + o.python + ")", c);
      nlohmann::json r = {{"mode", "peer_lora"},
                          {"tokens_per_s", (*j)["tokens_per_s"]},
                          {"peak_rss_mb", c.peak_rss_mb},
                          {"threads", t},
                          {"torch", (*j)["torch"]}};
      if (!best || r["tokens_per_s"].get<double>() > (*best)["tokens_per_s"].get<double>()) best = r;
    }
    results["peer_lora"] = *best;
    emit(*best);
  }
  nlohmann::json summary = {{"mode", "summary"}, {"cpu", cpu_name()}, {"threads", threads},
                            {"shape", o.shape},  {"ctx", o.ctx},             {"batch", o.batch}};
  if (results.contains("peer_lora")) {
    summary["lora_f32_base_vs_peer"] =
        results["lora_f32_base"]["tokens_per_s"].get<double>() / results["peer_lora"]["tokens_per_s"].get<double>();
    summary["lora_f32_base_vs_peer_target"] = 1.3;
  }
  summary["lora_q8_0_rss_vs_full_f32"] =
      results["lora_q8_0_base"]["peak_rss_mb"].get<double>() / results["full_f32"]["peak_rss_mb"].get<double>();
  summary["lora_q8_0_rss_vs_full_f32_target"] = 0.4;
  if (o.json) {
    std::printf("%s\n", bench_line(summary).c_str());
  } else {
    if (summary.contains("lora_f32_base_vs_peer"))
      std::printf("LoRA (F32 base) / PyTorch peer: %.2fx tokens/s (target >= 1.3)\n",
                  summary["lora_f32_base_vs_peer"].get<double>());
    std::printf("LoRA on Q8_0 / full F32 peak memory: %.2f (target <= 0.40)\n",
                summary["lora_q8_0_rss_vs_full_f32"].get<double>());
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

Run add_bench_finetune_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("finetune", "Fine-tuning speed and peak memory per mode, against a PyTorch LoRA peer");
  auto o = std::make_shared<FinetuneBenchOptions>();
  cmd->add_option("--arch", o->arch, "Architecture of the random model")->capture_default_str();
  cmd->add_option("--shape", o->shape, "Shape of the random model (toy init's shapes)")->capture_default_str();
  add_int(cmd, "--ctx", o->ctx, 2, 1 << 16, "Tokens per example")->capture_default_str();
  add_int(cmd, "--batch", o->batch, 1, 1 << 12, "Examples per step")->capture_default_str();
  add_int(cmd, "--steps", o->steps, 1, 1 << 20, "Steps per mode")->capture_default_str();
  add_int(cmd, "--lora-rank", o->rank, 1, 1 << 12, "LoRA rank (toy and the peer)")->capture_default_str();
  add_int(cmd, "--threads", o->threads, 1, kMaxThreads, "Threads for toy (default: all cores)")->default_str("");
  cmd->add_option("--data", o->data, "Plain text to fine-tune on")->capture_default_str();
  cmd->add_option("--python", o->python, "Python with torch for the peer")->capture_default_str();
  cmd->add_flag("--no-peer", o->no_peer, "Skip the PyTorch peer");
  cmd->add_flag("--json", o->json, "One JSON object per line");
  add_device(cmd, o->device);
  return [o]() { return run_finetune_bench(*o); };
}

}  // namespace toy::cli
