// Unary ops and their backward, swiglu (both forms), dropout, random fills and arange. Each
// thread takes elements of the row-major order in a grid-stride loop (inputs at offset_of,
// any strides; outputs contiguous) and applies the per-element math of unary_math.h, the same
// functions the host test checks against the CPU. The random kernels give one thread per
// Philox block (4 words: 4 uniforms, 2 normals or 4 dropout decisions), so element i gets the
// bits the CPU gives it whichever thread computes it.
#include "toy/backend/cuda/device_view.cuh"
#include "toy/backend/cuda/unary_launch.h"
#include "toy/backend/cuda/unary_math.h"

namespace toy::cuda {

namespace {

using umath::Op;
using umath::Params;

__device__ __forceinline__ int64_t first_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

// Calls f with a value of the C++ type of a float element type (the glue refuses others).
template <class F>
void with_float_type(Elem e, F&& f) {
  with_type(e, [&](auto t) {
    if constexpr (!std::is_same_v<decltype(t), int32_t>) f(t);
  });
}

// ---- unary ---------------------------------------------------------------------------------------

template <class T>
__global__ void unary_kernel(Op op, Params a, DeviceView x, DeviceView y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_step())
    store_f<T>(y, i, umath::unary_forward(op, load_f<T>(x, offset_of(x, i)), a));
}

template <class T>
__global__ void unary_backward_kernel(Op op, Params a, DeviceView x, DeviceView y, DeviceView g, DeviceView dx,
                                      int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    const float xv = load_f<T>(x, offset_of(x, i)), yv = load_f<T>(y, offset_of(y, i));
    store_f<T>(dx, i, umath::unary_backward(op, xv, yv, load_f<T>(g, offset_of(g, i)), a));
  }
}

// ---- swiglu --------------------------------------------------------------------------------------

template <class T>
__global__ void swiglu_kernel(DeviceView a, DeviceView b, DeviceView out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_step())
    store_f<T>(out, i, umath::swiglu_forward(load_f<T>(a, offset_of(a, i)), load_f<T>(b, offset_of(b, i))));
}

template <class T>
__global__ void swiglu_backward_kernel(DeviceView a, DeviceView b, DeviceView g, DeviceView da, DeviceView db,
                                       int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    const umath::SwigluGrads d = umath::swiglu_backward(load_f<T>(a, offset_of(a, i)), load_f<T>(b, offset_of(b, i)),
                                                        load_f<T>(g, offset_of(g, i)));
    store_f<T>(da, i, d.da);
    store_f<T>(db, i, d.db);
  }
}

// Output element i = (row r, column j) reads x at r 2F + j (gate) and r 2F + F + j (up).
template <class T>
__global__ void swiglu_packed_kernel(DeviceView x, DeviceView out, int64_t n, int64_t F) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    const int64_t gate = (i / F) * 2 * F + i % F;
    const float a = load_f<T>(x, offset_of(x, gate)), b = load_f<T>(x, offset_of(x, gate + F));
    store_f<T>(out, i, umath::swiglu_forward(a, b));
  }
}

template <class T>
__global__ void swiglu_packed_backward_kernel(DeviceView x, DeviceView g, DeviceView dx, int64_t n, int64_t F) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    const int64_t gate = (i / F) * 2 * F + i % F;
    const float a = load_f<T>(x, offset_of(x, gate)), b = load_f<T>(x, offset_of(x, gate + F));
    const umath::SwigluGrads d = umath::swiglu_backward(a, b, load_f<T>(g, offset_of(g, i)));
    store_f<T>(dx, gate, d.da);
    store_f<T>(dx, gate + F, d.db);
  }
}

// ---- random --------------------------------------------------------------------------------------

// One thread per Philox block of 4 elements; the step (when given) is read here, on the device.
template <class T>
__global__ void dropout_kernel(DeviceView x, DeviceView y, int64_t n, uint32_t threshold, float scale,
                               PhiloxArgs rng, const int32_t* step) {
  const uint64_t counter = umath::dropout_counter(rng.counter, step != nullptr, step ? *step : 0);
  const int64_t blocks = (n + 3) / 4;
  for (int64_t blk = first_index(); blk < blocks; blk += grid_step()) {
    const umath::Philox4 u = umath::philox4x32(rng.seed, rng.stream, counter + uint64_t(blk));
    for (int j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j;
      if (i >= n) break;
      store_f<T>(y, i, umath::dropout_element(load_f<T>(x, offset_of(x, i)), u.w[j], threshold, scale));
    }
  }
}

template <class T>
__global__ void random_fill_kernel(DeviceView dst, int64_t n, PhiloxArgs rng, bool normal, float a, float b) {
  const int per = normal ? 2 : 4;
  const int64_t blocks = (n + per - 1) / per;
  for (int64_t blk = first_index(); blk < blocks; blk += grid_step()) {
    const umath::Philox4 u = umath::philox4x32(rng.seed, rng.stream, rng.counter + uint64_t(blk));
    for (int j = 0; j < per; ++j) {
      const int64_t i = blk * per + j;
      if (i >= n) break;
      store_f<T>(dst, i, umath::random_element(u, i, normal, a, b));
    }
  }
}

template <class T>
__global__ void arange_kernel(T* dst, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    if constexpr (std::is_same_v<T, int32_t>)
      dst[i] = int32_t(i);
    else
      dst[i] = elem_of<T>(float(i));
  }
}

}  // namespace

void launch_unary(int op, float alpha, float lo, float hi, const View& x, const View& y) {
  if (y.numel == 0) return;
  const Params a{alpha, lo, hi};
  with_float_type(x.elem, [&](auto t) {
    unary_kernel<decltype(t)><<<blocks_for(y.numel), kThreads, 0, stream()>>>(Op(op), a, device_view(x),
                                                                              device_view(y), y.numel);
  });
}

void launch_unary_backward(int op, float alpha, float lo, float hi, const View& x, const View& y, const View& g,
                           const View& dx) {
  if (dx.numel == 0) return;
  const Params a{alpha, lo, hi};
  with_float_type(x.elem, [&](auto t) {
    unary_backward_kernel<decltype(t)><<<blocks_for(dx.numel), kThreads, 0, stream()>>>(
        Op(op), a, device_view(x), device_view(y), device_view(g), device_view(dx), dx.numel);
  });
}

void launch_swiglu(const View& a, const View& b, const View& out) {
  if (out.numel == 0) return;
  with_float_type(a.elem, [&](auto t) {
    swiglu_kernel<decltype(t)><<<blocks_for(out.numel), kThreads, 0, stream()>>>(device_view(a), device_view(b),
                                                                                 device_view(out), out.numel);
  });
}

void launch_swiglu_backward(const View& a, const View& b, const View& g, const View& da, const View& db) {
  if (da.numel == 0) return;
  with_float_type(a.elem, [&](auto t) {
    swiglu_backward_kernel<decltype(t)><<<blocks_for(da.numel), kThreads, 0, stream()>>>(
        device_view(a), device_view(b), device_view(g), device_view(da), device_view(db), da.numel);
  });
}

void launch_swiglu_packed(const View& x, const View& out, int64_t F) {
  if (out.numel == 0 || F == 0) return;
  with_float_type(x.elem, [&](auto t) {
    swiglu_packed_kernel<decltype(t)><<<blocks_for(out.numel), kThreads, 0, stream()>>>(
        device_view(x), device_view(out), out.numel, F);
  });
}

void launch_swiglu_packed_backward(const View& x, const View& g, const View& dx, int64_t F) {
  if (g.numel == 0 || F == 0) return;
  with_float_type(x.elem, [&](auto t) {
    swiglu_packed_backward_kernel<decltype(t)><<<blocks_for(g.numel), kThreads, 0, stream()>>>(
        device_view(x), device_view(g), device_view(dx), g.numel, F);
  });
}

void launch_dropout(const View& x, const View& y, float p, const PhiloxArgs& rng, const int32_t* step) {
  if (y.numel == 0) return;
  const uint32_t threshold = umath::dropout_threshold(p);
  const float scale = umath::dropout_scale(p);
  with_float_type(x.elem, [&](auto t) {
    dropout_kernel<decltype(t)><<<blocks_for((y.numel + 3) / 4), kThreads, 0, stream()>>>(
        device_view(x), device_view(y), y.numel, threshold, scale, rng, step);
  });
}

void launch_random_fill(const View& dst, const PhiloxArgs& rng, bool normal, float a, float b) {
  if (dst.numel == 0) return;
  const int64_t per = normal ? 2 : 4;
  with_float_type(dst.elem, [&](auto t) {
    random_fill_kernel<decltype(t)><<<blocks_for((dst.numel + per - 1) / per), kThreads, 0, stream()>>>(
        device_view(dst), dst.numel, rng, normal, a, b);
  });
}

void launch_arange(const View& dst) {
  if (dst.numel == 0) return;
  with_type(dst.elem, [&](auto t) {
    using T = decltype(t);
    arange_kernel<T><<<blocks_for(dst.numel), kThreads, 0, stream()>>>(static_cast<T*>(dst.data), dst.numel);
  });
}

}  // namespace toy::cuda
