#include "toy/core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <system_error>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy {

namespace {

std::atomic<bool> g_hold_workers{false};

// How long an idle worker spins, watching for the next job, before it sleeps.
constexpr std::chrono::milliseconds kSpinBeforeSleep{10};

thread_local bool t_in_parallel = false;
thread_local int t_chunk = -1;

// Jobs are split into fixed chunks (the partition depends only on the range, the grain and
// the thread count), and whoever is running claims the next chunk from one atomic word: the
// caller and the workers alike. A worker the scheduler has not run yet (a busy machine, more
// threads than free cores) never holds the job up, since the caller runs the chunks nobody
// claimed; the caller waits only for chunks already being worked on. Each chunk runs whole on
// one thread, so results do not depend on who ran it.
//
// The claim word is (generation:32 | chunks:16 | next chunk:16): a worker that wakes late and
// still holds an old generation finds the word moved on and claims nothing, so it can never
// run a chunk of a job it did not see posted.
class ThreadPool {
 public:
  explicit ThreadPool(int n) { resize(n); }
  ~ThreadPool() { stop(); }

  int size() const { return n_threads_; }

  void resize(int n) {
    std::lock_guard<std::mutex> lock(run_mu_);  // never while a job runs
    stop();
    n_threads_ = std::max(1, n);
    quit_ = false;
    // Workers start from the current generation, read here: a job posted before a worker
    // thread gets scheduled must still be seen as new by it.
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    try {
      for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, gen] { worker(gen); });
    } catch (const std::system_error& e) {
      // The system refused a thread (limits, memory): stop the ones that started, so none is
      // left running, and leave a pool of one thread behind.
      const size_t failed = workers_.size() + 2;  // the caller is thread 1
      stop();
      n_threads_ = 1;
      fail("[threads] could not start thread {} of {}: {} (lower TOY_THREADS or --threads)", failed, n, e.what());
    }
  }

  void run(int64_t begin, int64_t end, int64_t grain, detail::RangeFn fn, void* ctx) {
    const int64_t n = end - begin;
    grain = std::max<int64_t>(grain, 1);
    if (n <= grain || t_in_parallel) {
      fn(ctx, begin, end);
      return;
    }
    std::unique_lock<std::mutex> lock(run_mu_);  // one job at a time; the size cannot change
    const int64_t chunks = std::min<int64_t>(n_threads_, (n + grain - 1) / grain);
    if (chunks <= 1) {
      lock.unlock();
      fn(ctx, begin, end);
      return;
    }
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_begin_ = begin;
    job_end_ = end;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
    claim_.store(claim_word(gen, chunks, 0), std::memory_order_release);  // publishes the fields
    generation_.store(gen, std::memory_order_release);
    generation_.notify_all();
    t_in_parallel = true;
    work_on(gen);
    t_in_parallel = false;
    // What is left are chunks other threads are running: short waits, so spin (a yield is a
    // system call, too slow for the microsecond gaps between the ops of a training step),
    // yielding if it drags on (that thread may have lost its core).
    for (int spin = 0; done_.load(std::memory_order_acquire) != chunks; ++spin) {
      if (spin < 20000) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  static uint64_t claim_word(uint64_t gen, int64_t chunks, int64_t next) {
    return (gen & 0xffffffffu) << 32 | uint64_t(chunks) << 16 | uint64_t(next);
  }

  // Claims and runs chunks of job `gen` until none is left (or the job is over).
  void work_on(uint64_t gen) {
    const uint64_t want = gen & 0xffffffffu;
    uint64_t w = claim_.load(std::memory_order_acquire);
    while (true) {
      if (w >> 32 != want) return;  // a later job: this one is finished
      const int64_t chunks = int64_t(w >> 16 & 0xffff), next = int64_t(w & 0xffff);
      if (next >= chunks) return;
      if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      try {
        run_chunk(next, chunks);
      } catch (...) {
        record_error();
      }
      done_.fetch_add(1, std::memory_order_acq_rel);
      w = claim_.load(std::memory_order_acquire);
    }
  }

  void run_chunk(int64_t c, int64_t chunks) {
    const int64_t n = job_end_ - job_begin_;
    int64_t b = job_begin_ + n * c / chunks;
    int64_t e = job_begin_ + n * (c + 1) / chunks;
    if (b >= e) return;
    struct RunningChunk {  // current_chunk() is c while the chunk runs, -1 after (even if it throws)
      explicit RunningChunk(int chunk) { t_chunk = chunk; }
      ~RunningChunk() { t_chunk = -1; }
    };
    const RunningChunk running{int(c)};
    job_fn_(job_ctx_, b, e);
  }

  void worker(uint64_t seen) {
    t_in_parallel = true;
    while (true) {
      // Spin a while (ops come in quick succession in a training step, and the caller's serial
      // stretches between them — bookkeeping, a read-back — can last a millisecond or more:
      // waking from sleep costs the next job tens of microseconds), then sleep. Timed, not
      // counted: a pause takes ~140 cycles on recent Intel cores and a few on AMD ones.
      // (1 ms of spinning measured 5% slower cpu-small training than 10 ms on a Xeon SPR.)
      uint64_t g = seen;
      const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
      for (int spin = 1;; ++spin) {
        g = generation_.load(std::memory_order_acquire);
        if (g != seen || quit_.load(std::memory_order_relaxed)) break;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
        if (spin % 256 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
      }
      while (g == seen && !quit_.load(std::memory_order_relaxed)) {
        generation_.wait(seen, std::memory_order_acquire);
        g = generation_.load(std::memory_order_acquire);
      }
      if (quit_.load(std::memory_order_relaxed)) return;
      seen = g;
      while (g_hold_workers.load(std::memory_order_acquire) && !quit_.load(std::memory_order_relaxed))
        std::this_thread::yield();
      work_on(g);
    }
  }

  void record_error() {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_) error_ = std::current_exception();
  }

  void stop() {
    if (workers_.empty()) return;
    quit_ = true;
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex error_mu_;
  std::exception_ptr error_;
  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<bool> quit_{false};
  detail::RangeFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_begin_ = 0, job_end_ = 0;
};

std::atomic<int> g_default_threads{0};  // set_default_threads

int default_threads() {
  const int env = env_threads();
  if (env > 0) return env;
  if (const int d = g_default_threads.load()) return d;
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

// Created on first use at the size first asked for (set_num_threads before any parallel
// work builds it at that size directly, so a TOY_THREADS the system cannot start never
// stands in the way of a --threads it can); lives until exit.
std::mutex g_pool_mu;
std::atomic<ThreadPool*> g_pool{nullptr};

ThreadPool& pool(int want = 0) {
  if (ThreadPool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  ThreadPool* p = g_pool.load(std::memory_order_relaxed);
  if (!p) {
    p = new ThreadPool(want > 0 ? want : default_threads());  // throws when threads cannot start
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

int env_threads() {
  const char* env = std::getenv("TOY_THREADS");
  if (!env) return 0;
  int64_t n = 0;
  TOY_CHECK(parse_int64(env, n) && n >= 1 && n <= kMaxThreads, "[threads] TOY_THREADS must be an integer in 1..{}, got '{}'",
            kMaxThreads, printable(env));
  return int(n);
}

int num_threads() { return pool().size(); }

void set_default_threads(int n) {
  TOY_CHECK(n >= 0 && n <= kMaxThreads, "[threads] thread count must be in 0..{}, got {}", kMaxThreads, n);
  g_default_threads = n;
}

void set_num_threads(int n) {
  TOY_CHECK(n >= 0 && n <= kMaxThreads, "[threads] thread count must be in 0..{}, got {}", kMaxThreads, n);
  TOY_CHECK(!t_in_parallel, "[threads] cannot change the thread count inside a parallel region");
  const int want = n == 0 ? default_threads() : n;
  ThreadPool& p = pool(want);
  if (want != p.size()) p.resize(want);
}

bool in_parallel_region() { return t_in_parallel; }
int current_chunk() { return t_chunk; }

namespace detail {
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain, RangeFn fn, void* ctx) {
  pool().run(begin, end, grain, fn, ctx);
}

void hold_workers_for_testing(bool hold) { g_hold_workers.store(hold, std::memory_order_release); }
}  // namespace detail

}  // namespace toy
