#include "toy/core/rng.h"

#include <cmath>

#include "toy/core/error.h"
#include "toy/core/tensor.h"
#include "toy/backend/kernels.h"
#include "toy/core/registry.h"

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
const KernelRef<kern::RandomFill> k_random_fill("random_fill");

void fill_random(Tensor& t, Generator& gen, bool normal, float a, float b) {
  TOY_CHECK(is_float(t.dtype()) && t.is_contiguous(), "[random_fill] needs a contiguous float tensor, got {}",
            describe(t));
  TOY_CHECK(!gen.device_step(), "[random_fill] the generator's counters start at a step held on the device; "
            "random fills take a host-addressed generator");
  const uint64_t per_block = normal ? 2 : 4;
  kern::RandomFillArgs args{gen.seed(), gen.stream(), gen.reserve((uint64_t(t.numel()) + per_block - 1) / per_block),
                            normal, a, b};
  k_random_fill(t.device())(t, args);
}
}  // namespace

void fill_normal_(Tensor& t, Generator& gen, float mean, float std) { fill_random(t, gen, true, mean, std); }
void fill_uniform_(Tensor& t, Generator& gen, float lo, float hi) { fill_random(t, gen, false, lo, hi); }

Tensor randn(const Shape& shape, Generator& gen, float mean, float std, Device device) {
  Tensor t = empty(shape, DType::F32, device);
  fill_normal_(t, gen, mean, std);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, float lo, float hi, Device device) {
  Tensor t = empty(shape, DType::F32, device);
  fill_uniform_(t, gen, lo, hi);
  return t;
}

}  // namespace toy
