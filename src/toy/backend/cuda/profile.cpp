// TOY_CUDA_PROFILE=1: where a GPU run's time goes, without a profiler. Every launch the glue
// checks (launched()) and every cuBLASLt product records a CUDA event after it on the compute
// stream, labelled with the outermost op or backward rule running (trace::t_scope; "(engine)"
// for the backward engine's own gradient sums and copies); at exit the time between
// consecutive events is charged to the label that ended the interval, and a table of the
// largest totals goes to stderr. The stream runs its work
// in order, so for a GPU-bound run (training) an interval is that kernel's time; where the
// host is the bottleneck (batch-1 decoding) an interval also holds the GPU's idle wait.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "toy/backend/cuda/cuda_glue.h"
#include "toy/core/trace.h"

namespace toy::cuda {

namespace {

// (events are 100 bytes or so of driver state each: a long run stops recording here)
constexpr size_t kMaxEvents = 1 << 20;

struct Profile {
  std::mutex mu;
  std::vector<std::pair<std::string, cudaEvent_t>> marks;  // "op: kernel" (the outermost op)
  bool full = false;
};

Profile* profile() {
  static Profile* p = [] {
    const char* v = std::getenv("TOY_CUDA_PROFILE");
    return v && *v && std::string(v) != "0" ? new Profile() : nullptr;
  }();
  return p;
}

void report() {
  Profile* p = profile();
  std::lock_guard<std::mutex> lock(p->mu);
  if (p->marks.size() < 2 || cudaEventSynchronize(p->marks.back().second) != cudaSuccess) return;
  std::map<std::string, std::pair<double, int64_t>> by_name;  // ms, count
  double total = 0;
  for (size_t i = 1; i < p->marks.size(); ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p->marks[i - 1].second, p->marks[i].second) != cudaSuccess) continue;
    auto& e = by_name[p->marks[i].first];
    e.first += ms, e.second += 1, total += ms;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::fprintf(stderr, "toy cuda profile: %zu launches, %.2f ms between the first and the last%s\n",
               p->marks.size(), total, p->full ? " (stopped recording at the cap)" : "");
  for (size_t i = 0; i < rows.size() && i < 40; ++i)
    std::fprintf(stderr, "%10.3f ms %5.1f%% %8lld x %9.1f us  %s\n", rows[i].second.first,
                 total > 0 ? 100.0 * rows[i].second.first / total : 0.0, (long long)rows[i].second.second,
                 1e3 * rows[i].second.first / double(rows[i].second.second), rows[i].first.c_str());
}

}  // namespace

void profile_mark(const char* kernel) {
  Profile* p = profile();
  if (!p) return;
  std::lock_guard<std::mutex> lock(p->mu);
  if (p->marks.size() >= kMaxEvents) {
    p->full = true;
    return;
  }
  cudaEvent_t e;
  if (cudaEventCreate(&e) != cudaSuccess) return;
  cudaEventRecord(e, static_cast<cudaStream_t>(compute_stream()));
  // (registered after the CUDA runtime started: runs before its own teardown)
  if (p->marks.empty()) std::atexit(report);
  const trace::Scope& s = trace::t_scope;
  p->marks.emplace_back(s.name ? std::string(s.name) + (s.backward ? " (backward): " : ": ") + kernel
                               : std::string("(engine): ") + kernel,
                        e);
}

}  // namespace toy::cuda
