// The CUDA kernels' launchers, in plain types (no toy or CUDA headers): the .cu files are
// compiled by nvcc, the glue that turns tensors into these views (install.cpp) by the C++
// compiler. Every launcher queues its kernel on the compute stream and returns at once.
#pragma once
#include <cstdint>

namespace toy::cuda {

inline constexpr int kMaxDims = 8;
enum class Elem : int32_t { F32, F16, BF16, I32 };

// A strided view of device memory, as a kernel walks it (element i of the row-major order
// lives at data + sum(index_d * stride[d]) elements).
struct View {
  void* data = nullptr;
  Elem elem = Elem::F32;
  int32_t ndim = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  bool contiguous = false;
};

// The stream every kernel and copy runs on (one per process; the legacy default stream here).
void* compute_stream();

// dst[...] = value (converted to dst's type).
void launch_fill(const View& dst, double value);
// dst[...] = src[...] converted (same shape; float types and I32).
void launch_copy(const View& src, const View& dst);
// out = a op b, a and b broadcast views of out's shape; out contiguous. op: 0 add, 1 sub,
// 2 mul, 3 div (kern::BinaryOp's order).
void launch_binary(int op, const View& a, const View& b, const View& out);

// The last launch's error ("" when none): cudaGetLastError's text.
const char* last_launch_error();

}  // namespace toy::cuda
