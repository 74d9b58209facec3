// The flat parameter arena (ParamStore::pack): trainable values, gradients and AdamW's
// moments in four contiguous buffers in parameter order, each parameter a view; backward
// accumulating into it; AdamW updating it in one kernel call with the bits the
// per-parameter update gives; unpacking on a change of the store; moving with the weights.
// And the in-place ops the arena uses (add_, scale_).
#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "helpers.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/device_access.h"
#include "toy/core/trace.h"
#include "toy/nn/params.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"
#include "toy/train/step_clock.h"

using namespace toy;
using namespace toy::test;

namespace {

std::vector<float> counting(int64_t n, float start, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + step * float(i);
  return v;
}

// a [2, 3] (a matrix: decayed), b [4] frozen, c [5] (a vector: not decayed), d [3, 3].
void fill_store(ParamStore& ps) {
  ps.add("a", from_vector(counting(6, 0.5f, 0.25f), Shape{2, 3}));
  ps.add("b", from_vector(counting(4, -1.0f, 0.5f), Shape{4}), false);
  ps.add("c", from_vector(counting(5, 2.0f, -0.3f), Shape{5}));
  ps.add("d", from_vector(counting(9, -0.7f, 0.11f), Shape{3, 3}));
}

bool shares_storage(const Tensor& t, const Tensor& buffer) { return t.storage() == buffer.storage(); }

}  // namespace

TEST(ParamArena, PackLaysTheTrainableParametersOutInOrderAsViews) {
  ParamStore ps;
  fill_store(ps);
  Tensor module_handle = ps.all()[2].compute;  // what a module bound to c holds
  const std::vector<float> c_before = ps.get("c").to_f32_vector();
  EXPECT_EQ(ps.arena(), nullptr);
  ps.pack();
  const ParamArena* a = ps.arena();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->numel(), 6 + 5 + 9);
  EXPECT_EQ(ps.record("a").arena_offset, 0);
  EXPECT_EQ(ps.record("b").arena_offset, -1);
  EXPECT_EQ(ps.record("c").arena_offset, 6);
  EXPECT_EQ(ps.record("d").arena_offset, 11);
  for (const char* n : {"a", "c", "d"}) {
    const Param& p = ps.record(n);
    EXPECT_TRUE(shares_storage(p.value, a->values)) << n;
    EXPECT_TRUE(shares_storage(p.m, a->m)) << n;
    EXPECT_TRUE(shares_storage(p.v, a->v)) << n;
    EXPECT_TRUE(shares_storage(p.value.grad_home(), a->grads)) << n;
    EXPECT_EQ(p.value.offset(), a->values.offset() + p.arena_offset) << n;
  }
  EXPECT_FALSE(shares_storage(ps.get("b"), a->values));
  EXPECT_EQ(ps.get("c").to_f32_vector(), c_before);
  // The module's handle is the parameter's: it sees the arena.
  NoGradGuard ng;
  Tensor values = a->values;
  fill_(values, 3.0);
  EXPECT_EQ(module_handle.to_f32_vector(), std::vector<float>(5, 3.0f));
}

TEST(ParamArena, BackwardAccumulatesIntoTheArenaWithTheBitsOfFreshGradients) {
  // Two passes (accumulation) of a loss that uses `a` twice; the packed store's gradient is
  // its arena range and equals, bit for bit, the gradient of the same passes unpacked.
  auto passes = [](ParamStore& ps) {
    for (int pass = 0; pass < 2; ++pass) {
      Tensor w = ps.get("a");
      Tensor y = add(mul(w, w), scale(w, 0.5f + float(pass)));
      sum(mul(y, add(reshape(slice(reshape(ps.get("d"), Shape{9}), 0, 0, 6), Shape{2, 3}), w))).backward();
    }
  };
  ParamStore loose, packed;
  fill_store(loose);
  fill_store(packed);
  packed.pack();
  passes(loose);
  passes(packed);
  for (const char* n : {"a", "d"}) {
    Tensor g = packed.get(n).grad();
    ASSERT_TRUE(g.defined()) << n;
    EXPECT_TRUE(g.is_same(packed.get(n).grad_home())) << n;
    EXPECT_EQ(g.to_f32_vector(), loose.get(n).grad().to_f32_vector()) << n;
  }
  EXPECT_FALSE(packed.get("c").grad().defined());  // unused: no gradient, as unpacked
}

TEST(ParamArena, OneAdamWCallGivesThePerParameterUpdatesBits) {
  // AdamW over the arena against adamw_step on each parameter with its own moments; step 2
  // leaves `c` without a gradient (it must not move, nor its moments).
  ParamStore ps, ref;
  fill_store(ps);
  fill_store(ref);
  const AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  AdamW opt(ps, cfg);
  std::vector<Tensor> rm, rv;
  for (const Param& p : ref.all()) rm.push_back(zeros(p.value.shape())), rv.push_back(zeros(p.value.shape()));
  const std::string trace_path =
      (std::filesystem::path(::testing::TempDir()) / ("arena_trace_" + std::to_string(getpid()) + ".json")).string();
  for (int step = 1; step <= 3; ++step) {
    const float lr = 0.01f * float(step);
    for (size_t i = 0; i < ps.size(); ++i) {
      Param& p = ps.all()[i];
      if (!p.trainable || (step == 2 && p.name == "c")) continue;
      const Tensor g = from_vector(counting(p.value.numel(), 0.3f * float(step) - float(i), 0.17f), p.value.shape());
      p.value.set_grad(g);  // set by hand: AdamW copies it into the arena
      ref.all()[i].value.set_grad(g);
    }
    if (step == 3) trace::open(trace_path);
    opt.step(lr);
    if (step == 3) trace::close();
    NoGradGuard ng;
    Tensor lr_t = scalar(lr), step_t = scalar(double(step));
    for (size_t i = 0; i < ref.size(); ++i) {
      Param& p = ref.all()[i];
      if (!p.value.grad().defined()) continue;
      adamw_step(p.value, p.value.grad(), rm[i], rv[i], lr_t, step_t,
                 {cfg.beta1, cfg.beta2, cfg.eps, p.decay ? cfg.weight_decay : 0.0f});
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      const Param& p = ps.all()[i];
      EXPECT_EQ(p.value.to_f32_vector(), ref.all()[i].value.to_f32_vector()) << p.name << " step " << step;
      if (!p.trainable) continue;
      EXPECT_EQ(p.m.to_f32_vector(), rm[i].to_f32_vector()) << p.name << " step " << step;
      EXPECT_EQ(p.v.to_f32_vector(), rv[i].to_f32_vector()) << p.name << " step " << step;
    }
    ps.zero_grad();
    ref.zero_grad();
  }
  // The third step's update was one op call.
  std::ifstream in(trace_path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string t = text.str();
  size_t calls = 0;
  for (size_t at = t.find("\"name\":\"adamw\""); at != std::string::npos; at = t.find("\"name\":\"adamw\"", at + 1))
    ++calls;
  EXPECT_EQ(calls, 1u) << t.substr(0, 400);
  std::filesystem::remove(trace_path);
}

TEST(ParamArena, ClippingScalesTheArenaAsItScaledEachGradient) {
  ParamStore ps, ref;
  fill_store(ps);
  fill_store(ref);
  ps.pack();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps.all()[i].trainable) continue;
    const Tensor g = from_vector(counting(ps.all()[i].value.numel(), 1.5f, 0.75f), ps.all()[i].value.shape());
    ps.all()[i].value.set_grad(g);
    ref.all()[i].value.set_grad(g);
  }
  const double n1 = clip_grad_norm(ps, 0.5), n2 = clip_grad_norm(ref, 0.5);
  EXPECT_EQ(n1, n2);
  for (const char* n : {"a", "c", "d"}) {
    EXPECT_TRUE(ps.get(n).grad().is_same(ps.get(n).grad_home())) << n;
    EXPECT_EQ(ps.get(n).grad().to_f32_vector(), ref.get(n).grad().to_f32_vector()) << n;
  }
}

TEST(ParamArena, AChangeOfTheStoreUnpacksItAndAdamWPacksAgainKeepingTheState) {
  ParamStore ps;
  fill_store(ps);
  AdamW opt(ps, {0.9f, 0.99f, 1e-8f, 0.0f});
  for (const char* n : {"a", "c", "d"}) ps.get(n).set_grad(full(ps.get(n).shape(), 0.25));
  opt.step(0.1f);
  ps.zero_grad();
  ps.set_trainable("c", false);
  EXPECT_EQ(ps.arena(), nullptr);
  EXPECT_EQ(ps.record("a").arena_offset, -1);
  EXPECT_FALSE(ps.get("a").grad_home().defined());
  ps.get("a").set_grad(full(Shape{2, 3}, 0.5));
  opt.step(0.1f);  // packs a and d again
  ASSERT_NE(ps.arena(), nullptr);
  EXPECT_EQ(ps.arena()->numel(), 6 + 9);
  EXPECT_EQ(ps.record("d").arena_offset, 6);
  // a's second update started from its first (value and moments carried into the new arena).
  ParamStore ref;
  fill_store(ref);
  Tensor m = zeros(Shape{2, 3}), v = zeros(Shape{2, 3});
  {
    NoGradGuard ng;
    for (int step = 1; step <= 2; ++step)
      adamw_step(ref.get("a"), full(Shape{2, 3}, 0.25 * step), m, v, scalar(0.1), scalar(double(step)),
                 {0.9f, 0.99f, 1e-8f, 0.0f});
  }
  EXPECT_EQ(ps.get("a").to_f32_vector(), ref.get("a").to_f32_vector());
  EXPECT_EQ(ps.record("a").m.to_f32_vector(), m.to_f32_vector());
}

TEST(ParamArena, MovesToADeviceWholeAndItsViewsFollow) {
  ParamStore ps;
  fill_store(ps);
  ps.pack();
  const std::vector<float> d_before = ps.get("d").to_f32_vector();
  ps.move_to(Device::SIM);
  const ParamArena* a = ps.arena();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->values.device(), Device::SIM);
  for (const char* n : {"a", "c", "d"}) {
    EXPECT_EQ(ps.get(n).device(), Device::SIM) << n;
    EXPECT_TRUE(shares_storage(ps.get(n), a->values)) << n;
    EXPECT_TRUE(shares_storage(ps.record(n).m, a->m)) << n;
    EXPECT_TRUE(shares_storage(ps.get(n).grad_home(), a->grads)) << n;
  }
  EXPECT_EQ(ps.get("b").device(), Device::SIM);
  EXPECT_EQ(ps.get("d").to_f32_vector(), d_before);
}

TEST(InPlaceOps, AddAndScaleGiveTheOutOfPlaceBitsAndRefuseNonsense) {
  Tensor x = from_vector(counting(19, 0.1f, 0.37f), Shape{19});
  Tensor y = from_vector(counting(19, -2.0f, 0.21f), Shape{19});
  const std::vector<float> sum_bits = add(x, y).to_f32_vector(), scaled_bits = scale(x, 0.3f).to_f32_vector();
  Tensor a = contiguous_copy(x);
  add_(a, y);
  EXPECT_EQ(a.to_f32_vector(), sum_bits);
  Tensor b = contiguous_copy(x);
  scale_(b, 0.3f);
  EXPECT_EQ(b.to_f32_vector(), scaled_bits);
  EXPECT_EQ(error_of([&] { add_(a, zeros(Shape{18})); }), "[add_] shapes differ: dst [19] vs src [18]");
  Tensor w = zeros(Shape{4}).requires_grad_();
  EXPECT_NE(error_of([&] { scale_(w, 2.0f); }).find("requires grad"), std::string::npos);
  Tensor strided = transpose(zeros(Shape{4, 2}), 0, 1);
  EXPECT_NE(error_of([&] { scale_(strided, 2.0f); }).find("contiguous"), std::string::npos);
}

TEST(OptimizerClock, StepAndLearningRateAdvanceOnTheDeviceWithTheHostsBits) {
  // step_on_schedule: the step count and the schedule's learning rate are computed by a
  // kernel on the device (nothing read back, nothing baked into a launch) at the position of
  // the run's StepClock, and give the bits of step() with the host's cosine_lr at the loop's
  // step — also after a skipped step (F16 loss scaling: the clock moves, the optimizer does
  // not); set_steps (a resume) resynchronises the optimizer's step, StepClock::at the loop's.
  ParamStore host_lr, device_lr;
  fill_store(host_lr);
  fill_store(device_lr);
  host_lr.move_to(Device::SIM);
  device_lr.move_to(Device::SIM);
  const LrSchedule s{2, 8, 0.05f, 0.005f};
  AdamW a(host_lr, {0.9f, 0.95f, 1e-8f, 0.1f}), b(device_lr, {0.9f, 0.95f, 1e-8f, 0.1f});
  auto grads = [](ParamStore& ps, int step) {
    for (Param& p : ps.all())
      if (p.trainable)
        p.value.set_grad(transfer(from_vector(counting(p.value.numel(), 0.2f * float(step), -0.05f), p.value.shape()),
                                  Device::SIM));
  };
  StepClock clock;
  for (int step = 0; step < 7; ++step) {
    const int loop_step = step < 5 ? step : step + 4;  // a resume after step 4 at loop step 9
    if (step == 5) a.set_steps(10), b.set_steps(10);
    const Tensor& position = clock.at(loop_step, Device::SIM);
    if (step == 2) {  // skipped: the clock advances, nothing else
      clock.advance();
      continue;
    }
    grads(host_lr, step);
    grads(device_lr, step);
    a.step(cosine_lr(loop_step, s));
    reset_device_traffic();
    b.step_on_schedule(s, position);
    clock.advance();
    EXPECT_EQ(device_traffic().reads, 0) << "step " << step;
    EXPECT_EQ(b.steps(), a.steps());
    for (const char* n : {"a", "c", "d"})
      EXPECT_EQ(device_lr.get(n).to_f32_vector(), host_lr.get(n).to_f32_vector()) << n << " step " << step;
    host_lr.zero_grad();
    device_lr.zero_grad();
  }
  EXPECT_EQ(clock.tensor().item(), 11.0);
  Tensor step = zeros(Shape{}), lr = zeros(Shape{}), position = zeros(Shape{}, DType::I32);
  NoGradGuard ng;
  advance_optimizer_clock(step, lr, position, s);
  advance_step_clock(position);
  advance_optimizer_clock(step, lr, position, s);
  EXPECT_EQ(step.item(), 2.0);
  EXPECT_EQ(float(lr.item()), cosine_lr(1, s));
  EXPECT_NE(error_of([&] { advance_optimizer_clock(step, lr, position, LrSchedule{-1, 8, 0.1f, 0.01f}); })
                .find("optimizer_clock"),
            std::string::npos);
}

// The gradients' squared norms of a packed store come from one call over the arena's ranges,
// with the bits of sum(square(g)) per gradient (the unpacked store's path): lengths below,
// at and past the 8-wide loads' edges, on the CPU and on sim; the op itself against the
// composition on any ranges, and refusing a range outside the arena.
TEST(ParamArena, GradientSquareNormsInOneCallHaveTheBitsOfEachGradients) {
  for (Device d : {Device::CPU, Device::SIM}) {
    ParamStore ps, ref;
    const Shape shapes[] = {Shape{3}, Shape{8}, Shape{13, 7}, Shape{64, 33}, Shape{1000}};
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const std::string name = "p" + std::to_string(i);
      ps.add(name, transfer(randn_t(shapes[i], 50 + i), d));
      ref.add(name, transfer(randn_t(shapes[i], 50 + i), d));
    }
    ps.pack();
    ASSERT_NE(ps.arena(), nullptr);
    for (size_t i = 0; i < ps.size(); ++i) {
      const Tensor g = transfer(randn_t(shapes[i], 70 + i, 3.0f), d);
      ps.all()[i].value.set_grad(g);
      ref.all()[i].value.set_grad(g);
    }
    const std::vector<float> packed = grad_square_norms(ps).to_f32_vector();
    std::vector<float> apart;
    for (size_t i = 0; i < ref.size(); ++i) apart.push_back(sum(square(ref.all()[i].value.grad())).item());
    ASSERT_EQ(packed.size(), apart.size());
    for (size_t i = 0; i < apart.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(packed[i]), std::bit_cast<uint32_t>(apart[i])) << name(d) << " gradient " << i;
    // The op on ranges in any order, overlapping.
    const Tensor x = transfer(randn_t(Shape{300}, 90), d);
    const std::vector<ArenaRange> ranges = {{17, 300}, {0, 1}, {5, 21}, {0, 300}, {100, 108}};
    const std::vector<float> got = square_norms(x, ranges).to_f32_vector();
    for (size_t i = 0; i < ranges.size(); ++i) {
      const float want = sum(square(slice(x, 0, ranges[i].begin, ranges[i].end))).item();
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << name(d) << " range " << i;
    }
    EXPECT_THROW(square_norms(x, {{290, 301}}), Error);
    EXPECT_THROW(square_norms(x, {{4, 4}}), Error);
  }
}
