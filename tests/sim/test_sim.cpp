// The sim device (core/device.h): host memory that host code may not touch. Runs on it must
// give the CPU's results bit for bit (the same kernels), with every crossing of the
// host/device line a counted transfer.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "helpers.h"
#include "toy/core/allocator.h"
#include "toy/core/device_access.h"
#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"
#include "toy/train/loop.h"
#include "toy/train/step.h"

using namespace toy;
using namespace toy::test;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Sim, HostCodeCannotTouchSimMemoryOutsideAKernel) {
  Tensor a = to(from_vector(std::vector<float>{1, 2, 3}, Shape{3}), Device::SIM);
  EXPECT_EQ(a.device(), Device::SIM);
  const std::string e = error_of([&] { (void)a.data<float>(); });
  EXPECT_NE(e.find("sim tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("host/device line"), std::string::npos) << e;
  // Kernels may; the result is read back through a counted transfer.
  reset_device_traffic();
  Tensor b = mul(a, a);
  EXPECT_EQ(b.device(), Device::SIM);
  EXPECT_EQ(b.to_f32_vector(), (std::vector<float>{1, 4, 9}));
  EXPECT_EQ(device_traffic().reads, 1);
  EXPECT_EQ(device_traffic().read_bytes, 12);
  // Factories run on the device.
  Tensor z = full(Shape{2}, 5.0, DType::F32, Device::SIM);
  EXPECT_EQ(z.device(), Device::SIM);
  EXPECT_EQ(z.to_f32_vector(), (std::vector<float>{5, 5}));
}

// A training step of a small GPT on sim: the same loss, gradient norm and weights as the CPU's,
// bit for bit.
TEST(Sim, ATrainingStepIsBitIdenticalToTheCpus) {
  std::vector<int32_t> toks(400);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 7 + i / 13) % 20);
  ModelConfig mc = ModelConfig::from_preset("gpt");
  mc.vocab = 20, mc.layers = 2, mc.heads = 2, mc.kv_heads = 2, mc.dim = 16, mc.ctx = 8;
  auto run = [&](Device d) {
    DecoderLM m(mc);
    m.init(3);
    m.params().move_to(d);
    AdamW opt(m.params(), {0.9f, 0.99f, 1e-8f, 0.1f});
    BatchSampler s(&toks, mc.ctx, 4, "training");
    Generator data(5, 1), drop(5, 2);
    std::vector<double> losses;
    reset_device_traffic();
    for (int step = 0; step < 3; ++step) {
      StepResult r = train_step(m, opt, s, data, drop, 2, 1.0, 1e-2f);
      losses.push_back(r.loss);
      losses.push_back(r.grad_norm);
    }
    if (d == Device::SIM) {
      for (const Param& p : m.params().all()) {
        EXPECT_EQ(p.value.device(), Device::SIM) << p.name;
        EXPECT_EQ(p.m.device(), Device::SIM) << p.name;
      }
      std::printf("sim: %lld reads, %lld writes in 3 steps of 2 micro-batches\n", (long long)device_traffic().reads,
                  (long long)device_traffic().writes);
      EXPECT_GT(device_traffic().reads, 0) << "every read back is counted";
    } else {
      EXPECT_EQ(device_traffic().reads, 0) << "nothing crosses a line on the CPU";
    }
    std::vector<std::vector<float>> w;
    for (const Tensor& p : m.params().values()) w.push_back(p.to_f32_vector());
    return std::make_pair(losses, w);
  };
  const auto cpu = run(Device::CPU);
  const auto sim = run(Device::SIM);
  EXPECT_EQ(sim.first, cpu.first);
  ASSERT_EQ(sim.second.size(), cpu.second.size());
  for (size_t i = 0; i < cpu.second.size(); ++i) EXPECT_EQ(sim.second[i], cpu.second[i]) << "parameter " << i;
}
