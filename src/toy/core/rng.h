// Counter-based RNG (Philox4x32-10): random numbers are a pure function of
// (seed, stream, counter), so init and dropout give the same numbers for any thread count,
// and a GPU kernel can reproduce them. A Generator hands out counter ranges; element i of a
// draw uses counter (base + i / per_block) whichever thread computes it.
#pragma once
#include <array>
#include <utility>
#include <vector>
#include <cstdint>

#include "toy/core/device.h"
#include "toy/core/shape.h"

namespace toy {

class Tensor;

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// Uniform in [0, 1) from 24 random bits.
inline float uniform01(uint32_t u) { return float(u >> 8) * (1.0f / 16777216.0f); }

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t o) { offset_ = o; }
  // Reserves n counters and returns the first.
  uint64_t reserve(uint64_t n) {
    uint64_t o = offset_;
    offset_ += n;
    return o;
  }
  std::array<uint32_t, 4> block(uint64_t counter) const {
    if (device_step_) refuse_host_draw();
    return philox4x32(seed_, stream_, counter);
  }
  // The generator micro-batch `micro` of step `step` draws from (its batch, its dropout
  // masks): stream + micro * 2^32, counters from step * 2^32. A pure function of (seed,
  // stream, step, micro): whichever process runs that micro-batch, in whatever order, draws
  // the same numbers; each has 2^32 counters (2^34 values) of its own. Steps and
  // micro-batches count below 2^32.
  Generator for_micro_batch(int64_t step, int64_t micro) const;
  // The same numbers with the step read on the device: `device_step` is an I32 scalar holding
  // the step (a training loop's StepClock, advanced by a kernel), and kernels that draw
  // (dropout) start their counters at device_step * 2^32 + offset(); the offsets this
  // generator hands out count from 0. Nothing of the step is baked into a launch, as a
  // captured graph needs. Such a generator cannot draw on the host (block() throws): the
  // host does not know the step without reading it back. `device_step` must outlive it.
  Generator for_micro_batch(const Tensor& device_step, int64_t micro) const;
  // The device scalar the counters start from (nullptr: offsets are absolute).
  const Tensor* device_step() const { return device_step_; }

 private:
  [[noreturn]] void refuse_host_draw() const;
  uint64_t seed_, stream_;
  uint64_t offset_ = 0;
  const Tensor* device_step_ = nullptr;
};

// The process-wide generator used when no generator is passed.
Generator& default_generator();
void manual_seed(uint64_t seed);

// Fills (F32/F16/BF16) tensors; element i depends only on the generator state and i. They run
// as kernels on the tensor's device (random_fill): the same numbers on every device.
Tensor randn(const Shape& shape, Generator& gen, float mean = 0.0f, float std = 1.0f, Device device = Device::CPU);
Tensor rand(const Shape& shape, Generator& gen, float lo = 0.0f, float hi = 1.0f, Device device = Device::CPU);
void fill_normal_(Tensor& t, Generator& gen, float mean, float std);
void fill_uniform_(Tensor& t, Generator& gen, float lo, float hi);

// A seeded Fisher-Yates shuffle: one Philox block per draw, so the order depends only on the
// generator's seed, stream and position.
template <class T>
void shuffle(std::vector<T>& v, Generator& gen) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(gen.block(gen.reserve(1))[0] % i)]);
}

}  // namespace toy
