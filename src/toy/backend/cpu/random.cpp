// Random fills and arange: element i is a pure function of the arguments and i (Philox's
// counter i / per), so any thread split gives the same tensor. Compiled baseline (no -mfma:
// CMakeLists.txt), so Box-Muller's a + b * ... is never contracted into an FMA: model init
// draws the same bits on every CPU.
#include <cmath>

#include "toy/backend/cpu/cpu_kernels.h"
#include "toy/backend/cpu/dispatch.h"
#include "toy/core/rng.h"
#include "toy/core/thread_pool.h"

namespace toy::cpu {

void random_fill(Tensor& t, const kern::RandomFillArgs& a) {
  dispatch_float(t.dtype(), "random_fill", [&]<class T>(std::type_identity<T>) {
    T* d = t.data<T>();
    const uint64_t per = a.normal ? 2 : 4;
    parallel_for(0, t.numel(), 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const auto u = philox4x32(a.seed, a.stream, a.counter + uint64_t(i) / per);
        float v;
        if (a.normal) {
          const int w = int(i % 2) * 2;
          // Box-Muller; u1 in (0, 1] keeps the log finite.
          const float u1 = (float(u[w] >> 8) + 1.0f) * (1.0f / 16777216.0f);
          const float u2 = uniform01(u[w + 1]);
          v = a.a + a.b * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
        } else {
          v = a.a + (a.b - a.a) * uniform01(u[i % 4]);
        }
        d[i] = from_f32<T>(v);
      }
    });
  });
}

void arange(Tensor& t) {
  if (t.dtype() == DType::I32) {
    int32_t* d = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = int32_t(i);
    return;
  }
  dispatch_float(t.dtype(), "arange", [&]<class T>(std::type_identity<T>) {
    T* d = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = from_f32<T>(float(i));
  });
}

}  // namespace toy::cpu
