#include "toy/train/finetune.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"
#include "toy/obs/events.h"
#include "toy/obs/progress.h"
#include "toy/obs/report.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune_run.h"
#include "toy/train/run_folder.h"
#include "toy/train/trainer.h"

namespace fs = std::filesystem;

namespace toy {

// ---- options ------------------------------------------------------------------------------------

void FinetuneOptions::validate() const {
  const bool lens = !donor_embeddings.empty();
  TOY_CHECK(!model.empty() || lens, "[finetune] -m/--model is required (or --donor-embeddings with the shape flags, "
            "for a fresh model)");
  TOY_CHECK(!data.empty(), "[finetune] --data is required");
  TOY_CHECK(!out.empty(), "[finetune] --out is required");
  TOY_CHECK(method == "full" || method == "lora", "[finetune] --method must be full or lora, got '{}'",
            printable(method));
  TOY_CHECK(!model.empty() || method == "full", "[finetune] a fresh model (no -m) trains in full: --method full");
  TOY_CHECK(!train_embeddings || method == "full", "[finetune] --train-embeddings applies to --method full");
  TOY_CHECK(lora_rank >= 1, "[finetune] --lora-rank must be at least 1");
  TOY_CHECK(std::isfinite(lora_alpha) && lora_alpha > 0, "[finetune] --lora-alpha must be positive");
  TOY_CHECK(lora_dropout >= 0 && lora_dropout < 1, "[finetune] --lora-dropout must be in [0, 1)");
  TOY_CHECK(ctx >= 0, "[finetune] --ctx must not be negative");
  validate_loop("[finetune]");
  TOY_CHECK(steps >= 0, "[finetune] --steps must not be negative");
  TOY_CHECK(std::isfinite(epochs) && epochs > 0, "[finetune] --epochs must be positive");
  TOY_CHECK(val_fraction >= 0 && val_fraction < 1, "[finetune] --val-fraction must be in [0, 1)");
  TOY_CHECK(precision == "f32" || precision == "bf16" || precision == "f16",
            "[finetune] --precision must be f32, bf16 or f16, got '{}'", printable(precision));
  TOY_CHECK(std::isfinite(loss_scale) && loss_scale >= 1, "[finetune] the loss scale must be at least 1");
  TOY_CHECK(eval_every >= 0, "[finetune] --eval-every must not be negative");
  if (!merge_type.empty())
    TOY_CHECK(merge_type == "f32" || merge_type == "f16" || merge_type == "bf16" || merge_type == "q8_0",
              "[finetune] --merge-type must be f32, f16, bf16 or q8_0, got '{}'", printable(merge_type));
  if (model.empty()) {
    ModelConfig m = shape;
    m.vocab = 1;  // the donor's, known once it is read
    m.tied = false;
    m.resolve();
    m.validate();
  }
}

nlohmann::json FinetuneOptions::to_json() const {
  nlohmann::json j = {{"model", model},
                      {"data", data},
                      {"chat_template", chat_template},
                      {"out", out},
                      {"method", method},
                      {"train_embeddings", train_embeddings},
                      {"donor_embeddings", donor_embeddings},
                      {"lora_rank", lora_rank},
                      {"lora_alpha", json_float(lora_alpha)},
                      {"lora_dropout", json_float(lora_dropout)},
                      {"lora_targets", lora_targets},
                      {"ctx", ctx},
                      {"pack", pack},
                      {"recompute", recompute},
                      {"precision", precision},
                      {"loss_scale", json_float(loss_scale)},
                      {"steps", steps},
                      {"epochs", epochs},
                      {"val_fraction", val_fraction},
                      {"eval_every", eval_every},
                      {"merge_type", merge_type}};
  loop_to_json(j);
  if (model.empty()) j["shape"] = shape.to_json();  // a fresh model's (its vocabulary the donor's)
  return j;
}

FinetuneOptions FinetuneOptions::from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  FinetuneOptions o;
  o.model = get_string(j, "model", where);
  o.data = get_string(j, "data", where);
  if (j.contains("chat_template")) o.chat_template = get_string(j, "chat_template", where);  // runs before it: none
  o.out = get_string(j, "out", where);
  o.method = get_string(j, "method", where);
  o.train_embeddings = get_bool(j, "train_embeddings", where);
  o.donor_embeddings = get_string(j, "donor_embeddings", where);
  if (o.model.empty()) o.shape = ModelConfig::from_json(get_object(j, "shape", where), where + " shape");
  o.lora_rank = get_int(j, "lora_rank", where);
  o.lora_alpha = get_float(j, "lora_alpha", where);
  o.lora_dropout = get_float(j, "lora_dropout", where);
  o.lora_targets = get_string(j, "lora_targets", where);
  o.ctx = get_int(j, "ctx", where);
  o.loop_from_json(j, where);
  o.pack = get_bool(j, "pack", where);
  o.recompute = get_bool(j, "recompute", where);
  o.precision = get_string(j, "precision", where);
  o.loss_scale = get_float(j, "loss_scale", where);
  o.steps = get_int(j, "steps", where);
  o.epochs = get_double(j, "epochs", where);
  o.val_fraction = get_double(j, "val_fraction", where);
  o.eval_every = get_int(j, "eval_every", where);
  o.merge_type = get_string(j, "merge_type", where);
  try {
    o.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return o;
}

// ---- the run ------------------------------------------------------------------------------------

void shuffle_epoch(FinetuneRun& r) {
  r.order.resize(r.train.size());
  for (size_t i = 0; i < r.order.size(); ++i) r.order[i] = i;
  Generator g(r.o.seed, kFinetuneShuffleStream + uint64_t(r.epoch));
  shuffle(r.order, g);
}

namespace {


// Token-weighted mean loss over examples, in batches (data-parallel: the batches split over
// the ranks, summed in batch order).
double mean_loss(DecoderLM& m, const std::vector<SftExample>& examples, int64_t batch, double timeout_s) {
  NoGradGuard ng;
  struct Batch {
    Tensor ids, targets;
    int64_t n = 0;
  };
  std::vector<Batch> batches;
  for (size_t i = 0; i < examples.size(); i += size_t(batch)) {
    std::vector<const SftExample*> b;
    for (size_t j = i; j < std::min(examples.size(), i + size_t(batch)); ++j) b.push_back(&examples[j]);
    Batch x;
    x.n = make_sft_batch(b, m.config().vocab, x.ids, x.targets);
    batches.push_back(std::move(x));
  }
  const std::vector<double> losses = dist::share_items(
      int64_t(batches.size()),
      [&](int64_t i) { return double(m.loss(batches[size_t(i)].ids, batches[size_t(i)].targets).item()); }, timeout_s);
  double total = 0;
  int64_t counted = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    total += losses[i] * double(batches[i].n);
    counted += batches[i].n;
  }
  return counted ? total / double(counted) : NAN;
}

const SftExample* next_example(FinetuneRun& r) {
  if (r.epoch < 0 || r.cursor == r.order.size()) {  // a new epoch: a fresh seeded order
    ++r.epoch;
    shuffle_epoch(r);
    r.cursor = 0;
  }
  return &r.train[r.order[r.cursor++]];
}

// A packed row: examples in order until the next does not fit; it opens the next row.
std::vector<const SftExample*> next_row(FinetuneRun& r) {
  std::vector<const SftExample*> row;
  int64_t used = 0;
  while (true) {
    const SftExample* e = r.pending ? &r.train[r.order[r.cursor - 1]] : next_example(r);
    r.pending = false;
    const int64_t n = int64_t(e->tokens.size()) - 1;
    if (used + n > r.o.ctx) {
      r.pending = true;
      return row;
    }
    row.push_back(e);
    used += n;
  }
}

void read_finetune_data(FinetuneRun& r) {
  SftData data = read_sft_data(r.o.data, *r.tok, r.chat ? &*r.chat : nullptr, r.o.ctx, r.chat_error);
  r.truncated = data.truncated, r.dropped = data.dropped;
  split_sft(std::move(data.examples), r.o.val_fraction, r.o.seed, r.train, r.val);
  TOY_CHECK(!r.train.empty(), "[finetune] no training examples are left after the validation split");
}

// The files the run depends on, as they are now.
void identify_files(FinetuneRun& r) {
  if (!r.o.model.empty()) r.base_id = file_identity(r.o.model, "[finetune]");
  if (!r.o.donor_embeddings.empty()) r.donor_id = file_identity(r.o.donor_embeddings, "[finetune]");
  r.data_id = file_identity(r.o.data, "[finetune]");
}

void check_same_file(const FileIdentity& saved, const FileIdentity& now, const char* what) {
  TOY_CHECK(saved.path == now.path && saved.bytes == now.bytes && saved.hash == now.hash,
            "[finetune] the {} changed since the checkpoint ('{}', {} bytes, then; '{}', {} bytes, now, or the same size "
            "with other bytes): resuming would train on something else than the run started with; restore it",
            what, printable(saved.path), saved.bytes, printable(now.path), now.bytes);
}

std::string absolute(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  return ec ? p : abs.lexically_normal().string();
}

// Fine-tuning as a task of the one loop: SFT examples in seeded epochs (padded, or packed
// rows), validation every eval_every steps and at the end, the loss of a logging window, and
// the outputs (adapter.gguf, the merged model.gguf) holding the best validation weights.
class FinetuneTask : public TrainTask {
 public:
  explicit FinetuneTask(FinetuneRun& r) : r_(r) {}
  void set_loop(TrainLoop& loop) { loop_ = &loop; }
  FinetuneResult& result() { return res_; }

  // The examples come in order (the epoch's seeded order, rows packed in turn); the dropout
  // masks from the micro-batch's own generator. Data-parallel: every rank walks the same
  // order and passes over the micro-batches of the other ranks (micro-batch i of a step is
  // rank i mod N's), so the data position is the one process's after every step.
  Tensor micro_loss(const MicroBatch& mb, int64_t& units) override {
    const FinetuneOptions& o = r_.o;
    DecoderLM& m = *r_.model;
    if (mb.step != step_) finish_step(), step_ = mb.step, count_ = mb.count;
    while (next_ < mb.index) skip_micro_batch();
    ++next_;
    Tensor ids, targets;
    Packing packing;
    if (o.pack) {
      std::vector<std::vector<const SftExample*>> rows;
      for (int64_t i = 0; i < o.batch; ++i) rows.push_back(next_row(r_));
      make_packed_sft_batch(rows, o.ctx, m.config().vocab, ids, targets, packing.positions, packing.segments);
      for (const auto& row : rows)
        for (const SftExample* e : row) units += int64_t(e->tokens.size()) - 1;
    } else {
      std::vector<const SftExample*> b;
      for (int64_t i = 0; i < o.batch; ++i) b.push_back(next_example(r_));
      make_sft_batch(b, m.config().vocab, ids, targets);
      for (const SftExample* e : b) units += int64_t(e->tokens.size()) - 1;
    }
    Generator dropout = mb.draws_from(r_.dropout_gen);
    return m.loss(ids, targets, true, &dropout, o.pack ? &packing : nullptr);
  }
  void after_step(const StepDone& d, nlohmann::json& ev) override {
    finish_step();
    ev["epoch"] = r_.epoch;
    if (d.skipped) return;
    r_.window_loss += d.loss, ++r_.window_steps;
    if (d.step % r_.o.log_every == 0 || d.last) {
      r_.train_loss = r_.window_loss / double(r_.window_steps);
      ev["window_loss"] = r_.train_loss;
      r_.window_loss = 0, r_.window_steps = 0;
    }
  }
  void cadence(const StepDone& d) override {
    if (!d.last && r_.o.eval_every && d.step % r_.o.eval_every == 0 && !r_.val.empty()) evaluate();
  }
  bool final_evaluation() override {
    if (r_.val.empty()) return false;
    const int64_t best_before = r_.loop.best.step;
    res_.val_loss = evaluate();
    return r_.loop.best.step != best_before;
  }
  void save_checkpoint() override { save_finetune_checkpoint(r_); }
  void write_outputs(bool stopped) override {
    const BestWeights& best = r_.loop.best;
    res_.stopped = stopped;
    // The best-model rule (as toy train's): the outputs hold the weights of the best
    // validation loss, which may be an earlier evaluation's; the checkpoint keeps the last
    // step's.
    if (best.has() && best.step != r_.loop.step) {
      r_.loop.best.swap_with(r_.model->params());
      res_.model = "best";
      loop_->progress().line(fmt::format("toy finetune: the outputs hold the best validation weights (step {}, val "
                                         "loss {:.4f})", best.step, best.score));
    }
    write_finetune_outputs(r_);
    res_.best_step = best.step;
    res_.best_val_loss = best.has() ? best.score : NAN;
    loop_->events().emit("models", {{"model_gguf", res_.model},
                                    {"last_step", r_.loop.step},
                                    {"best_step", res_.best_step},
                                    {"best_val_loss", res_.best_val_loss},
                                    {"adapter", fs::exists(fs::path(r_.o.out) / "adapter.gguf")}});
    if (stopped)
      loop_->progress().line(fmt::format("stopped at step {}: checkpoint written; continue with toy finetune --resume "
                                         "{}", r_.loop.step, r_.o.out));
  }

 private:
  // Passes over the rest of the step's micro-batches (those of the ranks after this one).
  void finish_step() {
    while (next_ < count_) skip_micro_batch();
    next_ = count_ = 0;
  }
  void skip_micro_batch() {
    for (int64_t i = 0; i < r_.o.batch; ++i) r_.o.pack ? (void)next_row(r_) : (void)next_example(r_);
    ++next_;
  }

  double evaluate() {
    const double v = mean_loss(*r_.model, r_.val, r_.o.batch, r_.o.dp_timeout);
    const bool best = loop_->offer_best(v);
    loop_->events().emit("eval", {{"step", r_.loop.step}, {"val_loss", v}, {"best", best}});
    loop_->progress().line(fmt::format("step {:>6}  val loss {:.4f}{}", r_.loop.step, v, best ? "  (best so far)" : ""));
    return v;
  }

  FinetuneRun& r_;
  TrainLoop* loop_ = nullptr;
  FinetuneResult res_;
  int64_t step_ = -1, next_ = 0, count_ = 0;  // the step being drawn and its next micro-batch
};

FinetuneResult run_loop(FinetuneRun& r, bool resumed) {
  const FinetuneOptions& o = r.o;
  DecoderLM& m = *r.model;
  FinetuneTask task(r);
  LoopSetup setup;
  setup.who = "[finetune]";
  setup.dir = o.out;
  setup.resumed = resumed;
  setup.progress = stderr;
  setup.total_steps = o.steps;
  // F16: dynamic loss scaling (a step whose gradient overflows is skipped and the scale
  // halved; after 200 good steps in a row it doubles).
  setup.dynamic_loss_scale = o.precision == "f16";
  setup.resume_command = "toy finetune --resume " + printable(o.out);
  TrainLoop loop(setup, o, r.loop, m.params(), *r.opt, task);
  task.set_loop(loop);
  nlohmann::json start = provenance();
  start["command"] = "finetune";
  start["resumed"] = resumed;
  start["step"] = r.loop.step;
  start["config"] = o.to_json();
  start["steps"] = o.steps;
  start["train_examples"] = r.train.size();
  start["val_examples"] = r.val.size();
  start["truncated"] = r.truncated;
  start["dropped"] = r.dropped;
  start["model"] = m.config().to_json();
  start["params"] = m.params().numel();
  start["trainable_params"] = m.params().trainable_numel();
  loop.add_run_start_fields(start);
  loop.events().emit("run_start", start);
  const std::string what = (o.method == "full" ? std::string("full") : fmt::format("LoRA rank {}", o.lora_rank)) +
                           (o.donor_embeddings.empty() ? "" : ", projection lens");
  loop.progress().line(fmt::format("toy finetune: {}, {} of {} parameters train; {} examples ({} validation), {} "
                                   "steps{}", what, m.params().trainable_numel(), m.params().numel(),
                                   r.train.size() + r.val.size(), r.val.size(), o.steps,
                                   resumed ? fmt::format(", resuming at step {}", r.loop.step) : ""));
  FinetuneResult& res = task.result();
  res.out = o.out;
  res.trainable_params = m.params().trainable_numel();
  loop.run([&] {
    if (r.window_steps) r.train_loss = r.window_loss / double(r.window_steps);
    return nlohmann::json{{"train_loss", r.train_loss},      {"val_loss", res.val_loss},
                          {"skipped_steps", r.loop.skipped_steps}, {"model", res.model},
                          {"best_step", res.best_step},      {"best_val_loss", res.best_val_loss}};
  });
  res.steps = r.loop.step;
  res.train_loss = r.train_loss;
  res.seconds = r.loop.seconds;
  res.tokens_per_s = double(r.loop.units) / std::max(r.loop.seconds, 1e-9);
  res.skipped_steps = r.loop.skipped_steps;
  return res;
}

}  // namespace

// Data-parallel: every rank must be fine-tuning the same run on the same files.
void agree_on_start(const FinetuneRun& r) {
  auto id = [](const FileIdentity& f) { return nlohmann::json{{"bytes", f.bytes}, {"hash", fmt::format("{:016x}", f.hash)}}; };
  nlohmann::json mine = {{"options", r.o.to_json()}, {"base", id(r.base_id)}, {"donor", id(r.donor_id)},
                         {"data", id(r.data_id)}, {"step", r.loop.step}};
  dist::agree_on_start(dist::world(), mine, r.o.dp_timeout);
}

FinetuneResult finetune(const FinetuneOptions& opts) {
  opts.validate();
  // (Data-parallel: rank 0 alone writes the run's files.)
  const bool writer = writes_run_files();
  check_data_parallel(opts, "[finetune]");
  if (writer) check_new_run_folder(opts.out, opts.force);
  FinetuneRun r;
  r.o = opts;
  if (!writer) r.o.quiet = true;
  // Saved absolute, so `--resume DIR` finds the files from any working directory.
  r.o.model = absolute(opts.model);
  r.o.data = absolute(opts.data);
  r.o.donor_embeddings = absolute(opts.donor_embeddings);
  build_finetune_model(r);
  if (r.o.model.empty()) r.o.shape.vocab = r.model->config().vocab;  // the donor's
  const int64_t model_ctx = r.model->config().ctx;
  r.o.ctx = opts.ctx ? opts.ctx : std::min<int64_t>(model_ctx, 512);
  TOY_CHECK(r.o.ctx <= model_ctx, "[finetune] --ctx {} is longer than the model's context {}", r.o.ctx, model_ctx);
  read_finetune_data(r);
  if (!r.o.quiet && (r.truncated || r.dropped))
    std::fprintf(stderr, "toy finetune: warning: %lld records longer than --ctx %lld + 1 tokens were truncated%s\n",
                 (long long)r.truncated, (long long)r.o.ctx,
                 r.dropped ? fmt::format(" ({} left with nothing to learn were dropped)", r.dropped).c_str() : "");
  // Steps from epochs: examples per step, or (packed) input tokens per step (of every process).
  const double per_step = double(opts.batch * opts.accum * dist::world().size());
  double per_epoch = double(r.train.size()) / per_step;
  if (opts.pack) {
    double inputs = 0;
    for (const SftExample& e : r.train) inputs += double(e.tokens.size() - 1);
    per_epoch = inputs / (double(r.o.ctx) * per_step);
  }
  if (!opts.steps) r.o.steps = std::max<int64_t>(1, int64_t(std::ceil(opts.epochs * per_epoch)));
  if (std::isnan(opts.min_lr)) r.o.min_lr = opts.lr / 10;
  identify_files(r);
  agree_on_start(r);
  if (writer) prepare_new_run_folder(opts.out, opts.force);
  r.model->params().move_to(opts.device);  // the base's weights (mapped or F32) and what trains, copied once
  r.opt = std::make_unique<AdamW>(r.model->params(), opts.adamw());
  r.dropout_gen = Generator(opts.seed, kFinetuneDropoutStream);
  r.loop.loss_scale = DynamicLossScale(opts.precision == "f16" ? opts.loss_scale : 1.0f);
  return run_loop(r, false);
}

FinetuneResult resume_finetune(const std::string& dir, const std::function<void(FinetuneOptions&)>& override_fn) {
  struct stat st {};
  TOY_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "[finetune] --resume '{}' is not a run folder",
            printable(dir));
  const std::string path = finetune_checkpoint_path(dir);
  std::error_code ec;
  TOY_CHECK(fs::exists(fs::symlink_status(path, ec)), "[finetune] no checkpoint to resume in '{}' (expected {})",
            printable(dir), printable(path));
  gguf::Reader rd(path);
  FinetuneRun r;
  r.o = read_finetune_checkpoint_options(rd, dir);
  // The run's files are rewritten or appended to: each must be a regular file.
  for (const std::string& f : run_file_names()) check_output_file((fs::path(dir) / f).string(), "[finetune]");
  const bool writer = writes_run_files();
  if (writer)
    for (const std::string& t : remove_stale_temporaries(dir))
      std::fprintf(stderr, "toy finetune: removed '%s' left by a write that was interrupted\n", printable(t).c_str());
  r.o.stop_after = 0;  // a stop point belongs to the session that set it
  // The global batch (batch x accum x processes) is the run's (see toy train's resume).
  r.o.accum = accum_for_world(r.o.accum, saved_world_size(rd), "[finetune]", dir, "toy finetune");
  if (override_fn) override_fn(r.o);
  r.o.validate();
  if (!writer) r.o.quiet = true;
  check_data_parallel(r.o, "[finetune]");
  // The files first: a run continues only on what it started with.
  FileIdentity base, donor, data;
  read_finetune_checkpoint_files(rd, base, donor, data);
  identify_files(r);
  check_same_file(base, r.base_id, "base model");
  check_same_file(donor, r.donor_id, "donor model");
  check_same_file(data, r.data_id, "training data");
  build_finetune_model(r);
  read_finetune_data(r);
  r.opt = std::make_unique<AdamW>(r.model->params(), r.o.adamw());
  load_finetune_checkpoint(r, rd);
  agree_on_start(r);
  r.model->params().move_to(r.o.device);  // what trains and AdamW's moments, read on the CPU
  r.loop.best.move_to(r.o.device);
  // A finished run whose outputs were not written after its last checkpoint (the write
  // failed: a full disk) only writes them now.
  const auto written = [&](const char* f) {
    std::error_code e;
    const auto t = fs::last_write_time(fs::path(dir) / f, e);
    return e ? fs::file_time_type::min() : t;
  };
  TOY_CHECK(r.loop.step < r.o.steps || written("model.gguf") < written("checkpoint.gguf"),
            "[finetune] the run in '{}' already finished its {} steps (pass a larger --steps to go on)", printable(dir),
            r.o.steps);
  return run_loop(r, true);
}

}  // namespace toy
