// Timing helpers for `toy bench`: medians of repeated runs (these machines are noisy).
#pragma once
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace toy::cli {

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

// Medians of a and b timed alternately (a, b, a, b, ...), so that drift in the machine's
// speed affects both alike; returns {median_a, median_b} in seconds.
template <class A, class B>
std::pair<double, double> paired_median_seconds(A&& a, B&& b, int reps, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    a();
    auto t1 = std::chrono::steady_clock::now();
    b();
    auto t2 = std::chrono::steady_clock::now();
    ta.push_back(std::chrono::duration<double>(t1 - t0).count());
    tb.push_back(std::chrono::duration<double>(t2 - t1).count());
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
