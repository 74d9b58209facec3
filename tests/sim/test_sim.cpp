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
#include "toy/autograd/backward.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/vit.h"
#include "toy/infer/sampler.h"
#include "toy/nn/kv_cache.h"
#include "toy/train/loop.h"
#include "toy/train/step.h"

using namespace toy;
using namespace toy::test;

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

// Training steps of a small GPT on sim (2 micro-batches each): the same losses, gradient norms
// and weights as the CPU's, bit for bit, with one read back per step.
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
      StepResult r = train_step(m, opt, s, data, drop, step, 2, 1.0, 1e-2f);
      losses.push_back(r.loss);
      losses.push_back(r.grad_norm);
    }
    if (d == Device::SIM) {
      for (const Param& p : m.params().all()) {
        EXPECT_EQ(p.value.device(), Device::SIM) << p.name;
        EXPECT_EQ(p.m.device(), Device::SIM) << p.name;
      }
      // One read per step: the micro-batches' losses and the gradients' squared norms together
      // (ids and targets are checked on the host before their upload: three per micro-batch,
      // with the positions).
      EXPECT_EQ(device_traffic().reads, 3);
      EXPECT_EQ(device_traffic().writes, 3 * 2 * 3);
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

// Dropout addressed by a step held on the device (a training loop's StepClock): the masks of
// the host-addressed generator at that step, forward and backward, with nothing read back;
// advancing the clock on the device moves to the next step's masks. Such a generator does
// not draw on the host.
TEST(Sim, DropoutCountersStartAtTheStepOnTheDevice) {
  Generator init(7, 1), gen(11, 3);
  const Tensor host_x = randn(Shape{3, 37}, init);
  StepClock clock;
  clock.at(5, Device::SIM);
  for (int64_t step : {5, 6}) {
    if (step == 6) clock.advance();
    Generator on_device = gen.for_micro_batch(clock.tensor(), 1), on_host = gen.for_micro_batch(step, 1);
    Tensor xs = transfer(host_x, Device::SIM).requires_grad_(), xc = host_x.detach().requires_grad_();
    reset_device_traffic();
    Tensor a1 = dropout(xs, 0.4f, true, on_device), a2 = dropout(xs, 0.4f, true, on_device);
    backward(sum(add(a1, mul(a2, a2))));
    EXPECT_EQ(device_traffic().reads, 0);
    Tensor b1 = dropout(xc, 0.4f, true, on_host), b2 = dropout(xc, 0.4f, true, on_host);
    backward(sum(add(b1, mul(b2, b2))));
    EXPECT_EQ(a1.to_f32_vector(), b1.to_f32_vector()) << "step " << step;
    EXPECT_EQ(a2.to_f32_vector(), b2.to_f32_vector()) << "step " << step;
    EXPECT_NE(a1.to_f32_vector(), a2.to_f32_vector());
    EXPECT_EQ(xs.grad().to_f32_vector(), xc.grad().to_f32_vector()) << "step " << step;
    EXPECT_NE(error_of([&] { on_device.block(0); }).find("draws in kernels"), std::string::npos);
  }
  EXPECT_EQ(clock.tensor().item(), 6.0);
  Tensor on_cpu = host_x.detach();
  Generator elsewhere = gen.for_micro_batch(clock.tensor(), 0);
  EXPECT_NE(error_of([&] { dropout(on_cpu, 0.5f, true, elsewhere); }).find("[dropout]"), std::string::npos);
}

// A ViT step on sim: the same loss and weights as the CPU's.
TEST(Sim, AVitStepIsBitIdenticalToTheCpus) {
  VitConfig c = VitConfig::from_preset("vit-mnist");
  c.image = 8, c.patch = 4, c.channels = 1, c.dim = 16, c.layers = 1, c.heads = 2, c.mlp = 32, c.classes = 3;
  c.class_names = {"a", "b", "c"};
  c.mean = {0.5f}, c.std = {0.25f};
  std::vector<uint8_t> px(4 * 64);
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i * 37) % 251);
  auto run = [&](Device d) {
    Vit m(c);
    m.init(2);
    m.params().move_to(d);
    AdamW opt(m.params(), {0.9f, 0.999f, 1e-8f, 0.05f});
    std::vector<double> out;
    for (int step = 0; step < 2; ++step) {
      Tensor loss = classification_loss(m.logits(m.input(px.data(), 4)), from_vector(std::vector<int32_t>{0, 1, 2, 1},
                                        Shape{4}), 0.1f);
      out.push_back(loss.item());
      backward(loss);
      out.push_back(clip_grad_norm(m.params(), 1.0));
      opt.step(1e-3f);
      m.params().zero_grad();
    }
    for (const Tensor& p : m.params().values())
      for (float v : p.to_f32_vector()) out.push_back(v);
    return out;
  };
  EXPECT_EQ(run(Device::SIM), run(Device::CPU));
}

// Greedy generation on sim: the CPU's tokens, and one read back per generated token (the
// token id; the logits stay on the device).
// Greedy and sampled decoding (temperature, top-k, top-p, min-p, penalties): the sampler's
// chain runs on the device and only the token comes back.
TEST(Sim, GreedyDecodingReadsOnlyTheTokenIdPerToken) {
  ModelConfig mc = ModelConfig::from_preset("llama");
  mc.vocab = 40, mc.layers = 2, mc.heads = 2, mc.kv_heads = 1, mc.dim = 16, mc.ctx = 64;
  mc.resolve();
  SamplerConfig sampled;
  sampled.temperature = 1.5f, sampled.top_k = 30, sampled.top_p = 0.95f, sampled.min_p = 0.01f;
  sampled.repeat_penalty = 1.2f, sampled.presence_penalty = 0.2f, sampled.frequency_penalty = 0.1f;
  sampled.penalty_last_n = 8;
  SamplerConfig chain = {0.0f, 0, 1.0f};
  auto run = [&](Device d, int64_t* reads) {
    DecoderLM m(mc);
    m.init(9);
    m.params().move_to(d);
    NoGradGuard ng;
    Sampler greedy(chain, 1);
    nn::KVCache cache = m.new_cache(1, 64);
    std::vector<int32_t> history = {1, 5, 7};
    Tensor logits = m.decode(cache, history);
    reset_device_traffic();
    for (int i = 0; i < 12; ++i) {
      history.push_back(greedy.sample(logits, history));
      logits = m.decode(cache, history.back());
    }
    *reads = device_traffic().reads;
    return history;
  };
  for (const SamplerConfig& c : {chain, sampled}) {
    chain = c;
    int64_t cpu_reads = 0, sim_reads = 0;
    const std::vector<int32_t> cpu = run(Device::CPU, &cpu_reads), sim = run(Device::SIM, &sim_reads);
    EXPECT_EQ(sim, cpu);
    EXPECT_EQ(cpu_reads, 0);
    EXPECT_EQ(sim_reads, 12) << "one read per generated token";
    if (c.temperature > 0) {  // the draws did draw: not the greedy tokens
      chain = {0.0f, 0, 1.0f};
      int64_t r = 0;
      EXPECT_NE(run(Device::CPU, &r), cpu);
    }
  }
}

// Once warm, a training step and a decoded token take no memory from the system: every block
// comes from the caching allocators (the device's and the host's), which is what a device
// with expensive allocation needs.
TEST(Sim, WarmStepsAndTokensAllocateNothingFromTheSystem) {
  std::vector<int32_t> toks(400);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 7 + i / 13) % 20);
  ModelConfig mc = ModelConfig::from_preset("gpt");
  mc.vocab = 20, mc.layers = 2, mc.heads = 2, mc.kv_heads = 2, mc.dim = 16, mc.ctx = 8;
  DecoderLM m(mc);
  m.init(3);
  m.params().move_to(Device::SIM);
  AdamW opt(m.params(), {0.9f, 0.99f, 1e-8f, 0.1f});
  BatchSampler s(&toks, mc.ctx, 4, "training");
  Generator data(5, 1), drop(5, 2);
  for (int i = 0; i < 2; ++i) train_step(m, opt, s, data, drop, i, 2, 1.0, 1e-2f);  // warm-up
  const int64_t sim0 = allocator(Device::SIM).stats().system_allocs, cpu0 = allocator(Device::CPU).stats().system_allocs;
  for (int i = 2; i < 5; ++i) train_step(m, opt, s, data, drop, i, 2, 1.0, 1e-2f);
  EXPECT_EQ(allocator(Device::SIM).stats().system_allocs, sim0) << "training steps";
  EXPECT_EQ(allocator(Device::CPU).stats().system_allocs, cpu0) << "training steps (host side)";

  NoGradGuard ng;
  Sampler greedy({0.0f, 0, 1.0f}, 1);
  nn::KVCache cache = m.new_cache(1, 8);
  std::vector<int32_t> history = {1, 2};
  Tensor logits = m.decode(cache, history);
  for (int i = 0; i < 2; ++i) {  // warm-up
    history.push_back(greedy.sample(logits, history));
    logits = m.decode(cache, history.back());
  }
  const int64_t sim1 = allocator(Device::SIM).stats().system_allocs, cpu1 = allocator(Device::CPU).stats().system_allocs;
  for (int i = 0; i < 3; ++i) {
    history.push_back(greedy.sample(logits, history));
    logits = m.decode(cache, history.back());
  }
  EXPECT_EQ(allocator(Device::SIM).stats().system_allocs, sim1) << "decoded tokens";
  EXPECT_EQ(allocator(Device::CPU).stats().system_allocs, cpu1) << "decoded tokens (host side)";
}

TEST(Sim, AChunkedLossReadsNothingBack) {
  // Past ~4M logits the loss runs in chunks; the count of counted targets comes from the host
  // copy of the targets, so a device run reads nothing back for it, and gives the CPU's bits.
  ModelConfig mc = ModelConfig::from_preset("llama");
  mc.vocab = 4200, mc.layers = 1, mc.heads = 2, mc.kv_heads = 1, mc.dim = 16, mc.ctx = 64;
  std::vector<int32_t> ids(16 * 64), targets(16 * 64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 37 % 4200), targets[i] = i % 5 ? int32_t(i * 11 % 4200) : -100;
  const Tensor x = from_vector(ids, Shape{16, 64}), y = from_vector(targets, Shape{16, 64});
  auto loss_on = [&](Device d, int64_t* reads) {
    DecoderLM m(mc);
    m.init(7);
    m.params().move_to(d);
    NoGradGuard ng;
    reset_device_traffic();
    Tensor l = m.loss(x, y);
    *reads = device_traffic().reads;
    return l.item();
  };
  int64_t cpu_reads = 0, sim_reads = 0;
  const double on_cpu = loss_on(Device::CPU, &cpu_reads), on_sim = loss_on(Device::SIM, &sim_reads);
  EXPECT_EQ(sim_reads, 0);
  EXPECT_EQ(on_sim, on_cpu);
}

TEST(Sim, IdsTheHostWritesIntoAgainAreCheckedAgain) {
  // The check made before an upload marks the device copy, not the caller's host tensor: a
  // batch buffer the host refills is checked on its next upload (no stale "checked" mark).
  ModelConfig mc = ModelConfig::from_preset("llama");
  mc.vocab = 20, mc.layers = 1, mc.heads = 2, mc.kv_heads = 1, mc.dim = 16, mc.ctx = 8;
  DecoderLM m(mc);
  m.init(2);
  m.params().move_to(Device::SIM);
  NoGradGuard ng;
  Tensor ids = from_vector(std::vector<int32_t>{1, 2, 3}, Shape{1, 3});
  EXPECT_EQ(m.hidden(ids).device(), Device::SIM);
  ids.data<int32_t>()[1] = 5000;
  const std::string e = error_of([&] { m.hidden(ids); });
  EXPECT_NE(e.find("[model] ids [1] = 5000 is out of range [0, 20)"), std::string::npos) << e;
}
