// Splitting a weight's output rows across threads for the products read straight from a
// weight's blocks (gemv_blocks.cpp, quant_products.cpp), and small helpers both use.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "toy/core/thread_pool.h"

namespace toy::cpu {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The weights a row will need 1 KB from now: the hardware prefetcher alone leaves the loads
// of a memory-bound product waiting (measured ~7% faster decoding with it).
inline void prefetch_ahead(const uint8_t* w, int lines = 1) {
  for (int i = 0; i < lines; ++i) _mm_prefetch(reinterpret_cast<const char*>(w) + 1024 + 64 * i, _MM_HINT_T0);
}

// Runs fn(r0, r1) over [0, rows) in blocks of `block` rows. Each thread owns a contiguous
// share (so it streams its weights in order, as the hardware prefetcher wants) and, when
// done, takes blocks left in the others' shares: on a shared machine one core is often
// slower, and a fixed split would make every product wait for it. Counters sit on separate
// cache lines, so a thread touches another's only when it steals. Each row is computed by
// one thread, the same way whichever, so results do not depend on the schedule.
template <class F>
void for_row_blocks(int64_t rows, int64_t block, F&& fn) {
  const int64_t blocks = (rows + block - 1) / block;
  const int64_t shares = std::min<int64_t>(num_threads(), blocks);
  if (shares <= 1) return fn(int64_t(0), rows);
  struct alignas(64) Share {
    std::atomic<int64_t> next;
    int64_t end;
  };
  Share share[64];
  const int64_t n_shares = std::min<int64_t>(shares, 64);
  for (int64_t t = 0; t < n_shares; ++t) {
    share[t].next.store(blocks * t / n_shares, std::memory_order_relaxed);
    share[t].end = blocks * (t + 1) / n_shares;
  }
  parallel_for(0, n_shares, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < n_shares; ++k) {
        Share& s = share[(t + k) % n_shares];
        for (int64_t b; (b = s.next.fetch_add(1, std::memory_order_relaxed)) < s.end;)
          fn(b * block, std::min(rows, (b + 1) * block));
      }
  });
}

}  // namespace toy::cpu
