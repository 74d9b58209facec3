#include "toy/train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/core/thread_pool.h"
#include "toy/data/batches.h"
#include "toy/data/corpus.h"
#include "toy/infer/generate.h"
#include "toy/infer/sampler.h"
#include "toy/train/step.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/obs/events.h"
#include "toy/obs/report.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"

namespace fs = std::filesystem;

namespace toy {

namespace {
std::atomic<bool> g_stop{false};
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Independent random streams of a run (all counter-based, keyed by the seed).
constexpr uint64_t kDataStream = 1, kDropoutStream = 2, kEvalStream = 3, kSampleStream = 4;
}  // namespace

void request_stop() { g_stop = true; }

// ---- options ------------------------------------------------------------------------------------

void TrainOptions::validate() const {
  TOY_CHECK(!out.empty(), "[train] --out (the run folder) is required");
  TOY_CHECK(batch > 0 && batch <= 1 << 20, "[train] --batch must be in 1..2^20, got {}", batch);
  TOY_CHECK(accum > 0 && accum <= 1 << 16, "[train] --accum must be >= 1, got {}", accum);
  TOY_CHECK(steps > 0, "[train] --steps must be >= 1, got {}", steps);
  TOY_CHECK(std::isfinite(lr) && lr > 0, "[train] --lr must be > 0, got {}", lr);
  TOY_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= lr, "[train] --min-lr must be in [0, lr], got {}",
            min_lr);
  TOY_CHECK(warmup >= 0, "[train] --warmup must be >= 0, got {}", warmup);
  TOY_CHECK(weight_decay >= 0 && weight_decay < 1, "[train] --wd must be in [0, 1), got {}", weight_decay);
  TOY_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "[train] --beta1/--beta2 must be in [0, 1), got {} "
            "and {}", beta1, beta2);
  TOY_CHECK(clip >= 0, "[train] --clip must be >= 0 (0 = off), got {}", clip);
  TOY_CHECK(eval_every >= 0 && sample_every >= 0 && stop_after >= 0 && log_every > 0,
            "[train] --eval-every, --sample-every and --stop-after must be >= 0");
  TOY_CHECK(eval_batches > 0, "[train] --eval-batches must be >= 1, got {}", eval_batches);
  TOY_CHECK(sample_tokens >= 0, "[train] sample length must be >= 0");
  TOY_CHECK(val_fraction > 0 && val_fraction < 1, "[train] validation fraction must be in (0, 1), got {}",
            val_fraction);
  TOY_CHECK(threads >= 0 && threads <= 1024, "[train] --threads must be in 0..1024, got {}", threads);
  TOY_CHECK(tokenizer == "char" || tokenizer == "byte" || tokenizer.rfind("bpe:", 0) == 0,
            "[train] --tokenizer must be char, byte or bpe:N, got '{}'", tokenizer);
  ModelConfig m = model;
  if (m.vocab == 0) m.vocab = 1;  // known only after the tokenizer is trained
  m.resolve();
  m.validate();
}

nlohmann::json TrainOptions::to_json() const {
  return {{"data", data},           {"out", out},           {"tokenizer", tokenizer},   {"model", model.to_json()},
          {"batch", batch},         {"accum", accum},       {"steps", steps},           {"lr", json_float(lr)},
          {"min_lr", json_float(min_lr)},       {"warmup", warmup},     {"weight_decay", json_float(weight_decay)}, {"beta1", json_float(beta1)},
          {"beta2", json_float(beta2)},         {"clip", json_float(clip)},         {"seed", seed},             {"eval_every", eval_every},
          {"eval_batches", eval_batches}, {"sample_every", sample_every}, {"sample_tokens", sample_tokens},
          {"log_every", log_every}, {"val_fraction", val_fraction}, {"threads", threads}, {"stop_after", stop_after}};
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  try {
    TrainOptions o;
    o.data = j.at("data").get<std::vector<std::string>>();
    o.out = j.at("out");
    o.tokenizer = j.at("tokenizer");
    o.model = ModelConfig::from_json(j.at("model"));
    o.batch = j.at("batch");
    o.accum = j.at("accum");
    o.steps = j.at("steps");
    o.lr = j.at("lr");
    o.min_lr = j.at("min_lr");
    o.warmup = j.at("warmup");
    o.weight_decay = j.at("weight_decay");
    o.beta1 = j.at("beta1");
    o.beta2 = j.at("beta2");
    o.clip = j.at("clip");
    o.seed = j.at("seed");
    o.eval_every = j.at("eval_every");
    o.eval_batches = j.at("eval_batches");
    o.sample_every = j.at("sample_every");
    o.sample_tokens = j.at("sample_tokens");
    o.log_every = j.at("log_every");
    o.val_fraction = j.at("val_fraction");
    o.threads = j.at("threads");
    o.stop_after = j.at("stop_after");
    return o;
  } catch (const nlohmann::json::exception& e) {
    fail("[train] malformed saved training options: {}", e.what());
  }
}

// ---- the run ------------------------------------------------------------------------------------

namespace {

struct Run {
  TrainOptions o;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> tokens;
  TokenSplit split;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<AdamW> opt;
  Generator data_gen{0, kDataStream}, dropout_gen{0, kDropoutStream};
  int64_t step = 0;          // steps completed
  double train_seconds = 0;  // time spent in training steps (all sessions)
  int64_t tokens_seen = 0;
  std::vector<std::string> files;
  uint64_t token_cache_key = 0;  // the corpus text and the tokenizer's identity
  bool tty = false;
};

std::string checkpoint_path(const std::string& dir) { return (fs::path(dir) / "checkpoint.gguf").string(); }

void log_line(const Run& r, const std::string& s) {
  if (r.o.quiet) return;
  if (r.tty) std::fputs("\r\033[K", stdout);
  std::fputs((s + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Reads and encodes the corpus (through the token cache in the run folder).
void load_data(Run& r, bool train_tokenizer) {
  Corpus c = read_corpus(r.o.data);
  r.files = c.files;
  if (!r.o.quiet && r.o.data.empty())
    log_line(r, fmt::format("toy train: no --data given; training on the {} license texts in {} (every Debian/Ubuntu "
                            "system has them)", c.files.size(), default_corpus_dir()));
  if (train_tokenizer) r.tok = Tokenizer::train(r.o.tokenizer, c.text);
  // Cache key: the text and the tokenizer's identity.
  r.token_cache_key = fnv1a(r.o.tokenizer + ":" + std::to_string(r.tok->vocab_size()), fnv1a(c.text));
  const std::string cache = (fs::path(r.o.out) / "tokens.bin").string();
  if (!fs::exists(r.o.out) || !load_token_cache(cache, r.token_cache_key, r.tokens)) {
    r.tokens = r.tok->encode(c.text);
    // A new run's folder does not exist yet: train() saves the cache once it has made it.
    if (fs::exists(r.o.out)) save_token_cache(cache, r.token_cache_key, r.tokens);
  }
  r.split = split_tokens(r.tokens, r.o.val_fraction);
  const int64_t need = r.o.model.ctx + 1;
  TOY_CHECK(int64_t(r.split.val.size()) >= need && int64_t(r.split.train.size()) >= need,
            "[train] the corpus has {} tokens: too small for windows of ctx + 1 = {} tokens in both the training "
            "({}) and validation ({}) splits; give more text or a smaller --ctx",
            r.tokens.size(), need, r.split.train.size(), r.split.val.size());
}

double estimate_loss(Run& r, const std::vector<int32_t>& tokens, uint64_t which) {
  NoGradGuard ng;
  BatchSampler s(&tokens, r.o.model.ctx, r.o.batch, which == 0 ? "training" : "validation");
  Generator g(r.o.seed, (kEvalStream << 32) + which * 1000003u + uint64_t(r.step));
  double total = 0;
  for (int64_t i = 0; i < r.o.eval_batches; ++i) {
    Tensor x, y;
    s.sample(g, x, y);
    total += r.model->loss(x, y).item();
  }
  return total / double(r.o.eval_batches);
}

std::string generate_sample(Run& r, int64_t n_tokens) {
  NoGradGuard ng;
  Sampler sampler({0.8f, 200, 1.0f}, r.o.seed ^ (kSampleStream << 40) ^ uint64_t(r.step));
  // Prompt: the first token of the validation split (a newline for most text).
  const int32_t first = r.split.val.empty() ? 0 : r.split.val[0];
  std::string text = r.tok->decode(std::span<const int32_t>(&first, 1));
  generate(*r.model, *r.tok, sampler, {first}, n_tokens, [&](const std::string& piece) { text += piece; });
  return text;
}

void save_checkpoint(Run& r) {
  gguf::Writer w;
  add_model_to_gguf(w, *r.model, *r.tok, "toy checkpoint");
  for (const Tensor& p : r.model->params().all()) {
    w.add_tensor("opt.m." + p.name(), r.opt->m(p.name()));
    w.add_tensor("opt.v." + p.name(), r.opt->v(p.name()));
  }
  nlohmann::json state = {{"step", r.step},
                          {"optimizer_steps", r.opt->steps()},
                          {"data_rng", r.data_gen.offset()},
                          {"dropout_rng", r.dropout_gen.offset()},
                          {"train_seconds", r.train_seconds},
                          {"tokens_seen", r.tokens_seen}};
  w.set("toy.train.options", gguf::Value::str(r.o.to_json().dump()));
  w.set("toy.train.state", gguf::Value::str(state.dump()));
  w.write(checkpoint_path(r.o.out));
}

void load_checkpoint(Run& r, const std::string& dir) {
  const std::string path = checkpoint_path(dir);
  TOY_CHECK(fs::exists(path), "[train] no checkpoint to resume in '{}' (expected {})", dir, path);
  gguf::Reader rd(path);
  r.o = TrainOptions::from_json(nlohmann::json::parse(rd.get_str("toy.train.options")));
  r.o.out = dir;
  LoadedModel lm = load_model(rd);
  r.model = std::move(lm.model);
  r.tok = std::move(lm.tokenizer);
  r.opt = std::make_unique<AdamW>(r.model->params(), AdamWConfig{r.o.beta1, r.o.beta2, 1e-8f, r.o.weight_decay});
  NoGradGuard ng;
  for (const Tensor& p : r.model->params().all()) {
    copy_(r.opt->m(p.name()), rd.tensor("opt.m." + p.name()));
    copy_(r.opt->v(p.name()), rd.tensor("opt.v." + p.name()));
  }
  const nlohmann::json st = nlohmann::json::parse(rd.get_str("toy.train.state"));
  r.step = st.at("step");
  r.opt->set_steps(st.at("optimizer_steps"));
  r.data_gen = Generator(r.o.seed, kDataStream);
  r.data_gen.set_offset(st.at("data_rng"));
  r.dropout_gen = Generator(r.o.seed, kDropoutStream);
  r.dropout_gen.set_offset(st.at("dropout_rng"));
  r.train_seconds = st.at("train_seconds");
  r.tokens_seen = st.at("tokens_seen");
}

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, int(t % 3600 / 60));
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, int(t % 60));
  return fmt::format("{}s", t);
}

TrainResult run_loop(Run& r, bool resumed) {
  const TrainOptions& o = r.o;
  r.tty = isatty(fileno(stdout)) && !o.quiet;
  EventLog events((fs::path(o.out) / "events.jsonl").string(), resumed);
  nlohmann::json start = provenance();
  start["resumed"] = resumed;
  start["step"] = r.step;
  start["config"] = o.to_json();
  start["model"] = r.model->config().to_json();
  start["params"] = r.model->params().numel();
  start["data"] = {{"files", r.files}, {"tokens", r.tokens.size()}, {"train_tokens", r.split.train.size()},
                   {"val_tokens", r.split.val.size()}, {"tokenizer", o.tokenizer},
                   {"vocab", r.tok->vocab_size()}};
  events.emit("run_start", start);
  log_line(r, fmt::format("toy train: {} parameters, vocab {}, {} training / {} validation tokens, {} threads",
                          r.model->params().numel(), r.tok->vocab_size(), r.split.train.size(), r.split.val.size(),
                          num_threads()));

  BatchSampler train_s(&r.split.train, o.model.ctx, o.batch, "training");
  const int64_t tokens_per_step = o.batch * o.model.ctx * o.accum;
  const int64_t end_step = o.steps;
  TrainResult res;
  res.out = o.out;
  double last_loss = NAN;
  auto evaluate = [&] {
    const double tl = estimate_loss(r, r.split.train, 0), vl = estimate_loss(r, r.split.val, 1);
    res.train_loss = tl;
    res.val_loss = vl;
    events.emit("eval", {{"step", r.step}, {"train_loss", tl}, {"val_loss", vl}, {"batches", o.eval_batches}});
    log_line(r, fmt::format("step {:>6}  eval: train loss {:.4f}  val loss {:.4f}", r.step, tl, vl));
  };
  // A failed sample (it is only a preview) is logged, and training goes on.
  auto sample = [&] {
    if (o.sample_tokens == 0) return;
    std::string text;
    try {
      text = generate_sample(r, o.sample_tokens);
    } catch (const std::exception& e) {
      r.model->reset_cache();
      log_line(r, fmt::format("sample at step {} failed: {}", r.step, e.what()));
      return;
    }
    events.emit("sample", {{"step", r.step}, {"text", text}});
    if (!o.quiet) log_line(r, fmt::format("--- sample at step {} ---\n{}\n---", r.step, text));
  };

  const auto session_start = Clock::now();
  // g_stop is not cleared here: a Ctrl-C during set-up must still stop the run (after its
  // first step); it is cleared once a stop has been honoured.
  while (r.step < end_step) {
    const auto t0 = Clock::now();
    const float lr = cosine_lr(r.step, o.warmup, o.steps, o.lr, o.min_lr);
    StepResult st;
    try {
      st = train_step(*r.model, *r.opt, train_s, r.data_gen, r.dropout_gen, o.accum, o.clip, lr);
    } catch (const Error& e) {
      fail("{} at step {}", e.what(), r.step + 1);
    }
    ++r.step;
    last_loss = st.loss;
    const double gnorm = st.grad_norm;
    const double dt = since(t0);
    r.train_seconds += dt;
    r.tokens_seen += tokens_per_step;
    const double tps = double(r.tokens_seen) / std::max(r.train_seconds, 1e-9);
    events.emit("step", {{"step", r.step}, {"loss", last_loss}, {"lr", json_float(lr)}, {"grad_norm", gnorm},
                         {"tokens_per_s", double(tokens_per_step) / std::max(dt, 1e-9)}});
    const double eta = double(end_step - r.step) * r.train_seconds / double(std::max<int64_t>(1, r.step));
    if (r.tty) {
      std::printf("\r\033[Kstep %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s", (long long)r.step,
                  (long long)end_step, last_loss, lr, tps, fmt_duration(eta).c_str());
      std::fflush(stdout);
    } else if (r.step % o.log_every == 0 || r.step == 1) {
      log_line(r, fmt::format("step {:>6}/{}  loss {:.4f}  lr {:.2e}  {:.0f} tok/s  ETA {}", r.step, end_step, last_loss,
                              lr, tps, fmt_duration(eta)));
    }
    const bool last = r.step == end_step;
    if (!last && o.eval_every > 0 && r.step % o.eval_every == 0) evaluate();
    if (!last && o.sample_every > 0 && r.step % o.sample_every == 0) sample();
    if (!last && (g_stop || (o.stop_after > 0 && r.step >= o.stop_after))) {
      res.stopped = true;
      g_stop = false;
      break;
    }
  }
  // Weights first: nothing after the last step may lose them.
  save_checkpoint(r);
  save_model((fs::path(o.out) / "model.gguf").string(), *r.model, *r.tok, "toy");
  if (!res.stopped) {
    evaluate();
    sample();
  }
  res.steps = r.step;
  res.last_step_loss = last_loss;
  res.seconds = r.train_seconds;
  res.tokens_per_s = double(r.tokens_seen) / std::max(r.train_seconds, 1e-9);
  if (res.stopped) {
    log_line(r, fmt::format("stopped at step {}: checkpoint written; continue with toy train --resume {}", r.step, o.out));
  }
  events.emit("run_end", {{"steps", res.steps}, {"train_loss", res.train_loss}, {"val_loss", res.val_loss},
                          {"last_step_loss", last_loss}, {"seconds", res.seconds}, {"tokens_per_s", res.tokens_per_s},
                          {"stopped", res.stopped}, {"session_seconds", since(session_start)}});
  write_report((fs::path(o.out) / "events.jsonl").string(), (fs::path(o.out) / "report.html").string());
  return res;
}

}  // namespace

TrainResult train(const TrainOptions& opts) {
  opts.validate();
  Run r;
  r.o = opts;
  if (opts.threads) set_num_threads(opts.threads);
  r.tty = isatty(fileno(stdout)) && !opts.quiet;
  // Everything that can fail on bad input happens before the run folder is written.
  load_data(r, true);
  ModelConfig mc = opts.model;
  mc.vocab = r.tok->vocab_size();
  mc.resolve();
  mc.validate();
  r.o.model = mc;
  std::error_code ec;
  fs::create_directories(opts.out, ec);
  TOY_CHECK(!ec, "[train] cannot create the run folder '{}': {}", opts.out, ec.message());
  const std::string cache = (fs::path(opts.out) / "tokens.bin").string();
  if (!fs::exists(cache)) save_token_cache(cache, r.token_cache_key, r.tokens);
  r.model = std::make_unique<DecoderLM>(mc);
  r.model->init(opts.seed);
  r.opt = std::make_unique<AdamW>(r.model->params(), AdamWConfig{opts.beta1, opts.beta2, 1e-8f, opts.weight_decay});
  r.data_gen = Generator(opts.seed, kDataStream);
  r.dropout_gen = Generator(opts.seed, kDropoutStream);
  return run_loop(r, false);
}

TrainResult resume(const std::string& dir, const std::function<void(TrainOptions&)>& override_fn) {
  Run r;
  load_checkpoint(r, dir);
  r.o.stop_after = 0;  // a stop point belongs to the session that set it
  if (override_fn) override_fn(r.o);
  r.o.validate();
  if (r.o.threads) set_num_threads(r.o.threads);
  load_data(r, false);
  TOY_CHECK(r.step < r.o.steps, "[train] the run in '{}' already finished its {} steps (pass a larger --steps to go on)",
            dir, r.o.steps);
  return run_loop(r, true);
}

}  // namespace toy
