// The host measurements of core/runtime.h, on the CPU backend's threads.
#include <cstring>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/core/runtime.h"
#include "toy/core/thread_pool.h"

namespace toy::host {

void parallel_copy(void* dst, const void* src, size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  parallel_for(0, int64_t(bytes), 1 << 20,
               [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, size_t(e - b)); });
}

uint64_t parallel_sum(const uint64_t* words, size_t n) {
  // One partial sum per chunk (chunks start at multiples of the grain), each on its own cache
  // line; integer sums, which the compiler vectorizes as they are.
  constexpr int64_t kGrain = 1 << 16;
  std::vector<uint64_t> sums((n / kGrain + 1) * 8, 0);
  parallel_for(0, int64_t(n), kGrain, [&](int64_t b, int64_t e) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t i = b;
    for (; i + 4 <= e; i += 4)
      a0 += words[size_t(i)], a1 += words[size_t(i + 1)], a2 += words[size_t(i + 2)], a3 += words[size_t(i + 3)];
    for (; i < e; ++i) a0 += words[size_t(i)];
    sums[size_t(b / kGrain) * 8] += a0 + a1 + a2 + a3;
  });
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  return total;
}

double fma_peak_gflops(int threads, double seconds) { return cpu::measure_fma_peak_gflops(threads, seconds); }

}  // namespace toy::host
