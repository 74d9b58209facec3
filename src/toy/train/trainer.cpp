#include "toy/train/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/core/files.h"
#include "toy/core/json_fields.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/infer/generate.h"
#include "toy/infer/sampler.h"
#include "toy/io/model_file.h"
#include "toy/obs/events.h"
#include "toy/obs/progress.h"
#include "toy/obs/report.h"
#include "toy/ops/ops.h"
#include "toy/train/memory.h"
#include "toy/train/run_folder.h"
#include "toy/train/run_state.h"
#include "toy/train/step.h"

namespace fs = std::filesystem;

namespace toy {

namespace {
std::atomic<bool> g_stop{false};  // set by request_stop(); the loop honours and clears it
static_assert(std::atomic<bool>::is_always_lock_free, "set from signal handlers");
}  // namespace

void request_stop() { g_stop = true; }
bool stop_requested() { return g_stop; }
void clear_stop_request() { g_stop = false; }

// ---- options ------------------------------------------------------------------------------------

void TrainOptions::validate() const {
  TOY_CHECK(!out.empty(), "[train] --out (the run folder) is required");
  validate_loop("[train]");
  // From scratch, a step larger than 1 or a decay of the whole weight each step is a typo.
  TOY_CHECK(lr <= 1, "[train] --lr must be in (0, 1], got {}", lr);
  TOY_CHECK(weight_decay < 1, "[train] --wd must be in [0, 1), got {}", weight_decay);
  TOY_CHECK(std::isfinite(min_lr), "[train] --min-lr must be in [0, lr], got {}", min_lr);
  TOY_CHECK(steps > 0, "[train] --steps must be >= 1, got {}", steps);
  TOY_CHECK(eval_every >= 0, "[train] --eval-every must be >= 0, got {}", eval_every);
  TOY_CHECK(sample_every >= 0, "[train] --sample-every must be >= 0, got {}", sample_every);
  TOY_CHECK(keep == "best" || keep == "last", "[train] --keep must be best or last, got '{}'", printable(keep));
  TOY_CHECK(precision == "f32" || precision == "bf16", "[train] --precision must be f32 or bf16, got '{}'",
            printable(precision));
  TOY_CHECK(eval_batches > 0 && eval_batches <= 1 << 20, "[train] --eval-batches must be in 1..1048576, got {}",
            eval_batches);
  TOY_CHECK(sample_tokens >= 0, "[train] --sample-tokens must be >= 0, got {}", sample_tokens);
  TOY_CHECK(val_fraction > 0 && val_fraction < 1, "[train] validation fraction must be in (0, 1), got {}",
            val_fraction);
  TOY_CHECK(threads >= 0 && threads <= kMaxThreads, "[train] --threads must be in 0..{}, got {}", kMaxThreads, threads);
  TOY_CHECK(tokenizer == "char" || tokenizer == "byte" || tokenizer.rfind("bpe:", 0) == 0,
            "[train] --tokenizer must be char, byte or bpe:N, got '{}'", printable(tokenizer));
  ModelConfig m = model;
  if (m.vocab == 0) m.vocab = 1;  // known only after the tokenizer is trained
  m.resolve();
  m.validate();
}

nlohmann::json TrainOptions::to_json() const {
  nlohmann::json j = {{"data", data},
                      {"out", out},
                      {"tokenizer", tokenizer},
                      {"model", model.to_json()},
                      {"steps", steps},
                      {"eval_every", eval_every},
                      {"eval_batches", eval_batches},
                      {"sample_every", sample_every},
                      {"sample_tokens", sample_tokens},
                      {"val_fraction", val_fraction},
                      {"threads", threads},
                      {"keep", keep},
                      {"precision", precision}};
  loop_to_json(j);
  return j;
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  TrainOptions o;
  o.data.clear();
  for (const auto& d : get_array(j, "data", where)) {
    TOY_CHECK(d.is_string(), "{}: field 'data' must be an array of paths", where);
    o.data.push_back(d.get<std::string>());
  }
  o.out = get_string(j, "out", where);
  o.tokenizer = get_string(j, "tokenizer", where);
  o.model = ModelConfig::from_json(get_object(j, "model", where), where + " model");
  o.loop_from_json(j, where);
  o.steps = get_int(j, "steps", where);
  o.eval_every = get_int(j, "eval_every", where);
  o.eval_batches = get_int(j, "eval_batches", where);
  o.sample_every = get_int(j, "sample_every", where);
  o.sample_tokens = get_int(j, "sample_tokens", where);
  o.val_fraction = get_double(j, "val_fraction", where);
  const int64_t threads = get_int(j, "threads", where);
  TOY_CHECK(threads >= 0 && threads <= kMaxThreads, "{}: threads {} is outside 0..{}", where, threads, kMaxThreads);
  o.threads = int(threads);
  o.keep = get_string(j, "keep", where);
  // (runs made before mixed precision have no such field: they trained in f32)
  o.precision = j.contains("precision") ? get_string(j, "precision", where) : "f32";
  try {
    o.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return o;
}

// ---- the run ------------------------------------------------------------------------------------

namespace {

void log_line(const Run& r, const std::string& s) { ProgressLine(stdout, r.o.quiet, 1).line(s); }

// Notes go to stderr (even with --quiet: they report something the user should know).
void note(const std::string& s) { std::fprintf(stderr, "toy train: %s\n", s.c_str()); }

// Lists the corpus and checks that reading and encoding it fits in memory.
CorpusListing list_data(const TrainOptions& o) {
  CorpusListing listing = list_corpus(o.data);
  for (const std::string& n : listing.notes) note(n);
  const double need = corpus_memory(listing.bytes), avail = double(available_memory_bytes());
  TOY_CHECK(need <= avail, "[data] the corpus is {} ({} files); reading and encoding it needs about {}, more than the "
            "{} available: train on less text", format_bytes(double(listing.bytes)), listing.files.size(),
            format_bytes(need), format_bytes(avail));
  return listing;
}

// Describes how the corpus differs from the one a checkpoint recorded ("" when it does not).
std::string corpus_changes(const std::vector<CorpusFile>& saved, const std::vector<CorpusFile>& now) {
  std::vector<std::string> changed, added, removed;
  for (const CorpusFile& s : saved) {
    auto it = std::find_if(now.begin(), now.end(), [&](const CorpusFile& n) { return n.path == s.path; });
    if (it == now.end())
      removed.push_back(s.path);
    else if (it->hash != s.hash || it->bytes != s.bytes)
      changed.push_back(s.path);
  }
  for (const CorpusFile& n : now)
    if (std::none_of(saved.begin(), saved.end(), [&](const CorpusFile& s) { return s.path == n.path; }))
      added.push_back(n.path);
  std::string out;
  auto part = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    out += fmt::format("{}{}: ", out.empty() ? "" : "; ", what);
    for (size_t i = 0; i < v.size() && i < 8; ++i) out += (i ? ", " : "") + printable(v[i]);
    if (v.size() > 8) out += fmt::format(" and {} more", v.size() - 8);
  };
  part("changed", changed);
  part("added", added);
  part("removed", removed);
  return out;
}

// Reads and encodes the corpus (through the token cache in the run folder when there is one).
void load_data(Run& r, const CorpusListing& listing, bool train_tokenizer, bool resumed) {
  Corpus c = read_corpus(listing);
  r.files = c.files;
  if (resumed) {
    const std::string diff = r.corpus_hash == c.hash ? std::string() : corpus_changes(r.corpus, c.identity);
    if (r.corpus_hash != c.hash) {
      const std::string what = diff.empty() ? std::string("the same files hold different text") : diff;
      TOY_CHECK(r.o.allow_data_change,
                "[train] the training data changed since the checkpoint ({}): resuming would train on other text than "
                "the run started with; restore the data, or pass --allow-data-change to continue on the new text",
                what);
      note(fmt::format("the training data changed since the checkpoint ({}); continuing on the new text "
                       "(--allow-data-change)", what));
    }
  }
  r.corpus = c.identity;
  r.corpus_hash = c.hash;
  if (!r.o.quiet && r.o.data.empty())
    log_line(r, fmt::format("toy train: no --data given; training on the {} license texts in {} (every Debian/Ubuntu "
                            "system has them)", c.files.size(), default_corpus_dir()));
  if (train_tokenizer) r.tok = Tokenizer::train(r.o.tokenizer, c.text);
  // Cache key: the text and the tokenizer's identity.
  r.token_cache_key = fnv1a(r.o.tokenizer + ":" + std::to_string(r.tok->vocab_size()), c.hash);
  const std::string cache = (fs::path(r.o.out) / "tokens.bin").string();
  std::error_code ec;
  // At most one token per byte of text (every tokenizer here), so a cache claiming more is
  // stale before anything is allocated for it.
  if (!fs::is_directory(r.o.out, ec) ||
      !load_token_cache(cache, r.token_cache_key, r.tok->vocab_size(), c.text.size(), r.tokens)) {
    try {
      r.tokens = r.tok->encode(c.text);
    } catch (const Error& e) {
      if (resumed) fail("{} (the run's vocabulary was built from the text it started with)", e.what());
      throw;
    }
    // A new run's folder does not exist yet: train() saves the cache once it has made it.
    if (resumed) save_token_cache(cache, r.token_cache_key, r.tokens);
  }
  r.split = split_tokens(r.tokens, r.o.val_fraction);
  const int64_t need = r.o.model.ctx + 1;
  TOY_CHECK(int64_t(r.split.val.size()) >= need && int64_t(r.split.train.size()) >= need,
            "[train] the corpus has {} tokens: too small for windows of ctx + 1 = {} tokens in both the training "
            "({}) and validation ({}) splits; give more text or a smaller --ctx",
            r.tokens.size(), need, r.split.train.size(), r.split.val.size());
}

// Data-parallel: the batches are split over the ranks (each still draws every batch's windows,
// so that batch i is the same whoever computes it) and summed in batch order.
double estimate_loss(Run& r, const std::vector<int32_t>& tokens, uint64_t which) {
  NoGradGuard ng;
  BatchSampler s(&tokens, r.o.model.ctx, r.o.batch, which == 0 ? "training" : "validation");
  Generator g(r.o.seed, (kEvalStream << 32) + which * 1000003u + uint64_t(r.loop.step));
  std::vector<std::pair<Tensor, Tensor>> batches(size_t(r.o.eval_batches));
  for (auto& [x, y] : batches) s.sample(g, x, y);
  const std::vector<double> losses = dist::share_items(
      r.o.eval_batches, [&](int64_t i) { return double(r.model->loss(batches[size_t(i)].first, batches[size_t(i)].second).item()); },
      r.o.dp_timeout);
  double total = 0;
  for (double l : losses) total += l;
  return total / double(r.o.eval_batches);
}

std::string generate_sample(Run& r, int64_t n_tokens) {
  NoGradGuard ng;
  Sampler sampler({0.8f, 200, 1.0f}, r.o.seed ^ (kSampleStream << 40) ^ uint64_t(r.loop.step));
  // Prompt: the first token of the validation split (a newline for most text).
  const int32_t first = r.split.val.empty() ? 0 : r.split.val[0];
  std::string text = r.tok->decode(std::span<const int32_t>(&first, 1));
  generate(*r.model, *r.tok, sampler, {first}, n_tokens, [&](const std::string& piece) { text += piece; });
  return text;
}

// Training from scratch as a task of the one loop: windows of the corpus, evaluations every
// eval_every steps (and at the end), samples every sample_every steps (and at the end), the
// checkpoint of checkpoint.cpp, model.gguf and its companion.
class ScratchTask : public WindowTask {
 public:
  ScratchTask(Run& r, const BatchSampler& train_s)
      : WindowTask(*r.model, train_s, r.data_gen, r.dropout_gen), r_(r) {}
  void set_loop(TrainLoop& loop) { loop_ = &loop; }
  TrainResult& result() { return res_; }
  double last_loss() const { return last_loss_; }

  void after_step(const StepDone& d, nlohmann::json&) override { last_loss_ = d.loss; }
  void cadence(const StepDone& d) override {
    if (!d.last && r_.o.eval_every > 0 && d.step % r_.o.eval_every == 0) evaluate();
    if (!d.last && r_.o.sample_every > 0 && d.step % r_.o.sample_every == 0) sample();
  }
  bool final_evaluation() override {
    const bool best = evaluate();
    sample();
    return best;
  }
  void save_checkpoint() override { toy::save_checkpoint(r_); }
  void write_outputs(bool stopped) override {
    const TrainOptions& o = r_.o;
    const BestWeights& best = r_.loop.best;
    res_.stopped = stopped;
    res_.model = write_model_files();
    res_.best_step = best.step;
    res_.best_val_loss = best.has() ? best.score : NAN;
    loop_->events().emit("models", {{"model_gguf", res_.model},
                                    {"companion", o.keep == "best" ? "last.gguf" : "best.gguf"},
                                    {"last_step", r_.loop.step},
                                    {"best_step", res_.best_step},
                                    {"best_val_loss", res_.best_val_loss}});
    if (stopped)
      log_line(r_, fmt::format("stopped at step {}: checkpoint written; continue with toy train --resume {}",
                               r_.loop.step, o.out));
    if (res_.model == "best" && res_.best_step != r_.loop.step)
      log_line(r_, fmt::format("model.gguf holds the best validation weights (step {}, val loss {:.4f}); last.gguf "
                               "the last step's", res_.best_step, res_.best_val_loss));
  }

 private:
  bool evaluate() {
    const double tl = estimate_loss(r_, r_.split.train, 0), vl = estimate_loss(r_, r_.split.val, 1);
    res_.train_loss = tl;
    res_.val_loss = vl;
    const bool best = loop_->offer_best(vl);
    loop_->events().emit("eval", {{"step", r_.loop.step}, {"train_loss", tl}, {"val_loss", vl},
                                  {"batches", r_.o.eval_batches}, {"best", best}});
    log_line(r_, fmt::format("step {:>6}  eval: train loss {:.4f}  val loss {:.4f}{}", r_.loop.step, tl, vl,
                             best ? "  (best so far)" : ""));
    return best;
  }
  // A failed sample (it is only a preview) is logged, and training goes on.
  void sample() {
    if (r_.o.sample_tokens == 0 || !writes_run_files()) return;  // (a preview: rank 0's alone)
    std::string text;
    try {
      text = generate_sample(r_, r_.o.sample_tokens);
    } catch (const std::exception& e) {
      log_line(r_, fmt::format("sample at step {} failed: {}", r_.loop.step, e.what()));
      return;
    }
    loop_->events().emit("sample", {{"step", r_.loop.step}, {"text", text}});
    if (!r_.o.quiet) log_line(r_, fmt::format("--- sample at step {} ---\n{}\n---", r_.loop.step, text));
  }
  // model.gguf and its companion: with keep=best, model.gguf holds the best-validation
  // weights and last.gguf the last step's; with keep=last, the reverse with best.gguf.
  // Returns which weights model.gguf holds.
  std::string write_model_files() {
    const fs::path dir(r_.o.out);
    BestWeights& best = r_.loop.best;
    DecoderLM& m = *r_.model;
    auto save = [&](const char* file, const char* name) {
      if (std::string(file) == "model.gguf") require_finite_weights(m, "[train]", ": not writing model.gguf");
      save_model((dir / file).string(), m, *r_.tok, name);
    };
    // The best weights in the model for one write (and the last step's back after it).
    auto with_best = [&](const std::function<void()>& write) {
      best.swap_with(m.params());
      try {
        write();
      } catch (...) {
        best.swap_with(m.params());
        throw;
      }
      best.swap_with(m.params());
    };
    std::error_code ec;
    if (r_.o.keep == "best") {
      save("last.gguf", "toy (last step)");
      fs::remove(dir / "best.gguf", ec);
      if (best.has())
        with_best([&] { save("model.gguf", "toy"); });
      else
        save("model.gguf", "toy");
      return best.has() ? "best" : "last";
    }
    if (best.has()) with_best([&] { save("best.gguf", "toy (best validation)"); });
    fs::remove(dir / "last.gguf", ec);
    save("model.gguf", "toy");
    return "last";
  }

  Run& r_;
  TrainLoop* loop_ = nullptr;
  TrainResult res_;
  double last_loss_ = NAN;
};

// Data-parallel: every rank must be training the same run on the same text.
void agree_on_start(const Run& r) {
  nlohmann::json options = r.o.to_json();
  nlohmann::json mine = {{"options", options},
                         {"corpus_hash", hex(r.corpus_hash)},
                         {"tokenizer", {{"kind", r.o.tokenizer}, {"vocab", r.tok->vocab_size()},
                                        {"identity", hex(r.token_cache_key)}}},
                         {"step", r.loop.step}};
  dist::agree_on_start(dist::world(), mine, r.o.dp_timeout);
}

TrainResult run_loop(Run& r, bool resumed) {
  const TrainOptions& o = r.o;
  r.model->set_moe_aux_loss(o.moe_aux_loss);
  r.model->set_mixed_precision(precision_type(o.precision));
  BatchSampler train_s(&r.split.train, o.model.ctx, o.batch, "training");
  ScratchTask task(r, train_s);
  LoopSetup setup;
  setup.who = "[train]";
  setup.dir = o.out;
  setup.resumed = resumed;
  setup.total_steps = o.steps;
  setup.resume_command = "toy train --resume " + printable(o.out);
  TrainLoop loop(setup, o, r.loop, r.model->params(), *r.opt, task);
  task.set_loop(loop);
  nlohmann::json start = provenance();
  start["resumed"] = resumed;
  start["step"] = r.loop.step;
  start["config"] = o.to_json();
  start["model"] = r.model->config().to_json();
  start["params"] = r.model->params().numel();
  loop.add_run_start_fields(start);
  start["data"] = {{"files", r.files}, {"tokens", r.tokens.size()}, {"train_tokens", r.split.train.size()},
                   {"val_tokens", r.split.val.size()}, {"tokenizer", o.tokenizer},
                   {"vocab", r.tok->vocab_size()}};
  loop.events().emit("run_start", start);
  log_line(r, fmt::format("toy train: {} parameters, vocab {}, {} training / {} validation tokens, {} threads",
                          r.model->params().numel(), r.tok->vocab_size(), r.split.train.size(), r.split.val.size(),
                          num_threads()));
  TrainResult& res = task.result();
  res.out = o.out;
  loop.run([&] {
    nlohmann::json e = {{"train_loss", res.train_loss}, {"val_loss", res.val_loss},
                        {"last_step_loss", task.last_loss()}};
    if (res.model.size()) e.update({{"model", res.model}, {"best_step", res.best_step},
                                    {"best_val_loss", res.best_val_loss}});
    return e;
  });
  res.steps = r.loop.step;
  res.last_step_loss = task.last_loss();
  res.seconds = r.loop.seconds;
  res.tokens_per_s = double(r.loop.units) / std::max(r.loop.seconds, 1e-9);
  return res;
}

}  // namespace

TrainResult train(const TrainOptions& opts) {
  opts.validate();
  Run r;
  r.o = opts;
  // Saved absolute, so `--resume DIR` finds the data from any working directory.
  for (std::string& d : r.o.data) {
    std::error_code ec;
    const fs::path abs = fs::absolute(d, ec);
    if (!ec) d = abs.lexically_normal().string();
  }
  // Everything that can fail on bad input happens before the run folder is written.
  // (Data-parallel: rank 0 alone writes the run's files; the others only read the data.)
  const bool writer = writes_run_files();
  if (!writer) r.o.quiet = true;
  check_data_parallel(opts, "[train]");
  if (writer) check_new_run_folder(opts.out, opts.force);
  if (opts.threads) set_num_threads(opts.threads);
  load_data(r, list_data(r.o), true, false);
  ModelConfig mc = opts.model;
  mc.vocab = r.tok->vocab_size();
  mc.resolve();
  mc.validate();
  r.o.model = mc;
  check_training_memory(estimate_training_memory(mc, opts.batch), available_memory_bytes(),
                        "lower --batch, --ctx, --dim or --layers");
  agree_on_start(r);
  if (writer) {
    prepare_new_run_folder(opts.out, opts.force);
    save_token_cache((fs::path(opts.out) / "tokens.bin").string(), r.token_cache_key, r.tokens);
  }
  r.model = std::make_unique<DecoderLM>(mc);
  r.model->init(opts.seed);            // on the CPU (the same weights for every device),
  r.model->params().move_to(opts.device);  // then moved once
  r.opt = std::make_unique<AdamW>(r.model->params(), opts.adamw());
  r.data_gen = Generator(opts.seed, kDataStream);
  r.dropout_gen = Generator(opts.seed, kDropoutStream);
  return run_loop(r, false);
}

TrainResult resume(const std::string& dir, const std::function<void(TrainOptions&)>& override_fn) {
  struct stat st {};
  TOY_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "[train] --resume '{}' is not a run folder",
            printable(dir));
  Run r;
  load_checkpoint(r, dir);
  // The run's files are rewritten or appended to: each must be a regular file (a FIFO named
  // events.jsonl would block the run forever).
  for (const std::string& f : run_file_names()) check_output_file((fs::path(dir) / f).string(), "[train]");
  // Only in a folder that holds a valid run: a write killed before its rename left these.
  const bool writer = writes_run_files();
  if (writer)
    for (const std::string& t : remove_stale_temporaries(dir))
      note(fmt::format("removed '{}' left by a write that was interrupted", t));
  r.o.stop_after = 0;  // a stop point belongs to the session that set it
  // The global batch (batch x accum x processes) is the run's: over another number of
  // processes each runs a share of the same micro-batches.
  r.o.accum = accum_for_world(r.o.accum, r.loop.world_size, "[train]", dir, "toy train");
  if (override_fn) override_fn(r.o);
  r.o.validate();
  if (!writer) r.o.quiet = true;
  check_data_parallel(r.o, "[train]");
  if (r.o.threads) set_num_threads(r.o.threads);
  TOY_CHECK(r.loop.step < r.o.steps, "[train] the run in '{}' already finished its {} steps (pass a larger --steps to go on)",
            printable(dir), r.o.steps);
  load_data(r, list_data(r.o), false, true);
  check_training_memory(estimate_training_memory(r.o.model, r.o.batch), available_memory_bytes(),
                        "this run cannot continue on this machine");
  agree_on_start(r);
  r.model->params().move_to(r.o.device);  // the weights and AdamW's moments, read on the CPU
  r.loop.best.move_to(r.o.device);
  return run_loop(r, true);
}

}  // namespace toy
