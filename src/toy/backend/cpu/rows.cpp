// Row gather/scatter: get_rows (embedding lookup, dequantizing block tables), its backward
// scatter-add (partitioned by columns, so no two threads touch the same element), set_rows.
#include <algorithm>
#include <cstring>
#include <vector>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/core/quant.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t N = ids.numel(), D = table.size(-1);
  const int32_t* pid = ids.data<int32_t>();
  const int64_t row_stride = table.stride(0);
  if (is_block(table.dtype())) {
    const char* base = static_cast<const char*>(table.raw_data());
    const size_t rb = row_bytes(table.dtype(), D);
    float* po = out.data<float>();
    parallel_for(0, N, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dequantize_row(table.dtype(), base + size_t(pid[i]) * rb, po + i * D, D);
    });
    return;
  }
  dispatch_float(table.dtype(), "get_rows", [&]<class T>(std::type_identity<T>) {
    const T* pt = static_cast<const T*>(table.raw_data());
    T* po = out.data<T>();
    parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(po + i * D, pt + pid[i] * row_stride, size_t(D) * sizeof(T));
    });
  });
}

void scatter_add_rows(const Tensor& g, const Tensor& ids, Tensor& dtable) {
  const int64_t N = ids.numel(), D = dtable.size(-1);
  const int32_t* pid = ids.data<int32_t>();
  dispatch_float(dtable.dtype(), "get_rows_backward", [&]<class T>(std::type_identity<T>) {
    const T* pg = g.data<T>();
    T* pd = dtable.data<T>();
    // Columns are split between threads; rows are added in index order (deterministic).
    parallel_for(0, D, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < N; ++i) {
        T* dr = pd + pid[i] * D;
        const T* gr = pg + i * D;
        for (int64_t c = c0; c < c1; ++c) dr[c] = from_f32<T>(to_f32(dr[c]) + to_f32(gr[c]));
      }
    });
  });
}

void set_rows(Tensor& dst, const Tensor& ids, const Tensor& src) {
  const int64_t N = ids.numel(), D = dst.size(-1);
  const int32_t* pid = ids.data<int32_t>();
  for (int64_t i = 0; i < N; ++i) {
    Tensor drow = make_view(dst, Shape{D}, Strides{dst.stride(-1)}, dst.offset() + pid[i] * dst.stride(0));
    Tensor srow = make_view(src, Shape{D}, Strides{src.stride(-1)}, src.offset() + i * src.stride(0));
    copy(srow, drow);
  }
}

}  // namespace toy::cpu
