// Walks the elements of an N-d shape in row-major order, producing the element offset of
// each of K strided operands. Used by generic (non-contiguous) kernels and host copies.
#pragma once
#include <array>
#include <cstdint>

#include "toy/core/shape.h"

namespace toy {

// Calls fn(offsets) for every index of `shape`; offsets[k] = sum_i idx[i] * strides[k][i].
// The innermost dimension is handed over as a run: fn(offsets, n, inner_strides) so that
// kernels loop over it directly.
template <int K, class Fn>
void for_each_strided_run(const Shape& shape, const std::array<const Strides*, K>& strides, Fn&& fn) {
  const int nd = shape.ndim();
  if (shape.numel() == 0) return;
  std::array<int64_t, K> inner{};
  int64_t n_inner = 1;
  if (nd > 0) {
    n_inner = shape[nd - 1];
    for (int k = 0; k < K; ++k) inner[k] = (*strides[k])[nd - 1];
  }
  std::array<int64_t, kMaxDims> idx{};
  std::array<int64_t, K> off{};
  const int outer = nd - 1;
  while (true) {
    fn(off, n_inner, inner);
    // Increment the outer index (all dims except the innermost).
    int d = outer - 1;
    for (; d >= 0; --d) {
      idx[d]++;
      for (int k = 0; k < K; ++k) off[k] += (*strides[k])[d];
      if (idx[d] < shape[d]) break;
      for (int k = 0; k < K; ++k) off[k] -= (*strides[k])[d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace toy
