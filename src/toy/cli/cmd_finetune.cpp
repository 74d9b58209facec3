// `toy finetune -m BASE.gguf --data FILE --method full|lora ... --out DIR [--json]`: fine-tunes
// a model from a GGUF file (train/finetune.h) and writes DIR/model.gguf (merged) and, for
// LoRA, DIR/adapter.gguf. `--resume DIR` continues a run from its checkpoint. --json prints a
// summary as the last line of stdout.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/shape_flags.h"
#include "toy/cli/stop_signals.h"
#include "toy/core/error.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/train/finetune.h"

namespace fs = std::filesystem;

namespace toy::cli {

namespace {

struct FinetuneFlags {
  FinetuneOptions o;
  ShapeFlags shape;
  std::string resume;
  int threads = 0;
  bool json = false;
};

// What each flag does on --resume: the flags that say how the run proceeds may change; any
// other flag, given again, must have the value the run was started with (a user re-runs the
// command line with --resume added); a path names the same file. Every flag has a rule:
// add_finetune_command refuses to start otherwise.
enum class OnResume { Fixed, Path, Shape, MayChange, NotSaved };
struct ResumeRule {
  OnResume what;
  const char* key = "";  // the options' JSON field (Fixed, Path)
};

const std::map<std::string, ResumeRule>& resume_rules() {
  static const std::map<std::string, ResumeRule> rules = {
      {"--model", {OnResume::Path, "model"}},
      {"--data", {OnResume::Path, "data"}},
      {"--chat-template", {OnResume::Path, "chat_template"}},
      {"--donor-embeddings", {OnResume::Path, "donor_embeddings"}},
      {"--out", {OnResume::NotSaved}},  // must name the --resume folder (checked below)
      {"--method", {OnResume::Fixed, "method"}},
      {"--train-embeddings", {OnResume::Fixed, "train_embeddings"}},
      {"--lora-rank", {OnResume::Fixed, "lora_rank"}},
      {"--lora-alpha", {OnResume::Fixed, "lora_alpha"}},
      {"--lora-dropout", {OnResume::Fixed, "lora_dropout"}},
      {"--lora-targets", {OnResume::Fixed, "lora_targets"}},
      {"--ctx", {OnResume::Fixed, "ctx"}},
      {"--batch", {OnResume::Fixed, "batch"}},
      {"--accum", {OnResume::Fixed, "accum"}},
      {"--precision", {OnResume::Fixed, "precision"}},
      {"--recompute", {OnResume::Fixed, "recompute"}},
      {"--pack", {OnResume::Fixed, "pack"}},
      {"--epochs", {OnResume::Fixed, "epochs"}},
      {"--lr", {OnResume::Fixed, "lr"}},
      {"--min-lr", {OnResume::Fixed, "min_lr"}},
      {"--warmup", {OnResume::Fixed, "warmup"}},
      {"--wd", {OnResume::Fixed, "weight_decay"}},
      {"--clip", {OnResume::Fixed, "clip"}},
      {"--moe-aux-loss", {OnResume::Fixed, "moe_aux_loss"}},
      {"--experts", {OnResume::Shape}},
      {"--experts-used", {OnResume::Shape}},
      {"--expert-ffn", {OnResume::Shape}},
      {"--seed", {OnResume::Fixed, "seed"}},
      {"--val-fraction", {OnResume::Fixed, "val_fraction"}},
      {"--merge-type", {OnResume::Fixed, "merge_type"}},
      {"--preset", {OnResume::Shape}},
      {"--layers", {OnResume::Shape}},
      {"--heads", {OnResume::Shape}},
      {"--kv-heads", {OnResume::Shape}},
      {"--dim", {OnResume::Shape}},
      {"--ffn", {OnResume::Shape}},
      {"--norm", {OnResume::Shape}},
      {"--mlp", {OnResume::Shape}},
      {"--pos", {OnResume::Shape}},
      {"--bias", {OnResume::Shape}},
      {"--tied", {OnResume::Shape}},
      {"--dropout", {OnResume::Shape}},
      {"--init-scale", {OnResume::Shape}},
      {"--depth-scale", {OnResume::Shape}},
      {"--layer-kinds", {OnResume::Shape}},
      {"--full-attention-interval", {OnResume::Shape}},
      {"--gdn-heads", {OnResume::Shape}},
      {"--gdn-k-heads", {OnResume::Shape}},
      {"--gdn-head-dim", {OnResume::Shape}},
      {"--conv-kernel", {OnResume::Shape}},
      {"--steps", {OnResume::MayChange}},
      {"--stop-after", {OnResume::MayChange}},
      {"--save-every", {OnResume::MayChange}},
      {"--save-minutes", {OnResume::MayChange}},
      {"--eval-every", {OnResume::MayChange}},
      {"--log-every", {OnResume::MayChange}},
      {"--quiet", {OnResume::MayChange}},
      {"--threads", {OnResume::NotSaved}},
      {"--device", {OnResume::NotSaved}},
      {"--force", {OnResume::NotSaved}},
      {"--json", {OnResume::NotSaved}},
      {"--zero", {OnResume::NotSaved}},  // (the data-parallel flags apply to one invocation)
      {"--dp-bucket-mb", {OnResume::NotSaved}},
      {"--dp-overlap", {OnResume::NotSaved}},
      {"--dp-timeout", {OnResume::NotSaved}},
      {"--resume", {OnResume::NotSaved}},
      {"--help", {OnResume::NotSaved}},
      {"--help-all", {OnResume::NotSaved}},
  };
  return rules;
}

// The fresh model's shape (no -m): the context is --ctx, 512 when not given.
ModelConfig fresh_shape(const FinetuneFlags& f) {
  ModelConfig m = shape_from_flags(f.shape);
  m.ctx = f.o.ctx ? f.o.ctx : 512;
  m.tied = false;  // a projection lens needs an untied head
  return m;
}

// Applies the command line to the options saved in a checkpoint (see resume_rules()).
void apply_resume_flags(const CLI::App* cmd, const FinetuneFlags& f, FinetuneOptions& saved) {
  FinetuneOptions given = f.o;
  given.shape = fresh_shape(f);
  const nlohmann::json was = saved.to_json(), now = given.to_json();
  bool shape_given = false;
  for (const auto& [flag, rule] : resume_rules()) {
    if (cmd->count(flag) == 0) continue;
    switch (rule.what) {
      case OnResume::Fixed:
        TOY_CHECK(was[rule.key] == now[rule.key], "[finetune] {} cannot change when resuming: the run was started "
                  "with {} {}, this command gives {} (leave it out, or start a new run)", flag, flag,
                  printable(was[rule.key].dump()), printable(now[rule.key].dump()));
        break;
      case OnResume::Path: {
        const std::string a = was[rule.key].get<std::string>(), b = now[rule.key].get<std::string>();
        TOY_CHECK(same_path(a, b), "[finetune] {} cannot change when resuming: the run was started with {} {}, this "
                  "command gives {}", flag, flag, printable(a), printable(b));
        break;
      }
      case OnResume::Shape: shape_given = true; break;
      default: break;
    }
  }
  if (shape_given && saved.model.empty())
    TOY_CHECK(was["shape"] == now["shape"], "[finetune] the model shape cannot change when resuming: the run's is {}, "
              "this command gives {}", printable(was["shape"].dump()), printable(now["shape"].dump()));
  if (cmd->count("--out"))
    TOY_CHECK(same_path(given.out, f.resume), "[finetune] --out '{}' and --resume '{}' name different folders",
              printable(given.out), printable(f.resume));
  if (cmd->count("--steps")) saved.steps = given.steps;
  if (cmd->count("--stop-after")) saved.stop_after = given.stop_after;
  if (cmd->count("--save-every")) saved.save_every = given.save_every;
  if (cmd->count("--save-minutes")) saved.save_minutes = given.save_minutes;
  if (cmd->count("--eval-every")) saved.eval_every = given.eval_every;
  if (cmd->count("--log-every")) saved.log_every = given.log_every;
  saved.quiet = given.quiet;
  saved.zero = given.zero, saved.dp_bucket_mb = given.dp_bucket_mb;
  saved.dp_overlap = given.dp_overlap, saved.dp_timeout = given.dp_timeout;
  saved.device = given.device;
}

void print_result(const FinetuneResult& r, bool json) {
  if (!json) return;
  nlohmann::json j = {{"steps", r.steps},         {"train_loss", r.train_loss},   {"val_loss", r.val_loss},
                      {"tokens_per_s", r.tokens_per_s}, {"seconds", r.seconds},  {"out", r.out},
                      {"trainable_params", r.trainable_params}, {"stopped", r.stopped},
                      {"skipped_steps", r.skipped_steps}, {"model", r.model},    {"best_step", r.best_step},
                      {"best_val_loss", r.best_val_loss}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

Run add_finetune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("finetune", "Fine-tune a GGUF model: full or LoRA, SFT with a masked loss");
  auto f = std::make_shared<FinetuneFlags>();
  FinetuneOptions& o = f->o;
  cmd->add_option("-m,--model", o.model, "Base model (GGUF); without it, --donor-embeddings trains a fresh model of "
                  "the shape flags");
  cmd->add_option("--data", o.data,
                  "Training data: .jsonl records ({\"prompt\",\"completion\"} or {\"messages\": [...]}) or plain text");
  cmd->add_option("--chat-template", o.chat_template,
                  "A chat template (.jinja) for \"messages\" records instead of the model's; model.gguf carries it");
  cmd->add_option("--out", o.out,
                  "Run folder: model.gguf (merged), adapter.gguf (LoRA), checkpoint.gguf, events.jsonl, report.html");
  auto* resume_opt = cmd->add_option("--resume", f->resume, "Continue the run in this folder from its checkpoint");
  cmd->add_option("--method", o.method, "full or lora")->capture_default_str()->check(CLI::IsMember({"full", "lora"}));
  cmd->add_flag("--train-embeddings", o.train_embeddings,
                "Full: also train the token embeddings, the final norm and an untied head");
  cmd->add_option("--donor-embeddings", o.donor_embeddings,
                  "Projection lens: token embeddings (and tokenizer) from this GGUF model, frozen, through a trainable "
                  "projection to the model's width; saved folded into token_embd with an untied head");
  add_shape_flags(cmd, f->shape, "llama");
  add_int(cmd, "--lora-rank", o.lora_rank, 1, 1 << 16, "LoRA rank")->capture_default_str();
  add_real(cmd, "--lora-alpha", o.lora_alpha, Range{0, 1e6, true}, "LoRA alpha (scale alpha / rank)")
      ->capture_default_str();
  add_real(cmd, "--lora-dropout", o.lora_dropout, Range{0, 1, false, true}, "Dropout on the adapters' input")
      ->capture_default_str();
  cmd->add_option("--lora-targets", o.lora_targets,
                  "Projections to adapt: q,k,v,o,gate,up,down (default) or GGUF names (attn_q, ..., attn_qkv)");
  add_int(cmd, "--ctx", o.ctx, 1, int64_t(1) << 20, "Tokens per example (longer ones are truncated; default: "
          "min(the model's context, 512)); a fresh model's context")->default_str("");
  add_int(cmd, "--batch", o.batch, 1, 1 << 16, "Examples per micro-batch")->capture_default_str();
  add_int(cmd, "--accum", o.accum, 1, 1 << 16, "Micro-batches per step")->capture_default_str();
  cmd->add_option("--precision", o.precision,
                  "Products of the trained projections in f32, bf16 or f16 over F32 masters (f16: dynamic loss "
                  "scaling); with LoRA, an F32 base is stored in that type")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_flag("--recompute", o.recompute,
                "Recompute each block's activations during backward (less memory, ~1/3 more compute)");
  cmd->add_flag("--pack", o.pack,
                "Pack several examples into each row of --ctx tokens (block-causal: no example sees another)");
  add_int(cmd, "--steps", o.steps, 0, int64_t(1) << 40, "Steps (default: from --epochs)")->default_str("");
  add_real(cmd, "--epochs", o.epochs, Range{0, 1e6, true}, "Passes over the training examples")->capture_default_str();
  add_real(cmd, "--lr", o.lr, Range{0, 10, true}, "Peak learning rate")->capture_default_str();
  add_real(cmd, "--min-lr", o.min_lr, Range{0, 10}, "Final learning rate of the cosine (default lr / 10)");
  add_int(cmd, "--warmup", o.warmup, 0, int64_t(1) << 40, "Warmup steps")->capture_default_str();
  add_real(cmd, "--wd", o.weight_decay, Range{0, 10}, "AdamW weight decay (matrices)")->capture_default_str();
  add_real(cmd, "--clip", o.clip, Range{0, 1e6}, "Global gradient-norm clip (0 = off)")->capture_default_str();
  add_real(cmd, "--moe-aux-loss", o.moe_aux_loss, Range{0, 100},
           "Mixture of experts: weight of the load-balancing loss (0 = off, 0.001 typical)");
  add_u64(cmd, "--seed", o.seed, "Seed (split, order, adapters' init, dropout)")->capture_default_str();
  add_real(cmd, "--val-fraction", o.val_fraction, Range{0, 1, false, true}, "Examples held out for validation")
      ->capture_default_str();
  add_int(cmd, "--eval-every", o.eval_every, 0, int64_t(1) << 40, "Validation loss every N steps (0 = at the end)");
  add_int(cmd, "--log-every", o.log_every, 1, int64_t(1) << 40, "Progress line every N steps when not on a terminal")
      ->capture_default_str();
  add_int(cmd, "--stop-after", o.stop_after, 0, int64_t(1) << 40,
          "Stop after this step with a checkpoint (continue with --resume)");
  add_int(cmd, "--save-every", o.save_every, 0, int64_t(1) << 40, "Write a checkpoint every N steps (0 = off)");
  add_real(cmd, "--save-minutes", o.save_minutes, {0, 1e6},
           "Write a checkpoint at least every M minutes of training (0 = off)")
      ->capture_default_str();
  cmd->add_option("--merge-type", o.merge_type,
                  "model.gguf's type: f32, f16, bf16, q8_0 (default: the base's float type; f16 for a quantized base)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  cmd->add_flag("--force", o.force, "Replace a run already in --out (only toy's own files are removed)")
      ->excludes(resume_opt);
  cmd->add_flag("--quiet", o.quiet, "No progress output");
  add_device(cmd, o.device);
  add_data_parallel_flags(cmd, o);
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last line of stdout");
  for (const CLI::Option* opt : cmd->get_options())
    if (!resume_rules().count(opt->get_name()))
      throw std::logic_error("toy finetune: flag " + opt->get_name() + " has no rule for --resume (cmd_finetune.cpp)");
  return [cmd, f]() -> int {
    if (f->threads) set_num_threads(f->threads);
    install_stop_signals();
    FinetuneResult r;
    if (!f->resume.empty()) {
      const FinetuneFlags* fl = f.get();
      r = resume_finetune(f->resume, [fl, cmd](FinetuneOptions& saved) { apply_resume_flags(cmd, *fl, saved); });
    } else {
      for (const auto& [flag, rule] : resume_rules())
        TOY_CHECK(rule.what != OnResume::Shape || cmd->count(flag) == 0 || f->o.model.empty(),
                  "[finetune] {} shapes a fresh model: it does not apply with -m (the base has its shape)", flag);
      TOY_CHECK(cmd->count("--lora-targets") == 0 || !f->o.lora_targets.empty(),
                "[finetune] --lora-targets is empty: name the projections to adapt, or leave the flag out for the "
                "defaults");
      if (f->o.model.empty()) f->o.shape = fresh_shape(*f);
      r = finetune(f->o);
    }
    if (writes_run_files()) print_result(r, f->json);
    if (dist::world().size() > 1) return 0;  // (data-parallel: see toy train)
    return r.stopped ? stop_signal_exit_code() : 0;  // (--stop-after is no signal: 0)
  };
}

}  // namespace toy::cli
