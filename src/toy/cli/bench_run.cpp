// `toy bench run -m M [--threads N] [--json]`: inference speed as llama-bench measures it —
// prompt processing (pp: 512 tokens prefilled as one sequence, logits for the last position
// only) and text generation (tg: 128 tokens decoded one at a time from an empty cache), in
// tokens per second (medians over --reps) — plus what decoding is limited by: the bytes of
// weights read per generated token over the time one token takes, against the memory read
// bandwidth measured in the same process. `--depths 0,1024,...` also times generation after
// that many cached tokens (llama-bench's -d), to show how time per token grows with position:
// only attention's share (reading the cache) should grow.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/machine.h"
#include "toy/core/rng.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/io/model_file.h"
#include "toy/nn/kv_cache.h"
#include "toy/obs/events.h"
#include "toy/ops/ops.h"

namespace toy::cli {

namespace {

bool is_expert_tensor(const std::string& name) { return name.ends_with("_exps.weight"); }

// Bytes of weights one decoded token reads: every parameter, except lookup tables that only
// give one row per token (an untied token embedding, learned positions); of a layer's experts,
// only the `used` it chooses.
double weight_bytes_per_token(const DecoderLM& m) {
  const MoeConfig& moe = m.config().moe;
  double bytes = 0;
  for (const Tensor& p : m.params().values()) {
    if (p.name() == "position_embd.weight") continue;
    if (p.name() == "token_embd.weight" && !m.config().tied) continue;
    const int64_t cols = p.shape()[p.ndim() - 1];
    const double share = is_expert_tensor(p.name()) ? double(moe.used) / double(moe.experts) : 1.0;
    bytes += double(row_bytes(p.dtype(), cols)) * double(p.numel() / cols) * share;
  }
  return bytes;
}

// Parameters in all, and those one token uses (a mixture of experts' chosen experts only).
std::pair<double, double> parameter_counts(const DecoderLM& m) {
  const MoeConfig& moe = m.config().moe;
  double all = 0, active = 0;
  for (const Tensor& p : m.params().values()) {
    all += double(p.numel());
    active += double(p.numel()) * (is_expert_tensor(p.name()) ? double(moe.used) / double(moe.experts) : 1.0);
  }
  return {all, active};
}

// Memory read bandwidth (GB/s): all threads summing disjoint parts of a buffer far larger than
// the caches (median of 5 passes). Integer sums: the compiler vectorizes them as they are.
double read_bandwidth_gbs() {
  const size_t words = size_t(512) << 20 >> 3;  // 512 MiB
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; i += 512) buf[i] = i;  // touch every page
  uint64_t total = 0;
  const double s = median_seconds([&] { total += host::parallel_sum(buf.data(), words); }, 5, 1);
  volatile uint64_t keep = total;
  (void)keep;
  return double(words * 8) / s / 1e9;
}

}  // namespace

Run add_bench_run_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("run", "Inference speed of a model: prompt processing and generation, as llama-bench");
  struct Flags {
    std::string model;
    int threads = 0, reps = 3;
    Device device = Device::CPU;
    int64_t pp = 512, tg = 128;
    std::vector<int64_t> depths;
    bool json = false;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_device(cmd, f->device);
  add_int(cmd, "--reps", f->reps, 1, 100, "Timed repetitions of each test (median reported; default 3)");
  add_int(cmd, "-p,--n-prompt", f->pp, 1, 1 << 20, "Prompt tokens (default 512)");
  add_int(cmd, "-n,--n-gen", f->tg, 1, 1 << 20, "Generated tokens (default 128)");
  cmd->add_option("--depths", f->depths, "Also time generation after this many cached tokens (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_flag("--json", f->json, "One JSON object");
  return [f]() {
    if (f->threads) set_num_threads(f->threads);
    const auto t0 = std::chrono::steady_clock::now();
    LoadedModel lm = load_model(f->model);
    lm.model->params().move_to(f->device);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    DecoderLM& m = *lm.model;
    const int64_t V = m.config().vocab;
    NoGradGuard ng;
    // Random token ids, as llama-bench uses.
    std::vector<int32_t> prompt(size_t(f->pp));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(philox4x32(1, 0, i)[0] % uint32_t(V));
    int64_t max_depth = 0;
    for (int64_t d : f->depths) max_depth = std::max(max_depth, d);
    nn::KVCache cache = m.new_cache(1, std::max(f->pp, max_depth) + f->tg);
    const double pp_s = median_seconds(
        [&] {
          cache.clear();
          (void)m.decode(cache, prompt);
        },
        f->reps, 1);
    // tg tokens decoded greedily after the first `depth` tokens of `context` (prefilled untimed).
    std::vector<int32_t> context(static_cast<size_t>(max_depth));
    for (size_t i = 0; i < context.size(); ++i) context[i] = int32_t(philox4x32(2, 0, i)[0] % uint32_t(V));
    auto time_tg = [&](int64_t depth) {
      std::vector<double> times;
      for (int r = 0; r <= f->reps; ++r) {  // the first run warms up
        cache.clear();
        if (depth > 0) (void)m.decode(cache, std::span<const int32_t>(context.data(), size_t(depth)));
        int32_t id = prompt[0];
        const auto t = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < f->tg; ++i) {
          const Tensor logits = m.decode(cache, id);
          if (is_host(logits.device())) {
            const float* z = logits.data<float>();
            id = int32_t(std::max_element(z, z + V) - z);
          } else {  // argmax on the device: 4 bytes come back, not the logits
            id = transfer(sample_token(logits, {}, SampleDraw{}), Device::CPU).to_i32_vector()[0];
          }
        }
        if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      }
      std::sort(times.begin(), times.end());
      return times[times.size() / 2];
    };
    const double tg_s = time_tg(0);
    const double bw = read_bandwidth_gbs();
    const double wbytes = weight_bytes_per_token(m);
    nlohmann::json j = provenance();
    j["model"] = f->model;
    j["arch"] = lm.arch;
    j["load_seconds"] = load_s;
    j["pp_tokens"] = f->pp;
    j["pp_tokens_per_s"] = double(f->pp) / pp_s;
    j["tg_tokens"] = f->tg;
    j["tg_tokens_per_s"] = double(f->tg) / tg_s;
    j["weight_bytes_per_token"] = wbytes;
    const auto [all_params, active_params] = parameter_counts(m);
    j["params"] = all_params;
    if (m.config().moe.experts > 0) j["active_params"] = active_params;
    j["tg_weight_gbs"] = wbytes * double(f->tg) / tg_s / 1e9;
    j["bandwidth_gbs"] = bw;
    j["tg_bandwidth_fraction"] = wbytes * double(f->tg) / tg_s / 1e9 / bw;
    j["reps"] = f->reps;
    // Generation deeper in the context: what attention adds is reading the cache (keys and
    // values of every earlier position, every attention layer; a Gated DeltaNet layer's state
    // does not grow), so compare the extra time per token with those bytes at the measured
    // bandwidth.
    const ModelConfig& c = m.config();
    const double kv_bytes_per_position = 2.0 * double(c.kv_heads) * double(c.head_dim) *
                                         double(element_size(cache.dtype()));  // one layer's
    // Positions of cache the attention layers read (or hold) at depth d: a sliding layer no
    // more than its window.
    auto kv_positions = [&](int64_t d) {
      double n = 0;
      for (int64_t l = 0; l < c.layers; ++l)
        if (c.layer_kind(l) == LayerKind::Attention) n += double(c.layer_slides(l) ? std::min(d, c.swa.window) : d);
      return n;
    };
    // The cache a run at the model's whole context holds, and what it would without windows.
    j["kv_cache_bytes_at_ctx"] = kv_bytes_per_position * kv_positions(c.ctx);
    if (c.swa.window > 0) {
      int64_t attention_layers = 0;
      for (int64_t l = 0; l < c.layers; ++l) attention_layers += c.layer_kind(l) == LayerKind::Attention;
      j["kv_cache_bytes_at_ctx_without_windows"] = kv_bytes_per_position * double(attention_layers) * double(c.ctx);
    }
    nlohmann::json by_depth = nlohmann::json::array();
    for (int64_t d : f->depths) {
      const double s = d == 0 ? tg_s : time_tg(d);
      const double extra_ms = (s - tg_s) / double(f->tg) * 1e3;
      const double kv_ms = kv_bytes_per_position * kv_positions(d) / (bw * 1e9) * 1e3;  // the cache d adds
      by_depth.push_back({{"depth", d},
                          {"tg_tokens_per_s", double(f->tg) / s},
                          {"ms_per_token", s / double(f->tg) * 1e3},
                          {"extra_ms_per_token", extra_ms},
                          {"kv_read_ms_per_token", kv_ms}});
    }
    if (!f->depths.empty()) j["tg_by_depth"] = by_depth;
    if (f->json) {
      std::printf("%s\n", bench_line(j).c_str());
      return 0;
    }
    std::printf("model %s (%s), %d threads, %s\n", printable(f->model).c_str(), lm.arch.c_str(), num_threads(),
                cpu_label().c_str());
    if (j.contains("active_params"))
      std::printf("parameters %.3g, active per token %.3g (%lld of %lld experts)\n", j["params"].get<double>(),
                  j["active_params"].get<double>(), static_cast<long long>(m.config().moe.used),
                  static_cast<long long>(m.config().moe.experts));
    std::printf("pp%-5lld %10.1f tok/s\n", static_cast<long long>(f->pp), j["pp_tokens_per_s"].get<double>());
    std::printf("tg%-5lld %10.1f tok/s   weights %.1f MB/token -> %.1f GB/s = %.2f of the %.1f GB/s measured\n",
                static_cast<long long>(f->tg), j["tg_tokens_per_s"].get<double>(), wbytes / 1e6,
                j["tg_weight_gbs"].get<double>(), j["tg_bandwidth_fraction"].get<double>(), bw);
    if (j.contains("kv_cache_bytes_at_ctx_without_windows"))
      std::printf("kv cache at the model's %lld positions: %s (%s if the sliding layers kept every position)\n",
                  static_cast<long long>(c.ctx), format_bytes(j["kv_cache_bytes_at_ctx"].get<double>()).c_str(),
                  format_bytes(j["kv_cache_bytes_at_ctx_without_windows"].get<double>()).c_str());
    for (const auto& r : by_depth)
      std::printf("tg%-5lld @ d%-6lld %6.1f tok/s   %.2f ms/token (+%.2f over d0; reading its cache at the "
                  "measured bandwidth: %.2f)\n",
                  static_cast<long long>(f->tg), static_cast<long long>(r["depth"].get<int64_t>()),
                  r["tg_tokens_per_s"].get<double>(), r["ms_per_token"].get<double>(),
                  r["extra_ms_per_token"].get<double>(), r["kv_read_ms_per_token"].get<double>());
    return 0;
  };
}

}  // namespace toy::cli
