// Scratch memory for kernels: grows to the largest request and is then reused, so hot
// kernels allocate nothing per call (a malloc of a large block per task costs page faults
// and, when it is returned to the OS, TLB shootdowns on every core). Inside a parallel job
// the buffers belong to the chunk being run, not to the thread: whichever thread claims
// chunk c (thread_pool.h) finds the buffers chunk c grew before, so a warm model never
// allocates because another thread than last time ran a chunk. Outside a job: the thread's.
#pragma once
#include <array>
#include <cstddef>
#include <vector>

#include "toy/core/thread_pool.h"

namespace toy::cpu {

// Slots 0..4: the float kernels; 5, 6: matmul_weight (5 also the panels of gemm_tiles.h's
// kernels, gemm_half and gemm_f32); 7, 8: gemm_bf16's packed operands (7 also gemm_weight_rows'
// decoded rows and gemm_f32's packed rows of a).
inline constexpr int kScratchSlots = 9;

// A float buffer of at least n elements owned by the calling thread; `slot` separates
// buffers that are live at the same time. Contents are unspecified.
inline float* scratch_floats(size_t n, int slot) {
  thread_local std::vector<float> own[kScratchSlots];
  // Chunk c runs on one thread at a time. Never freed, as the pool is not: a thread outside the
  // pool (a server's engine) may still run kernels while exit() destroys statics, and a static
  // array made at the first kernel call would be destroyed before objects made earlier.
  using Buffers = std::array<std::array<std::vector<float>, kScratchSlots>, kMaxThreads>;
  static Buffers& per_chunk = *new Buffers;
  const int chunk = current_chunk();
  std::vector<float>& v = chunk >= 0 ? per_chunk[chunk][slot] : own[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace toy::cpu
