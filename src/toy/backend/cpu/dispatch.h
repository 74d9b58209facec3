// dtype dispatch for CPU kernels: one templated lambda for F32/F16/BF16.
#pragma once
#include <type_traits>

#include "toy/core/error.h"
#include "toy/core/tensor.h"

namespace toy::cpu {

template <class F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(std::type_identity<float>{}); break;
    case DType::F16: f(std::type_identity<f16>{}); break;
    case DType::BF16: f(std::type_identity<bf16>{}); break;
    default: fail("[{}] needs a float tensor (f32, f16, bf16), got {}", op, name(t));
  }
}

// Merges adjacent dimensions that are contiguous with each other in every operand, so a
// strided loop runs over as few and as long dimensions as possible.
template <int K>
void coalesce(Shape& shape, std::array<Strides, K>& strides) {
  if (shape.ndim() <= 1) return;
  Shape s;
  std::array<Strides, K> st;
  s.push_back(shape[0]);
  for (int k = 0; k < K; ++k) st[k].push_back(strides[k][0]);
  for (int i = 1; i < shape.ndim(); ++i) {
    bool merge = true;
    int last = s.ndim() - 1;
    for (int k = 0; k < K; ++k)
      if (st[k][last] != strides[k][i] * shape[i]) merge = false;
    if (shape[i] == 1) {
      continue;  // size-1 dims never matter
    }
    if (s[last] == 1) {  // replace a leading size-1 dim
      s[last] = shape[i];
      for (int k = 0; k < K; ++k) st[k][last] = strides[k][i];
      continue;
    }
    if (merge) {
      s[last] *= shape[i];
      for (int k = 0; k < K; ++k) st[k][last] = strides[k][i];
    } else {
      s.push_back(shape[i]);
      for (int k = 0; k < K; ++k) st[k].push_back(strides[k][i]);
    }
  }
  shape = s;
  strides = st;
}

// Offsets of the first element of outer row `row` (all dims but the last) for each operand.
template <int K>
std::array<int64_t, K> row_offsets(const Shape& shape, const std::array<Strides, K>& strides, int64_t row) {
  std::array<int64_t, K> off{};
  for (int d = shape.ndim() - 2; d >= 0; --d) {
    int64_t i = row % shape[d];
    row /= shape[d];
    for (int k = 0; k < K; ++k) off[k] += i * strides[k][d];
  }
  return off;
}

}  // namespace toy::cpu
