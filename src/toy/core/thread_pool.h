// One thread pool for the whole process. parallel_for splits [begin, end) into at most
// num_threads() contiguous chunks — the partition depends only on the range, the grain and
// the thread count, so results are reproducible for a fixed thread count. The caller runs
// the first chunk itself. Calls from inside a parallel region run serially (no nesting).
// OpenBLAS is kept single-threaded and called inside our partitioning, so the two never
// compete for the cores.
// (The CPU backend's header: code above backend/ sets and reads the thread count through
// core/runtime.h.)
#pragma once
#include <cstdint>
#include <type_traits>

#include "toy/core/runtime.h"  // num_threads, set_num_threads, env_threads, kMaxThreads

namespace toy {

bool in_parallel_region();
// The chunk of the parallel job the calling thread is running (0 .. num_threads() - 1), or -1
// outside one (per-chunk scratch: backend/cpu/scratch.h).
int current_chunk();

namespace detail {
// Tests: while held, the pool's workers claim no chunk (as if the scheduler never ran them),
// so a job must be finished by its caller alone.
void hold_workers_for_testing(bool hold);
using RangeFn = void (*)(void* ctx, int64_t begin, int64_t end);
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void* ctx);
}  // namespace detail

// fn(begin, end) over chunks of at least `grain` items (the last may be smaller).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
  if (end <= begin) return;
  using Fn = std::remove_reference_t<F>;
  detail::parallel_for_impl(
      begin, end, grain,
      [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

// Runs fn(t) for t in [0, n) — one task per thread slot, for kernels that partition work
// themselves (e.g. by (batch, head)).
template <class F>
void parallel_tasks(int64_t n, F&& fn) {
  parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

}  // namespace toy
