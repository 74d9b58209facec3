// cuda-emu: the CUDA launch model on the host, for checking toy's kernels without a GPU.
//
// Force-included (g++ -include) at the top of every converted kernel file: convert.py turns
// src/toy/backend/cuda/*.cu into C++ (`k<<<grid, block, shared, stream>>>(args)` becomes
// `emu::Launch("k", grid, block, shared, stream).run(k, args)`), and this header gives the
// CUDA names the kernels use a host meaning. scripts/gpu-emulate.sh builds and runs it all.
//
// What is emulated
//   - A launch runs every block before the launcher returns (one stream, synchronous), blocks
//     one after another: x fastest, then y, then z.
//   - A block's threads are fibers on one OS thread. A thread runs until it reaches a barrier
//     or returns. A warp is 32 consecutive linear thread indices; __shfl*_sync and __syncwarp
//     complete when every lane of the mask waits at one, and the values are exchanged then.
//     The block runs warp by warp, each as far as it can go before the next (to the next
//     __syncthreads(), which releases when every live thread waits at it; threads that returned
//     count as arrived, as on sm_70+, and are reported as a warning). A lane outside its own mask,
//     a mask naming an exited or missing lane, lanes of one warp at different masks or kinds of
//     warp operation, and a deadlock abort with the kernel's name and the block.
//   - __shared__ variables are static storage (one block runs at a time), filled with 0xFF
//     bytes (NaN, -1) when a block first reaches their declaration: a read of shared memory
//     nobody of this block wrote fails a parity test instead of seeing an earlier block's data.
//   - Launch limits: at most 1024 threads a block, grid y and z at most 65535, parameters at
//     most 32764 bytes (over 4 KiB is counted as a warning: CUDA before 12.1 refuses it).
//   - The rounded intrinsics (__fmul_rn, __fadd_rn, ...) are single IEEE operations the
//     compiler may not contract; the kernels themselves are compiled with FMA contraction, as
//     nvcc does by default (CUDA_EMU_CONTRACT=off compiles them without). __CUDA_ARCH__ is
//     defined (after the CUDA headers), so the shared TOY_HD math takes its device branch.
//   - Device memory is host memory: the sim device's allocations (harness.cpp poisons them).
//
// What is NOT emulated (the GPU run of tests/gpu remains the word on these)
//   - cuBLAS / cuBLASLt: glue that calls them is left out; their kernels stay the CPU's on sim.
//   - The device math library's exact bits: expf, logf, tanhf, ... are the host libm's.
//   - Real concurrency: no two threads run at once and a thread runs until it blocks, so a data
//     race or a missing barrier may go unnoticed. Running warp by warp shows many missing
//     barriers; CUDA_EMU_ORDER=reverse or shuffle[:SEED] changes the order blocks, warps and
//     lanes run in, which shows more.
//   - Occupancy, registers, shared-memory size limits, timing, warps in lockstep, streams and
//     their overlap, the memory model (__threadfence and friends are not provided).
//   - cub's real radix sort: cub_host_sort.h stands in with a host stable sort.
//   - Anything else a kernel might call (atomics, dynamic shared memory, cooperative groups,
//     textures, fast-math intrinsics): a kernel file using it does not compile here (a launch
//     asking for dynamic shared memory aborts), and gpu-emulate.sh reports it as not emulated.
//     Add what it needs to this header.
//
// Environment, read at run time
//   CUDA_EMU_ORDER=forward (default) | reverse | shuffle[:SEED]
//       reverse: blocks, the warps of a block and the lanes of a warp run last to first;
//       shuffle: warps and lanes in a random order, drawn afresh at each turn (blocks in order).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

// ---- the CUDA keywords --------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

namespace emu {

// ---- fibers (their switch is in emu_runtime.cpp) --------------------------------------------------

enum class State : int { Runnable, AtBlockBarrier, AtWarpBarrier, Done };
enum class WarpOp : int { Sync, Xor, Up, Down, Index };

struct Fiber {
  void* context = nullptr;  // the saved machine state while it is not running (emu_runtime.cpp)
  char* stack = nullptr;
  State state = State::Done;
  int index = 0;  // the linear thread index in its block
  // The warp operation it waits at, and the value it sends and receives.
  WarpOp op = WarpOp::Sync;
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t send = 0, receive = 0;
};

// Makes `f` start the current block's body at its next resume; resumes a fiber until it
// yields or returns; yields from the running fiber back to the scheduler.
void fiber_prepare(Fiber& f);
void fiber_resume(Fiber& f);
void fiber_yield();

constexpr int kMaxBlockThreads = 1024;

struct Scheduler {
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
  int threads = 0;
  const char* kernel = "";
  std::vector<const void*> poisoned_shared;  // the __shared__ variables this block has poisoned
};
inline Scheduler sched;
inline uint3 thread_index, block_index;
inline dim3 block_dim, grid_dim;

inline std::map<std::string, long>& launch_counts() {
  static std::map<std::string, long> m;
  return m;
}
inline std::map<std::string, long>& warning_counts() {
  static std::map<std::string, long> m;
  return m;
}

// ---- scheduling order (CUDA_EMU_ORDER) -----------------------------------------------------------

struct Order {
  bool reverse = false;
  bool shuffle = false;
  uint64_t state = 0;  // xorshift state when shuffling
};
inline Order& order() {
  static Order o = [] {
    Order r;
    const char* v = std::getenv("CUDA_EMU_ORDER");
    const std::string s = v ? v : "forward";
    if (s == "reverse") {
      r.reverse = true;
    } else if (s.rfind("shuffle", 0) == 0) {
      r.shuffle = true;
      const uint64_t seed = s.size() > 8 && s[7] == ':' ? std::strtoull(s.c_str() + 8, nullptr, 10) : 1;
      r.state = seed * 0x9E3779B97F4A7C15ull + 1;
    } else if (s != "forward" && !s.empty()) {
      std::fprintf(stderr, "cuda-emu: CUDA_EMU_ORDER=%s: expected forward, reverse or shuffle[:SEED]\n", s.c_str());
      std::abort();
    }
    return r;
  }();
  return o;
}
inline uint64_t next_random() {
  uint64_t& x = order().state;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return x;
}

[[noreturn]] inline void die(const std::string& why) {
  std::fprintf(stderr, "cuda-emu: kernel %s, block (%u,%u,%u): %s\n", sched.kernel, block_index.x, block_index.y,
               block_index.z, why.c_str());
  std::abort();
}

// ---- barriers and warp operations ---------------------------------------------------------------

inline void wait_at(State s) {
  sched.current->state = s;
  fiber_yield();
}

template <class T>
T warp_op(WarpOp op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  Fiber* me = sched.current;
  if (!(mask >> (me->index % 32) & 1u)) die("a lane at a warp operation outside its own mask");
  if (width < 1 || width > 32 || (width & (width - 1))) die("a shuffle width that is not a power of two up to 32");
  me->op = op, me->mask = mask, me->arg = arg, me->width = width, me->send = 0;
  std::memcpy(&me->send, &v, sizeof(T));
  wait_at(State::AtWarpBarrier);
  T r;
  std::memcpy(&r, &me->receive, sizeof(T));
  return r;
}

// Completes warp `base / 32`'s operation if every lane of its mask waits at it; returns whether
// it did.
inline bool release_warp(int base) {
  Fiber* w = &sched.fibers[size_t(base)];
  const int lanes = std::min(32, sched.threads - base);
  int first = -1;
  for (int l = 0; l < lanes && first < 0; ++l)
    if (w[l].state == State::AtWarpBarrier) first = l;
  if (first < 0) return false;
  const unsigned mask = w[first].mask;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    if (l >= lanes) die("a warp mask names lane " + std::to_string(l) + ", past the block's last thread");
    if (w[l].state == State::Done) die("a warp mask names lane " + std::to_string(l) + ", which has exited");
    if (w[l].state != State::AtWarpBarrier) return false;
    if (w[l].mask != mask) die("lanes of one warp at warp operations with different masks");
    if (w[l].op != w[first].op) die("lanes of one warp at different kinds of warp operation");
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    Fiber& g = w[l];
    if (g.op == WarpOp::Sync) continue;
    const int segment = l / g.width * g.width, in = l % g.width;
    int src = l;
    switch (g.op) {
      case WarpOp::Sync: break;
      case WarpOp::Xor: src = (l ^ g.arg) / g.width == l / g.width ? l ^ g.arg : l; break;
      case WarpOp::Up: src = in - g.arg >= 0 ? l - g.arg : l; break;
      case WarpOp::Down: src = in + g.arg < g.width ? l + g.arg : l; break;
      case WarpOp::Index: src = segment + ((g.arg % g.width) + g.width) % g.width; break;
    }
    if (src < 0 || src > 31 || !(mask >> src & 1u))
      die("lane " + std::to_string(l) + " reads a shuffle value from lane " + std::to_string(src) + ", outside the mask");
    g.receive = w[src].send;
  }
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) w[l].state = State::Runnable;
  return true;
}

inline void set_current(Fiber& f) {
  sched.current = &f;
  const unsigned i = unsigned(f.index);
  thread_index = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
}

// `count` indices in the order of CUDA_EMU_ORDER (a fresh random one each call when shuffling).
inline void order_indices(std::vector<int>& v, int count) {
  const Order& o = order();
  v.resize(size_t(count));
  for (int k = 0; k < count; ++k) v[size_t(k)] = o.reverse ? count - 1 - k : k;
  if (o.shuffle)
    for (int k = count - 1; k > 0; --k) std::swap(v[size_t(k)], v[size_t(next_random() % uint64_t(k + 1))]);
}

// Runs one block. Each pass takes the warps in turn, and runs a warp as far as it can go: its
// lanes until each blocks, then again while its warp operation completes, until its lanes wait
// at __syncthreads() or have returned. So a warp runs ahead of the others up to the next block
// barrier, as a fast warp can on a GPU: a missing __syncthreads() between one warp's write of
// shared memory and another's read (or before it is written again) shows, in forward order or
// in reverse.
inline void run_block(const std::function<void()>& body) {
  sched.body = &body;
  sched.poisoned_shared.clear();
  const int n = sched.threads, warps = (n + 31) / 32;
  for (int i = 0; i < n; ++i) {
    Fiber& f = sched.fibers[size_t(i)];
    f.index = i;
    f.state = State::Runnable;
    fiber_prepare(f);
  }
  std::vector<int> warp_order, lane_order;
  for (;;) {
    order_indices(warp_order, warps);
    for (const int w : warp_order) {
      const int base = w * 32, lanes = std::min(32, n - base);
      do {
        order_indices(lane_order, lanes);
        for (const int l : lane_order) {
          Fiber& f = sched.fibers[size_t(base + l)];
          if (f.state != State::Runnable) continue;
          set_current(f);
          fiber_resume(f);
        }
      } while (release_warp(base));
    }
    int done = 0, at_block = 0, at_warp = 0;
    for (int i = 0; i < n; ++i) {
      const State s = sched.fibers[size_t(i)].state;
      done += s == State::Done, at_block += s == State::AtBlockBarrier, at_warp += s == State::AtWarpBarrier;
    }
    if (done == n) return;
    if (at_block && at_block + done == n) {
      if (done) ++warning_counts()[std::string(sched.kernel) + ": __syncthreads() after some threads returned"];
      for (int i = 0; i < n; ++i)
        if (sched.fibers[size_t(i)].state == State::AtBlockBarrier) sched.fibers[size_t(i)].state = State::Runnable;
      continue;
    }
    die("deadlock: " + std::to_string(at_block) + " threads at __syncthreads(), " + std::to_string(at_warp) +
        " at warp operations that cannot complete, " + std::to_string(done) + " returned, of " + std::to_string(n));
  }
}

// The first thread of a block to reach a __shared__ declaration fills it with 0xFF bytes
// (convert.py adds the call after each declaration).
inline void poison_shared(void* p, size_t bytes) {
  auto& seen = sched.poisoned_shared;
  if (std::find(seen.begin(), seen.end(), p) != seen.end()) return;
  seen.push_back(p);
  std::memset(p, 0xFF, bytes);
}

// ---- launches -------------------------------------------------------------------------------------

// The bytes of a kernel's parameters, laid out as a struct.
template <class R, class... P>
constexpr size_t parameter_bytes(R (*)(P...)) {
  size_t off = 0;
  ((off = (off + alignof(std::decay_t<P>) - 1) / alignof(std::decay_t<P>) * alignof(std::decay_t<P>) +
          sizeof(std::decay_t<P>)),
   ...);
  return off;
}

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

struct Launch {
  const char* name;
  dim3 grid, block;
  Launch(const char* name_, dim3 grid_, dim3 block_, size_t shared_bytes = 0, cudaStream_t = nullptr)
      : name(name_), grid(grid_), block(block_) {
    if (shared_bytes) {
      std::fprintf(stderr, "cuda-emu: %s asks for %zu bytes of dynamic shared memory (not emulated)\n", name, shared_bytes);
      std::abort();
    }
  }
  template <class K, class... A>
  void run(K kernel, A... args) {
    std::lock_guard<std::mutex> lock(launch_mutex());
    const long n = long(block.x) * block.y * block.z;
    if (n <= 0 || n > kMaxBlockThreads || block.z > 64) {
      std::fprintf(stderr, "cuda-emu: %s launched with a block of (%u,%u,%u) threads\n", name, block.x, block.y, block.z);
      std::abort();
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
      std::fprintf(stderr, "cuda-emu: %s launched with a grid of (%u,%u,%u) blocks\n", name, grid.x, grid.y, grid.z);
      std::abort();
    }
    constexpr size_t params = parameter_bytes(static_cast<K>(nullptr));
    if (params > 32764) {
      std::fprintf(stderr, "cuda-emu: %s takes %zu bytes of parameters (CUDA's limit is 32764)\n", name, params);
      std::abort();
    }
    if (params > 4096) ++warning_counts()[std::string(name) + ": over 4096 bytes of parameters (needs CUDA 12.1+)"];
    ++launch_counts()[name];
    sched.kernel = name;
    sched.threads = int(n);
    if (sched.fibers.size() < size_t(n)) sched.fibers.resize(size_t(n));
    block_dim = block;
    grid_dim = grid;
    const std::function<void()> body = [&] { kernel(args...); };
    const long blocks = long(grid.x) * grid.y * grid.z;
    for (long q = 0; q < blocks; ++q) {
      const long i = order().reverse ? blocks - 1 - q : q;
      block_index = uint3{unsigned(i % grid.x), unsigned((i / grid.x) % grid.y), unsigned(i / (long(grid.x) * grid.y))};
      run_block(body);
    }
  }
};

// Launch errors: the emulator aborts on a bad launch itself, so there is never one to report.
inline cudaError_t last_error() { return cudaSuccess; }
inline const char* error_string(cudaError_t e) { return e == cudaSuccess ? "no error" : "an emulated CUDA error"; }

}  // namespace emu

// ---- the built-in variables and the warp intrinsics ---------------------------------------------
#define threadIdx emu::thread_index
#define blockIdx emu::block_index
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define EMU_POISON_SHARED(x) emu::poison_shared(static_cast<void*>(&(x)), sizeof(x))
inline void __syncthreads() { emu::wait_at(emu::State::AtBlockBarrier); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)emu::warp_op<int>(emu::WarpOp::Sync, mask, 0, 0, 32); }
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return emu::warp_op(emu::WarpOp::Xor, mask, v, lane_mask, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::warp_op(emu::WarpOp::Up, mask, v, int(delta), width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return emu::warp_op(emu::WarpOp::Down, mask, v, int(delta), width);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return emu::warp_op(emu::WarpOp::Index, mask, v, src_lane, width);
}

// ---- the device side of the shared math ---------------------------------------------------------
// (hd.h, train_launch.h, unary_math.h take their __CUDA_ARCH__ branch in the kernel files; their
// namespaces are renamed there by gpu-emulate.sh so these copies do not meet the host's at link.)
#define __CUDA_ARCH__ 900
#define EMU_OPAQUE(r) asm("" : "+m"(r))  // (keeps the compiler from contracting across the call)
inline float __fmul_rn(float a, float b) { float r = a * b; EMU_OPAQUE(r); return r; }
inline float __fadd_rn(float a, float b) { float r = a + b; EMU_OPAQUE(r); return r; }
inline float __fsub_rn(float a, float b) { float r = a - b; EMU_OPAQUE(r); return r; }
inline float __fdiv_rn(float a, float b) { float r = a / b; EMU_OPAQUE(r); return r; }
inline float __fsqrt_rn(float a) { float r = std::sqrt(a); EMU_OPAQUE(r); return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) { double r = a * b; EMU_OPAQUE(r); return r; }
inline double __dadd_rn(double a, double b) { double r = a + b; EMU_OPAQUE(r); return r; }
inline unsigned __float_as_uint(float x) { unsigned u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; std::memcpy(&x, &u, 4); return x; }

#define cudaGetLastError() emu::last_error()
#define cudaPeekAtLastError() emu::last_error()
#define cudaGetErrorString(e) emu::error_string(e)
