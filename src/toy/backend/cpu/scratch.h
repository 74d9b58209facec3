// Per-thread scratch memory for kernels: grows to the largest request and is then reused,
// so hot kernels allocate nothing per call (a malloc of a large block per task costs page
// faults and, when it is returned to the OS, TLB shootdowns on every core).
#pragma once
#include <cstddef>
#include <vector>

namespace toy::cpu {

// A float buffer of at least n elements owned by the calling thread; `slot` separates
// buffers that are live at the same time. Contents are unspecified.
inline float* scratch_floats(size_t n, int slot) {
  thread_local std::vector<float> slots[7];
  std::vector<float>& v = slots[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace toy::cpu
