#include "toy/core/rng.h"

#include <cmath>

#include "toy/core/error.h"
#include "toy/core/tensor.h"
#include "toy/core/thread_pool.h"

namespace toy {

Generator Generator::for_micro_batch(int64_t step, int64_t micro) const {
  TOY_CHECK(step >= 0 && micro >= 0 && step < (int64_t(1) << 32) && micro < (int64_t(1) << 32),
            "[rng] micro-batch {} of step {}: both must be in [0, 2^32)", micro, step);
  Generator g(seed_, stream_ + (uint64_t(micro) << 32));
  g.set_offset(uint64_t(step) << 32);
  return g;
}

Generator Generator::for_micro_batch(const Tensor& device_step, int64_t micro) const {
  TOY_CHECK(micro >= 0 && micro < (int64_t(1) << 32), "[rng] micro-batch {} must be in [0, 2^32)", micro);
  TOY_CHECK(device_step.dtype() == DType::I32 && device_step.numel() == 1,
            "[rng] a device step must be an I32 scalar, got {}", describe(device_step));
  Generator g(seed_, stream_ + (uint64_t(micro) << 32));
  g.device_step_ = &device_step;
  return g;
}

void Generator::refuse_host_draw() const {
  fail("[rng] this generator's counters start at a step held on the device: it draws in kernels (dropout), not on "
       "the host");
}

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32);
  uint32_t c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = uint32_t(p1);
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = uint32_t(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

Generator& default_generator() {
  static Generator g(0x5eed);
  return g;
}

void manual_seed(uint64_t seed) { default_generator() = Generator(seed); }

namespace {
template <class Store>
void fill_with(Tensor& t, Store store, uint64_t per_block, Generator& gen, bool normal, float a, float b) {
  TOY_CHECK(is_float(t.dtype()) && t.is_contiguous(), "[rng] fill needs a contiguous float tensor, got {}",
            describe(t));
  const int64_t n = t.numel();
  const uint64_t base = gen.reserve((uint64_t(n) + per_block - 1) / per_block);
  parallel_for(0, n, 16384, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      auto u = gen.block(base + uint64_t(i) / per_block);
      float v;
      if (normal) {
        int w = int(i % 2) * 2;
        // Box-Muller; u1 in (0, 1] keeps the log finite.
        float u1 = (float(u[w] >> 8) + 1.0f) * (1.0f / 16777216.0f);
        float u2 = uniform01(u[w + 1]);
        v = a + b * std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
      } else {
        v = a + (b - a) * uniform01(u[i % 4]);
      }
      store(i, v);
    }
  });
}

void fill_any(Tensor& t, Generator& gen, bool normal, float a, float b) {
  uint64_t per = normal ? 2 : 4;
  switch (t.dtype()) {
    case DType::F32: {
      float* d = t.data<float>();
      fill_with(t, [d](int64_t i, float v) { d[i] = v; }, per, gen, normal, a, b);
      break;
    }
    case DType::F16: {
      f16* d = t.data<f16>();
      fill_with(t, [d](int64_t i, float v) { d[i] = from_f32<f16>(v); }, per, gen, normal, a, b);
      break;
    }
    case DType::BF16: {
      bf16* d = t.data<bf16>();
      fill_with(t, [d](int64_t i, float v) { d[i] = from_f32<bf16>(v); }, per, gen, normal, a, b);
      break;
    }
    default: fail("[rng] cannot fill a {} tensor", name(t.dtype()));
  }
}
}  // namespace

void fill_normal_(Tensor& t, Generator& gen, float mean, float std) { fill_any(t, gen, true, mean, std); }
void fill_uniform_(Tensor& t, Generator& gen, float lo, float hi) { fill_any(t, gen, false, lo, hi); }

Tensor randn(const Shape& shape, Generator& gen, float mean, float std) {
  Tensor t = empty(shape);
  fill_normal_(t, gen, mean, std);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, float lo, float hi) {
  Tensor t = empty(shape);
  fill_uniform_(t, gen, lo, hi);
  return t;
}

}  // namespace toy
