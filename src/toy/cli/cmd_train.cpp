// `toy train`: train a decoder-only LM from scratch on text (see train/trainer.h).
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <memory>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/shape_flags.h"
#include "toy/cli/stop_signals.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/train/trainer.h"

namespace fs = std::filesystem;

namespace toy::cli {

namespace {

struct TrainFlags {
  TrainOptions o;
  std::string resume;
  bool json = false;
  ShapeFlags shape;  // the preset and overrides on top of it
  std::optional<int64_t> ctx;
};

void print_result(const TrainResult& r, bool json) {
  if (!json) return;
  nlohmann::json j = {{"steps", r.steps},          {"train_loss", r.train_loss}, {"val_loss", r.val_loss},
                      {"last_step_loss", r.last_step_loss}, {"tokens_per_s", r.tokens_per_s},
                      {"seconds", r.seconds},      {"out", r.out},             {"stopped", r.stopped},
                      {"model", r.model},          {"best_step", r.best_step}, {"best_val_loss", r.best_val_loss}};
  std::printf("%s\n", j.dump().c_str());
}

ModelConfig build_model(const TrainFlags& f) {
  ModelConfig m = shape_from_flags(f.shape);
  if (f.ctx) m.ctx = *f.ctx;
  return m;
}

// The layer kinds as letters (d: Gated DeltaNet, c: short conv, a: attention), one per layer.
std::string layer_pattern(const ModelConfig& m) {
  std::string s;
  for (int64_t l = 0; l < m.layers; ++l)
    s += m.layer_kind(l) == LayerKind::GatedDeltaNet ? 'd' : m.layer_kind(l) == LayerKind::ShortConv ? 'c' : 'a';
  return s;
}

// What each flag of `toy train` does on --resume. Fixed flags say what the run is: given
// again with the value the run was started with they are fine (a user re-runs the command
// line with --resume added); another value is refused naming both. Cadence flags say how the
// run proceeds and may change. Every flag must have a rule: add_train_command refuses to
// start otherwise, so a new flag cannot be silently ignored on resume.
enum class OnResume { Fixed, MayChange, NotSaved };
struct ResumeRule {
  OnResume what;
  std::function<std::string(const TrainOptions&)> value;  // Fixed: the value compared
  std::function<void(TrainOptions& saved, const TrainOptions& given)> apply;  // MayChange
};

const std::map<std::string, ResumeRule>& resume_rules() {
  auto fixed = [](auto get) {
    return ResumeRule{OnResume::Fixed, [get](const TrainOptions& o) { return fmt::format("{}", get(o)); }, {}};
  };
  auto may_change = [](auto set) { return ResumeRule{OnResume::MayChange, {}, set}; };
  const ResumeRule not_saved{OnResume::NotSaved, {}, {}};
  static const std::map<std::string, ResumeRule> rules = {
      {"--preset", fixed([](const TrainOptions& o) { return o.model.preset; })},
      {"--tokenizer", fixed([](const TrainOptions& o) { return o.tokenizer; })},
      {"--layers", fixed([](const TrainOptions& o) { return o.model.layers; })},
      {"--heads", fixed([](const TrainOptions& o) { return o.model.heads; })},
      {"--kv-heads", fixed([](const TrainOptions& o) { return o.model.kv_heads; })},
      {"--dim", fixed([](const TrainOptions& o) { return o.model.dim; })},
      {"--ffn", fixed([](const TrainOptions& o) { return o.model.ffn; })},
      {"--ctx", fixed([](const TrainOptions& o) { return o.model.ctx; })},
      {"--norm", fixed([](const TrainOptions& o) { return to_string(o.model.norm); })},
      {"--mlp", fixed([](const TrainOptions& o) { return to_string(o.model.mlp); })},
      {"--pos", fixed([](const TrainOptions& o) { return to_string(o.model.pos); })},
      {"--bias", fixed([](const TrainOptions& o) { return int(o.model.bias); })},
      {"--tied", fixed([](const TrainOptions& o) { return int(o.model.tied); })},
      {"--dropout", fixed([](const TrainOptions& o) { return o.model.dropout; })},
      {"--init-scale", fixed([](const TrainOptions& o) { return o.model.init_scale; })},
      {"--depth-scale", fixed([](const TrainOptions& o) { return o.model.depth_scale ? "on" : "off"; })},
      {"--layer-kinds", fixed([](const TrainOptions& o) { return layer_pattern(o.model); })},
      {"--full-attention-interval", fixed([](const TrainOptions& o) { return layer_pattern(o.model); })},
      {"--gdn-heads", fixed([](const TrainOptions& o) { return o.model.gdn.v_heads; })},
      {"--gdn-k-heads", fixed([](const TrainOptions& o) { return o.model.gdn.k_heads; })},
      {"--gdn-head-dim", fixed([](const TrainOptions& o) { return o.model.gdn.head_dim; })},
      {"--conv-kernel", fixed([](const TrainOptions& o) { return o.model.gdn.conv_kernel; })},
      {"--batch", fixed([](const TrainOptions& o) { return o.batch; })},
      {"--accum", fixed([](const TrainOptions& o) { return o.accum; })},
      {"--lr", fixed([](const TrainOptions& o) { return o.lr; })},
      {"--min-lr", fixed([](const TrainOptions& o) { return o.min_lr; })},
      {"--warmup", fixed([](const TrainOptions& o) { return o.warmup; })},
      {"--wd", fixed([](const TrainOptions& o) { return o.weight_decay; })},
      {"--beta1", fixed([](const TrainOptions& o) { return o.beta1; })},
      {"--beta2", fixed([](const TrainOptions& o) { return o.beta2; })},
      {"--clip", fixed([](const TrainOptions& o) { return o.clip; })},
      {"--moe-aux-loss", fixed([](const TrainOptions& o) { return o.moe_aux_loss; })},
      {"--experts", fixed([](const TrainOptions& o) { return o.model.moe.experts; })},
      {"--experts-used", fixed([](const TrainOptions& o) { return o.model.moe.used; })},
      {"--expert-ffn", fixed([](const TrainOptions& o) { return o.model.moe.ffn; })},
      {"--seed", fixed([](const TrainOptions& o) { return o.seed; })},
      {"--data", not_saved},  // compared as paths below
      {"--out", not_saved},   // must name the --resume folder (checked below)
      {"--steps", may_change([](TrainOptions& s, const TrainOptions& g) { s.steps = g.steps; })},
      {"--stop-after", may_change([](TrainOptions& s, const TrainOptions& g) { s.stop_after = g.stop_after; })},
      {"--threads", may_change([](TrainOptions& s, const TrainOptions& g) { s.threads = g.threads; })},
      {"--device", may_change([](TrainOptions& s, const TrainOptions& g) { s.device = g.device; })},
      {"--eval-every", may_change([](TrainOptions& s, const TrainOptions& g) { s.eval_every = g.eval_every; })},
      {"--eval-batches", may_change([](TrainOptions& s, const TrainOptions& g) { s.eval_batches = g.eval_batches; })},
      {"--sample-every", may_change([](TrainOptions& s, const TrainOptions& g) { s.sample_every = g.sample_every; })},
      {"--sample-tokens",
       may_change([](TrainOptions& s, const TrainOptions& g) { s.sample_tokens = g.sample_tokens; })},
      {"--log-every", may_change([](TrainOptions& s, const TrainOptions& g) { s.log_every = g.log_every; })},
      {"--save-every", may_change([](TrainOptions& s, const TrainOptions& g) { s.save_every = g.save_every; })},
      {"--save-minutes", may_change([](TrainOptions& s, const TrainOptions& g) { s.save_minutes = g.save_minutes; })},
      {"--precision", may_change([](TrainOptions& s, const TrainOptions& g) { s.precision = g.precision; })},
      {"--keep", may_change([](TrainOptions& s, const TrainOptions& g) { s.keep = g.keep; })},
      {"--quiet", may_change([](TrainOptions& s, const TrainOptions& g) { s.quiet = g.quiet; })},
      {"--allow-data-change",
       may_change([](TrainOptions& s, const TrainOptions& g) { s.allow_data_change = g.allow_data_change; })},
      {"--zero", may_change([](TrainOptions& s, const TrainOptions& g) { s.zero = g.zero; })},
      {"--dp-bucket-mb", may_change([](TrainOptions& s, const TrainOptions& g) { s.dp_bucket_mb = g.dp_bucket_mb; })},
      {"--dp-overlap", may_change([](TrainOptions& s, const TrainOptions& g) { s.dp_overlap = g.dp_overlap; })},
      {"--dp-timeout", may_change([](TrainOptions& s, const TrainOptions& g) { s.dp_timeout = g.dp_timeout; })},
      {"--resume", not_saved},
      {"--force", not_saved},
      {"--json", not_saved},
      {"--help", not_saved},
      {"--help-all", not_saved},
  };
  return rules;
}

// Applies the command line to the options saved in a checkpoint (see resume_rules()).
void apply_resume_flags(const CLI::App* cmd, const TrainFlags& f, TrainOptions& saved) {
  TrainOptions given = f.o;
  given.model = build_model(f);
  saved.stop_after = 0;  // a stop point belongs to the session that set it
  for (const auto& [flag, rule] : resume_rules()) {
    if (cmd->count(flag) == 0) continue;
    if (rule.what == OnResume::MayChange) rule.apply(saved, given);
    if (rule.what != OnResume::Fixed) continue;
    const std::string was = rule.value(saved), now = rule.value(given);
    TOY_CHECK(was == now, "[train] {} cannot change when resuming: the run was started with {} {}, this command gives "
              "{} (leave it out, or start a new run)", flag, flag, printable(was), printable(now));
  }
  if (cmd->count("--data")) {
    bool same = given.data.size() == saved.data.size();
    for (size_t i = 0; same && i < given.data.size(); ++i) same = same_path(given.data[i], saved.data[i]);
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : " ") + printable(x);
      return s.empty() ? std::string("(none: the default corpus)") : s;
    };
    TOY_CHECK(same, "[train] --data cannot change when resuming: the run was started with --data {}, this command "
              "gives --data {}", join(saved.data), join(given.data));
  }
  if (cmd->count("--out"))
    TOY_CHECK(same_path(given.out, f.resume), "[train] --out '{}' and --resume '{}' name different folders",
              printable(given.out), printable(f.resume));
}

}  // namespace

Run add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a language model from scratch on text");
  auto f = std::make_shared<TrainFlags>();
  TrainOptions& o = f->o;
  cmd->add_option("--data", o.data, "Text file(s) or folder(s) (default: the license texts every Debian system has)");
  cmd->add_option("--out", o.out, "Run folder: model.gguf, checkpoint.gguf, events.jsonl, report.html");
  auto* resume_opt = cmd->add_option("--resume", f->resume, "Continue the run in this folder from its checkpoint");
  cmd->add_flag("--force", o.force, "Replace the run already in --out (only toy's own run files are removed)")
      ->excludes(resume_opt);
  cmd->add_flag("--allow-data-change", o.allow_data_change,
                "With --resume: continue even though the training data changed since the checkpoint")
      ->needs(resume_opt);
  add_shape_flags(cmd, f->shape, "gpt");
  cmd->add_option("--tokenizer", o.tokenizer, "char, byte or bpe:N (N merges learned from the data)")
      ->capture_default_str();
  add_int(cmd, "--ctx", f->ctx, 1, int64_t(1) << 24, "Context length (tokens per window)");
  add_int(cmd, "--batch", o.batch, 1, int64_t(1) << 20, "Windows per micro-batch");
  add_int(cmd, "--accum", o.accum, 1, int64_t(1) << 16, "Micro-batches per optimizer step (gradient accumulation)");
  add_int(cmd, "--steps", o.steps, 1, int64_t(1) << 40, "Optimizer steps");
  add_real(cmd, "--lr", o.lr, {0, 1, true}, "Peak learning rate");
  add_real(cmd, "--min-lr", o.min_lr, {0, 1}, "Learning rate at the end of the cosine decay");
  add_int(cmd, "--warmup", o.warmup, 0, int64_t(1) << 40, "Linear warmup steps");
  add_real(cmd, "--wd", o.weight_decay, {0, 1, false, true}, "AdamW weight decay (matrices only)");
  add_real(cmd, "--beta1", o.beta1, {0, 1, false, true}, "AdamW beta1");
  add_real(cmd, "--beta2", o.beta2, {0, 1, false, true}, "AdamW beta2");
  add_real(cmd, "--clip", o.clip, {0, 1e9}, "Gradient clipping: max global norm (0 = off)");
  add_real(cmd, "--moe-aux-loss", o.moe_aux_loss, {0, 100},
           "Mixture of experts: weight of the load-balancing loss (Switch Transformer's; 0 = off, 0.001 typical)");
  add_u64(cmd, "--seed", o.seed, "Seed for init, data order, dropout and samples");
  add_int(cmd, "--eval-every", o.eval_every, 0, int64_t(1) << 40, "Steps between loss estimates (0 = only at the end)");
  add_int(cmd, "--eval-batches", o.eval_batches, 1, int64_t(1) << 20, "Batches per train/val loss estimate");
  add_int(cmd, "--sample-every", o.sample_every, 0, int64_t(1) << 40, "Steps between samples (0 = only at the end)");
  add_int(cmd, "--sample-tokens", o.sample_tokens, 0, int64_t(1) << 20, "Tokens per sample");
  add_int(cmd, "--log-every", o.log_every, 1, int64_t(1) << 40, "Steps between progress lines when not on a terminal");
  add_int(cmd, "--threads", o.threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_device(cmd, o.device);
  add_int(cmd, "--stop-after", o.stop_after, 0, int64_t(1) << 40,
          "Stop after this step with a checkpoint (resume with --resume)");
  add_int(cmd, "--save-every", o.save_every, 0, int64_t(1) << 40, "Write a checkpoint every N steps (0 = off)");
  add_real(cmd, "--save-minutes", o.save_minutes, {0, 1e6},
           "Write a checkpoint at least every M minutes of training (0 = off)");
  cmd->add_option("--precision", o.precision,
                  "f32, or bf16: the projections multiply in BF16 with f32 accumulation over F32 master weights "
                  "(on a GPU their products run on the tensor cores)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--keep", o.keep, "What model.gguf holds: best (validation; last.gguf has the last step) or last "
                  "(best.gguf has the best)")
      ->capture_default_str()
      ->check(CLI::IsMember({"best", "last"}));
  add_data_parallel_flags(cmd, o);
  cmd->add_flag("--quiet", o.quiet, "No progress output");
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last line of stdout");
  for (const CLI::Option* opt : cmd->get_options())
    if (!resume_rules().count(opt->get_name()))
      throw std::logic_error("toy train: flag " + opt->get_name() + " has no rule for --resume (cmd_train.cpp)");
  return [cmd, f]() -> int {
    install_stop_signals();
    TrainResult r;
    if (!f->resume.empty()) {
      TrainFlags* fl = f.get();
      r = resume(f->resume, [fl, cmd](TrainOptions& saved) { apply_resume_flags(cmd, *fl, saved); });
    } else {
      f->o.model = build_model(*f);
      r = train(f->o);
    }
    if (writes_run_files()) print_result(r, f->json);
    // (Data-parallel: a stop signal to any rank stops all at one step with a checkpoint, and
    // the run ends as a whole with 0: the ranks that got no signal have nothing to report.)
    if (dist::world().size() > 1) return 0;
    return r.stopped ? stop_signal_exit_code() : 0;  // (--stop-after is no signal: 0)
  };
}

}  // namespace toy::cli
