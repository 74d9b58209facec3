// `toy finetune -m BASE.gguf --data FILE --method full|lora ... --out DIR [--json]`: fine-tunes
// a model from a GGUF file (train/finetune.h) and writes DIR/model.gguf (merged) and, for
// LoRA, DIR/adapter.gguf. --json prints a summary as the last line of stdout.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/stop_signals.h"
#include "toy/core/thread_pool.h"
#include "toy/train/finetune.h"

namespace toy::cli {

namespace {
struct FinetuneFlags {
  FinetuneOptions o;
  int threads = 0;
  bool json = false;
};
}  // namespace

Run add_finetune_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("finetune", "Fine-tune a GGUF model: full or LoRA, SFT with a masked loss");
  auto f = std::make_shared<FinetuneFlags>();
  FinetuneOptions& o = f->o;
  cmd->add_option("-m,--model", o.model, "Base model (GGUF)")->required();
  cmd->add_option("--data", o.data,
                  "Training data: .jsonl records ({\"prompt\",\"completion\"} or {\"messages\": [...]}) or plain text")
      ->required();
  cmd->add_option("--out", o.out, "Run folder: model.gguf (merged), adapter.gguf (LoRA), events.jsonl")->required();
  cmd->add_option("--method", o.method, "full or lora")->capture_default_str()->check(CLI::IsMember({"full", "lora"}));
  cmd->add_flag("--train-embeddings", o.train_embeddings,
                "Full: also train the token embeddings, the final norm and an untied head");
  add_int(cmd, "--lora-rank", o.lora_rank, 1, 1 << 16, "LoRA rank")->capture_default_str();
  add_real(cmd, "--lora-alpha", o.lora_alpha, Range{0, 1e6, true}, "LoRA alpha (scale alpha / rank)")
      ->capture_default_str();
  add_real(cmd, "--lora-dropout", o.lora_dropout, Range{0, 1, false, true}, "Dropout on the adapters' input")
      ->capture_default_str();
  cmd->add_option("--lora-targets", o.lora_targets,
                  "Projections to adapt: q,k,v,o,gate,up,down (default) or GGUF names (attn_q, ..., attn_qkv)");
  add_int(cmd, "--ctx", o.ctx, 1, int64_t(1) << 20, "Tokens per example (longer ones are truncated; default: "
          "min(the model's context, 512))")->default_str("");
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
  add_u64(cmd, "--seed", o.seed, "Seed (split, order, adapters' init, dropout)")->capture_default_str();
  add_real(cmd, "--val-fraction", o.val_fraction, Range{0, 1, false, true}, "Examples held out for validation")
      ->capture_default_str();
  add_int(cmd, "--eval-every", o.eval_every, 0, int64_t(1) << 40, "Validation loss every N steps (0 = at the end)");
  add_int(cmd, "--log-every", o.log_every, 1, int64_t(1) << 40, "Progress line every N steps")->capture_default_str();
  cmd->add_option("--merge-type", o.merge_type,
                  "model.gguf's type: f32, f16, bf16, q8_0 (default: the base's float type; f16 for a quantized base)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  cmd->add_flag("--force", o.force, "Replace a run already in --out (only toy's own files are removed)");
  cmd->add_flag("--quiet", o.quiet, "No progress output");
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last line of stdout");
  return [f]() -> int {
    if (f->threads) set_num_threads(f->threads);
    install_stop_signals();
    const FinetuneResult r = finetune(f->o);
    if (f->json) {
      nlohmann::json j = {{"steps", r.steps},     {"train_loss", r.train_loss},   {"val_loss", r.val_loss},
                          {"tokens_per_s", r.tokens_per_s}, {"seconds", r.seconds}, {"out", r.out},
                          {"trainable_params", r.trainable_params}, {"stopped", r.stopped},
                          {"skipped_steps", r.skipped_steps}, {"model", r.model}, {"best_step", r.best_step},
                          {"best_val_loss", r.best_val_loss}};
      std::printf("%s\n", j.dump().c_str());
    }
    return 0;
  };
}

}  // namespace toy::cli
