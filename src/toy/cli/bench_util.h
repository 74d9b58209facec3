// Timing helpers for `toy bench`: medians of repeated runs (these machines are noisy).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/core/runtime.h"
#include "toy/obs/events.h"

namespace toy::cli {

// The middle of repeated measurements (0 when there are none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Thread counts a PyTorch peer runs at (torch.set_num_threads); the best is reported.
constexpr int kPeerThreads[] = {1, 2};

// The CPU every benchmark names beside its numbers (machines of one kind differ).
inline std::string cpu_name() { return provenance().value("cpu", std::string("?")); }

// The CPU and the kernel variant, for the human-readable lines.
inline std::string cpu_label() { return cpu_name() + ", " + kernel_variant_name() + " kernels"; }

// A benchmark's JSON line: its fields plus the CPU kernel variant that ran them and how BF16
// products ran (mixed precision, BF16 weights).
inline std::string bench_line(nlohmann::json j) {
  j["kernel_variant"] = kernel_variant_name();
  j["bf16_products"] = bf16_products_form();
  return j.dump();
}

// A shell word for popen() command lines.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a benchmark peer (a shell command line; stdout and stderr read together): its result
// is the JSON object line holding `key`; any other line is kept, and the last one explains a
// failure (a non-zero exit or no result), as does the exit status when it printed nothing.
struct PeerOutput {
  std::optional<nlohmann::json> result;
  std::string error;
};
inline PeerOutput run_peer_command(const std::string& cmd, const char* key, const std::string& program) {
  PeerOutput res;
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    res.error = "cannot start " + program;
    return res;
  }
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  std::string last_text;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    if (line[0] == '{') {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.is_object() && j.contains(key) && j[key].is_number()) {
          res.result = std::move(j);
          continue;
        }
      } catch (const nlohmann::json::exception&) {
      }
    }
    last_text = line;
  }
  if (status != 0 || !res.result) {
    res.result.reset();
    res.error = last_text.empty() ? fmt::format("the peer exited with status {} and printed nothing", status)
                                  : last_text;
  }
  return res;
}

// Median wall time in seconds of `reps` runs of f, after `warmup` untimed runs.
template <class F>
double median_seconds(F&& f, int reps, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of a and b timed alternately, so that drift in the machine's speed affects both
// alike; returns {median_a, median_b} in seconds. With block > 1 each turn runs its case
// `block` times and times all but the first run, so each case is measured in its steady
// state rather than right after the other has evicted its data from the caches.
template <class A, class B>
std::pair<double, double> paired_median_seconds(A&& a, B&& b, int reps, int warmup = 1, int block = 1) {
  for (int i = 0; i < warmup; ++i) a(), b();
  std::vector<double> ta, tb;
  auto turn = [&](auto& f, std::vector<double>& t) {
    for (int k = 0; k < block; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      if (block == 1 || k > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  for (int i = 0; i < reps; ++i) {
    turn(a, ta);
    turn(b, tb);
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

struct BenchResult {
  std::string name;
  double value = 0;
  std::string unit;
  double baseline = 0;
  double ratio = 0;
  std::string baseline_what;  // what the baseline measured
  double target = 0;          // ratio the issue asks for (0 = none)
};

// One JSON object per line, or an aligned table row.
void print_result(const BenchResult& r, bool json);

}  // namespace toy::cli
