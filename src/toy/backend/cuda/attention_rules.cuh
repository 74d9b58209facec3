// Which keys a query sees, for both attention kernels (attention.cu's warp-per-row form and
// attention_tiled.cu's tiles): the CPU kernel's rules (backend/cpu/attention.cpp). Key j is
// visible to query i when causal -> j <= i + (S - T), a window W -> also i + (S - T) - j < W;
// segments are tested per key by the kernels. (In an unnamed namespace: each .cu file gets
// its own copy.)
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "toy/backend/cuda/attention_launch.h"

namespace toy::cuda {
namespace {

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// Keys [first, end) may be visible to query i (causal and window bounds).
__device__ __forceinline__ void key_range(const AttentionGeometry& g, int64_t i, int64_t* first, int64_t* end) {
  const int64_t off = g.S - g.T;
  *end = g.causal ? imin(g.S, i + off + 1) : g.S;
  *first = (g.causal && g.window > 0) ? imax(0, i + off - g.window + 1) : 0;
  if (*end < *first) *end = *first;
}
// Queries [first, end) may see key j (the inverse of key_range).
__device__ __forceinline__ void query_range(const AttentionGeometry& g, int64_t j, int64_t* first, int64_t* end) {
  const int64_t off = g.S - g.T;
  *first = g.causal ? imax(0, j - off) : 0;
  *end = (g.causal && g.window > 0) ? imin(g.T, j - off + g.window) : g.T;
  if (*end < *first) *end = *first;
}

}  // namespace
}  // namespace toy::cuda
