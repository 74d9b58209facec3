// The one training loop (train/loop.h): the options core the three commands share, the
// best weights, the step (accumulation per backward pass, the gradient-ready callback) and
// the run's cadence (periodic checkpoints, stop_after, the closing evaluation, a step that
// is not finite), on tasks small enough to reason about.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "helpers.h"
#include "toy/data/batches.h"
#include "toy/models/decoder_lm.h"
#include "toy/train/finetune.h"
#include "toy/train/loop.h"
#include "toy/train/step.h"
#include "toy/train/trainer.h"
#include "toy/train/vision.h"

namespace fs = std::filesystem;
using namespace toy;
using namespace toy::test;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("toy_loop_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<nlohmann::json> events_of(const fs::path& dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(dir / "events.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// loss = sum((w - target)^2) / n, each micro-batch its own target: a task whose every
// number is known. `poison_at` (1-based step) makes that step's loss NaN.
class QuadraticTask : public TrainTask {
 public:
  explicit QuadraticTask(ParamStore& p) : p_(p) {}
  Tensor micro_loss(const MicroBatch& mb, int64_t& units) override {
    const int64_t micro = mb.index;
    ++micro_calls;
    units += 4;
    Tensor target = full(Shape{4}, double(micro + 1));
    Tensor d = sub(p_.get("w"), target);
    Tensor l = scale(sum(mul(d, d)), 0.25f);
    if (step_now + 1 == poison_at) l = scale(l, NAN);
    // A finite loss whose gradient is NaN (sqrt's slope at 0 times 0): F16 loss scaling skips
    // such a step.
    if (mb.step + 1 == grad_poison_at) l = add(l, sqrt(sum(square(sub(p_.get("w"), p_.get("w").detach())))));
    return l;
  }
  void after_step(const StepDone& d, nlohmann::json&) override { step_now = d.step; }
  void cadence(const StepDone& d) override { cadence_steps.push_back(d.step); }
  bool final_evaluation() override {
    ++final_evaluations;
    return loop->offer_best(0.5);
  }
  void save_checkpoint() override { checkpoints.push_back(step_now); }
  void write_outputs(bool stopped) override { outputs_stopped = stopped; }

  ParamStore& p_;
  TrainLoop* loop = nullptr;
  int64_t step_now = 0, poison_at = -1, grad_poison_at = -1, micro_calls = 0, final_evaluations = 0;
  std::vector<int64_t> cadence_steps, checkpoints;
  bool outputs_stopped = false;
};

struct QuadraticRun {
  ParamStore params;
  LoopOptions o;
  LoopState state;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<QuadraticTask> task;
  QuadraticRun() {
    params.add("w", zeros(Shape{4}));
    o.lr = 0.1f, o.min_lr = 0.01f, o.warmup = 0, o.accum = 2, o.clip = 0, o.save_minutes = 0, o.quiet = true;
    opt = std::make_unique<AdamW>(params, o.adamw());
    task = std::make_unique<QuadraticTask>(params);
  }
  bool run(const fs::path& dir, int64_t steps, bool dynamic_loss_scale = false) {
    LoopSetup s;
    s.dir = dir.string();
    s.total_steps = steps;
    s.dynamic_loss_scale = dynamic_loss_scale;
    TrainLoop loop(s, o, state, params, *opt, *task);
    task->loop = &loop;
    return loop.run({});
  }
};

}  // namespace

// Each command's options keep their own defaults (the core's fields set per command) and
// their JSON round-trips through the core's fields.
TEST(Loop, EachCommandsOptionsKeepTheirDefaultsAndRoundTrip) {
  TrainOptions t;
  EXPECT_EQ(t.batch, 12);
  EXPECT_EQ(t.beta2, 0.99f);
  EXPECT_EQ(t.warmup, 100);
  FinetuneOptions f;
  EXPECT_EQ(f.batch, 4);
  EXPECT_EQ(f.lr, 1e-4f);
  EXPECT_TRUE(std::isnan(f.min_lr));
  VisionTrainOptions v;
  EXPECT_EQ(v.batch, 128);
  EXPECT_EQ(v.warmup, 500);
  EXPECT_EQ(v.log_every, 50);

  t.model.vocab = 65;
  t.model.resolve();
  t.out = "/tmp/x", t.accum = 3, t.lr = 2e-3f, t.seed = 99, t.save_every = 7, t.stop_after = 5;
  const nlohmann::json tj = t.to_json();
  EXPECT_EQ(tj.at("accum"), 3);
  EXPECT_EQ(tj.at("seed"), 99);
  EXPECT_EQ(TrainOptions::from_json(tj, "t").to_json(), tj);
  v.out = "/tmp/v", v.accum = 2, v.clip = 0.5f, v.crop_pad = 2, v.flip = true;  // saved resolved
  EXPECT_EQ(VisionTrainOptions::from_json(v.to_json(), "v").to_json(), v.to_json());
  f.model = "/m.gguf", f.data = "/d.jsonl", f.out = "/o", f.batch = 3, f.log_every = 4;
  const nlohmann::json fj = f.to_json();
  EXPECT_FLOAT_EQ(fj.at("min_lr").get<float>(), 1e-5f) << "finetune's NaN min_lr is saved resolved";
  EXPECT_EQ(FinetuneOptions::from_json(fj, "f").to_json(), fj);
  // Ranges the commands keep: a from-scratch lr above 1 is refused, fine-tuning's is not.
  t.lr = 2;
  EXPECT_THROW(t.validate(), Error);
  f.lr = 2;
  EXPECT_NO_THROW(f.validate());
}

TEST(Loop, BestWeightsKeepTheLowestScoreThenTheLowestTiebreak) {
  ParamStore p;
  p.add("w", full(Shape{2}, 1.0));
  p.add("frozen", full(Shape{2}, 7.0), false);
  Tensor w = p.get("w");  // (a handle: the store's records move as it grows)
  NoGradGuard ng;
  BestWeights b;
  EXPECT_FALSE(b.offer(p, 1, NAN));
  EXPECT_TRUE(b.offer(p, 1, -0.5, 2.0));
  copy_(w, full(Shape{2}, 2.0));
  EXPECT_FALSE(b.offer(p, 2, -0.5, 3.0)) << "same score, worse tiebreak";
  EXPECT_FALSE(b.offer(p, 2, -0.4, 0.0));
  copy_(w, full(Shape{2}, 3.0));
  EXPECT_TRUE(b.offer(p, 3, -0.5, 1.0)) << "same score, better tiebreak";
  ASSERT_EQ(b.values.size(), 1u) << "only trainable parameters are kept";
  copy_(w, full(Shape{2}, 4.0));
  b.swap_with(p);
  EXPECT_EQ(w.to_f32_vector(), (std::vector<float>{3, 3}));
  b.swap_with(p);
  EXPECT_EQ(w.to_f32_vector(), (std::vector<float>{4, 4}));
  EXPECT_EQ(b.step, 3);
}

// The gradient-ready callback fires once per trainable parameter per backward pass (every
// micro-batch), and a tied embedding and head with accumulation get each pass's sum added
// once: the step's gradient equals the sum of the passes' gradients taken one at a time.
TEST(Loop, GradientsAreReadyOncePerParameterPerMicroBatch) {
  std::vector<int32_t> toks(300);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 5 + i / 7) % 16);
  ModelConfig mc = ModelConfig::from_preset("gpt");
  mc.vocab = 16, mc.layers = 1, mc.heads = 2, mc.kv_heads = 2, mc.dim = 16, mc.ctx = 8;
  ASSERT_TRUE(mc.tied);
  DecoderLM m(mc);
  m.init(4);
  AdamW opt(m.params(), {0.9f, 0.99f, 1e-8f, 0.0f});
  BatchSampler s(&toks, mc.ctx, 2, "training");
  Generator data(7, 1), drop(7, 2);
  WindowTask task(m, s, data, drop);
  std::map<TensorImpl*, int> ready;
  StepSettings ss;
  ss.accum = 3;
  ss.on_grad_ready = [&](const Tensor& leaf) { ++ready[leaf.impl()]; };
  DynamicLossScale unscaled(1.0f);
  take_step(task, m.params(), opt, unscaled, ss, 1e-3f);
  size_t trainable = 0;
  for (const Param& p : m.params().all()) {
    if (!p.trainable) continue;
    ++trainable;
    EXPECT_EQ(ready[p.value.impl()], 3) << p.name;
  }
  EXPECT_EQ(ready.size(), trainable);
}

// The cadence: the task's work after every step, periodic checkpoints every save_every
// steps, the end's checkpoint, the closing evaluation and its "best" checkpoint, the
// outputs; step and run_end events in the run folder.
TEST(Loop, ARunCheckpointsOnItsCadenceAndEvaluatesAtTheEnd) {
  const fs::path dir = fresh_dir("cadence");
  QuadraticRun q;
  q.o.save_every = 4;
  EXPECT_FALSE(q.run(dir, 10));
  EXPECT_EQ(q.state.step, 10);
  EXPECT_EQ(q.state.units, 10 * 2 * 4);
  EXPECT_EQ(q.task->micro_calls, 20);
  EXPECT_EQ(q.task->cadence_steps.size(), 10u);
  EXPECT_EQ(q.task->checkpoints, (std::vector<int64_t>{4, 8, 10, 10})) << "periodic, end, best";
  EXPECT_EQ(q.task->final_evaluations, 1);
  EXPECT_FALSE(q.task->outputs_stopped);
  EXPECT_EQ(q.state.best.step, 10);
  EXPECT_EQ(q.state.saved_step, 10);
  // The micro-batches' targets are 1 and 2: w heads from 0 for their mean (Adam's steps are
  // about lr each, and the schedule decays).
  for (float w : q.params.get("w").to_f32_vector()) EXPECT_TRUE(w > 0.3f && w < 1.5f) << w;
  const auto ev = events_of(dir);
  int steps = 0;
  for (const auto& e : ev) steps += e.at("event") == "step";
  EXPECT_EQ(steps, 10);
  EXPECT_EQ(ev.back().at("event"), "run_end");
  EXPECT_EQ(ev.back().at("steps"), 10);
  EXPECT_EQ(ev.back().at("stopped"), false);
  fs::remove_all(dir);
}

// Under F16 loss scaling a skipped step moves the schedule on (the loop's step clock, on the
// device) but not AdamW's bias-correction count: the loop's weights are those of steps taken
// one by one with the host's lr at each loop step.
TEST(Loop, ASkippedStepKeepsTheScheduleOnTheLoopsStep) {
  const fs::path dir = fresh_dir("skip");
  QuadraticRun q;
  q.o.warmup = 2;
  q.task->grad_poison_at = 3;
  q.state.loss_scale = DynamicLossScale(1024.0f);
  EXPECT_FALSE(q.run(dir, 7, true));
  EXPECT_EQ(q.state.skipped_steps, 1);
  EXPECT_EQ(q.opt->steps(), 6);
  // By hand: take_step with the host's lr at every loop step (no device clock).
  QuadraticRun hand;
  hand.task->grad_poison_at = 3;
  DynamicLossScale scale(1024.0f);
  const LrSchedule sched{2, 7, q.o.lr, q.o.min_lr};
  for (int64_t step = 0; step < 7; ++step) {
    StepSettings s;
    s.step = step, s.accum = 2, s.dynamic_loss_scale = true;
    const StepDone d = take_step(*hand.task, hand.params, *hand.opt, scale, s, cosine_lr(step, sched));
    EXPECT_EQ(d.skipped, step == 2) << step;
  }
  EXPECT_EQ(q.params.get("w").to_f32_vector(), hand.params.get("w").to_f32_vector());
  fs::remove_all(dir);
}

TEST(Loop, StopAfterEndsWithACheckpointAndNoClosingEvaluation) {
  const fs::path dir = fresh_dir("stop");
  QuadraticRun q;
  q.o.stop_after = 3;
  EXPECT_TRUE(q.run(dir, 10));
  EXPECT_EQ(q.state.step, 3);
  EXPECT_EQ(q.task->checkpoints, (std::vector<int64_t>{3}));
  EXPECT_EQ(q.task->final_evaluations, 0);
  EXPECT_TRUE(q.task->outputs_stopped);
  fs::remove_all(dir);
}

// A step whose loss is not finite applies nothing, and the error names the step and the
// checkpoint that is kept.
TEST(Loop, ANonFiniteStepAppliesNothingAndNamesTheCheckpointKept) {
  const fs::path dir = fresh_dir("nan");
  QuadraticRun q;
  q.o.save_every = 2;
  q.task->poison_at = 4;
  std::vector<float> before;
  try {
    q.run(dir, 10);
    ADD_FAILURE() << "the run went on";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the loss became nan"), std::string::npos) << m;
    EXPECT_NE(m.find("(at step 4)"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint of step 2"), std::string::npos) << m;
  }
  EXPECT_EQ(q.state.step, 3);
  EXPECT_EQ(q.opt->steps(), 3) << "the failed step reached the optimizer";
  EXPECT_FALSE(q.params.get("w").grad().defined());
  const auto ev = events_of(dir);
  EXPECT_EQ(ev.back().at("event"), "run_end");
  EXPECT_TRUE(ev.back().contains("error"));
  fs::remove_all(dir);
}
