// Scratch memory for kernels: grows to the largest request and is then reused, so hot
// kernels allocate nothing per call (a malloc of a large block per task costs page faults
// and, when it is returned to the OS, TLB shootdowns on every core). Inside a parallel job
// the buffers belong to the chunk being run, not to the thread: whichever thread claims
// chunk c (thread_pool.h) finds the buffers chunk c grew before, so a warm model never
// allocates because another thread than last time ran a chunk. Outside a job: the thread's.
#pragma once
#include <cstddef>
#include <vector>

#include "toy/core/thread_pool.h"

namespace toy::cpu {

// A float buffer of at least n elements owned by the calling thread; `slot` separates
// buffers that are live at the same time. Contents are unspecified.
inline float* scratch_floats(size_t n, int slot) {
  thread_local std::vector<float> own[7];
  static std::vector<float> per_chunk[kMaxThreads][7];  // chunk c runs on one thread at a time
  const int chunk = current_chunk();
  std::vector<float>& v = chunk >= 0 ? per_chunk[chunk][slot] : own[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace toy::cpu
