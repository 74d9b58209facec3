// `toy train`: train a decoder-only LM from scratch on text (see train/trainer.h).
#include <csignal>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/core/error.h"
#include "toy/train/trainer.h"

namespace toy::cli {

namespace {

struct TrainFlags {
  TrainOptions o;
  std::string preset = "gpt";
  std::string resume;
  bool json = false;
  // Model overrides (applied on top of the preset when given).
  int64_t layers = 0, heads = 0, kv_heads = 0, dim = 0, ffn = 0, ctx = 0;
  std::string norm, mlp, pos;
  int bias = -1, tied = -1;
  float dropout = -1, init_scale = -1;
  bool depth_scale = false;
};

void on_sigint(int) { request_stop(); }

void print_result(const TrainResult& r, bool json) {
  if (!json) return;
  nlohmann::json j = {{"steps", r.steps},          {"train_loss", r.train_loss}, {"val_loss", r.val_loss},
                      {"last_step_loss", r.last_step_loss}, {"tokens_per_s", r.tokens_per_s},
                      {"seconds", r.seconds},      {"out", r.out},             {"stopped", r.stopped}};
  std::printf("%s\n", j.dump().c_str());
}

ModelConfig build_model(const TrainFlags& f) {
  ModelConfig m = ModelConfig::from_preset(f.preset);
  if (f.layers) m.layers = f.layers;
  if (f.heads) m.heads = f.heads;
  m.kv_heads = f.kv_heads ? f.kv_heads : m.heads;
  if (f.dim) m.dim = f.dim;
  if (f.ffn) m.ffn = f.ffn;
  if (f.ctx) m.ctx = f.ctx;
  if (!f.norm.empty()) {
    TOY_CHECK(f.norm == "rms" || f.norm == "layer", "[train] --norm must be rms or layer, got '{}'", f.norm);
    m.norm = f.norm == "rms" ? NormKind::RMS : NormKind::Layer;
  }
  if (!f.mlp.empty()) {
    TOY_CHECK(f.mlp == "swiglu" || f.mlp == "gelu", "[train] --mlp must be swiglu or gelu, got '{}'", f.mlp);
    m.mlp = f.mlp == "swiglu" ? MlpKind::SwiGLU : MlpKind::GELU;
  }
  if (!f.pos.empty()) {
    TOY_CHECK(f.pos == "rope" || f.pos == "learned", "[train] --pos must be rope or learned, got '{}'", f.pos);
    m.pos = f.pos == "rope" ? PosKind::RoPE : PosKind::Learned;
  }
  if (f.bias >= 0) m.bias = f.bias;
  if (f.tied >= 0) m.tied = f.tied;
  if (f.dropout >= 0) m.dropout = f.dropout;
  if (f.init_scale >= 0) m.init_scale = f.init_scale;
  m.depth_scale = f.depth_scale;
  return m;
}

}  // namespace

Run add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a language model from scratch on text");
  auto f = std::make_shared<TrainFlags>();
  TrainOptions& o = f->o;
  cmd->add_option("--data", o.data, "Text file(s) or folder(s) (default: the license texts every Debian system has)");
  cmd->add_option("--out", o.out, "Run folder: model.gguf, checkpoint.gguf, events.jsonl, report.html");
  cmd->add_option("--resume", f->resume, "Continue the run in this folder from its checkpoint");
  cmd->add_option("--preset", f->preset, "Model preset: gpt (GPT-2 shape) or llama")->capture_default_str();
  cmd->add_option("--tokenizer", o.tokenizer, "char, byte or bpe:N (N merges learned from the data)")
      ->capture_default_str();
  cmd->add_option("--layers", f->layers, "Transformer layers");
  cmd->add_option("--heads", f->heads, "Attention heads");
  cmd->add_option("--kv-heads", f->kv_heads, "Key/value heads (GQA; default = heads)");
  cmd->add_option("--dim", f->dim, "Model width");
  cmd->add_option("--ffn", f->ffn, "MLP width (default: 4*dim for GELU, ~8/3*dim for SwiGLU)");
  cmd->add_option("--ctx", f->ctx, "Context length (tokens per window)");
  cmd->add_option("--norm", f->norm, "Override the preset: rms or layer");
  cmd->add_option("--mlp", f->mlp, "Override the preset: swiglu or gelu");
  cmd->add_option("--pos", f->pos, "Override the preset: rope or learned");
  cmd->add_option("--bias", f->bias, "Override the preset: biases on (1) or off (0)");
  cmd->add_option("--tied", f->tied, "Override the preset: tied output head (1) or untied (0)");
  cmd->add_option("--batch", o.batch, "Windows per micro-batch")->capture_default_str();
  cmd->add_option("--accum", o.accum, "Micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  cmd->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", o.min_lr, "Learning rate at the end of the cosine decay")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--wd", o.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  cmd->add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--clip", o.clip, "Gradient clipping: max global norm (0 = off)")->capture_default_str();
  cmd->add_option("--dropout", f->dropout, "Dropout on embeddings and residual branches");
  cmd->add_option("--init-scale", f->init_scale, "Matrices are N(0, s/sqrt(fan_in))");
  cmd->add_flag("--depth-scale", f->depth_scale, "Scale the pre-norm outputs of layer l by 1/sqrt(l) (Curse of Depth)");
  cmd->add_option("--seed", o.seed, "Seed for init, data order, dropout and samples")->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "Steps between loss estimates (0 = only at the end)")->capture_default_str();
  cmd->add_option("--eval-batches", o.eval_batches, "Batches per train/val loss estimate")->capture_default_str();
  cmd->add_option("--sample-every", o.sample_every, "Steps between samples (0 = only at the end)")->capture_default_str();
  cmd->add_option("--sample-tokens", o.sample_tokens, "Tokens per sample")->capture_default_str();
  cmd->add_option("--log-every", o.log_every, "Steps between progress lines when not on a terminal")->capture_default_str();
  cmd->add_option("--threads", o.threads, "Threads (default: all cores)");
  cmd->add_option("--stop-after", o.stop_after, "Stop after this step with a checkpoint (resume with --resume)");
  cmd->add_flag("--quiet", o.quiet, "No progress output");
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last line of stdout");
  return [cmd, f]() -> int {
    std::signal(SIGINT, on_sigint);
    TrainResult r;
    if (!f->resume.empty()) {
      // Only how long and how the run proceeds may change on resume, never what it trains.
      for (const char* fixed : {"--data", "--out", "--preset", "--tokenizer", "--layers", "--heads", "--kv-heads",
                                "--dim", "--ffn", "--ctx", "--norm", "--mlp", "--pos", "--bias", "--tied", "--batch",
                                "--accum", "--lr", "--min-lr", "--warmup", "--wd", "--beta1", "--beta2", "--clip",
                                "--dropout", "--init-scale", "--depth-scale", "--seed"})
        TOY_CHECK(cmd->count(fixed) == 0, "[train] {} cannot change when resuming (it is saved in the checkpoint)",
                  fixed);
      TrainFlags* fl = f.get();
      r = resume(f->resume, [fl, cmd](TrainOptions& saved) {
        if (cmd->count("--steps")) saved.steps = fl->o.steps;
        saved.stop_after = fl->o.stop_after;  // a stop point applies to one session only
        if (cmd->count("--threads")) saved.threads = fl->o.threads;
        if (cmd->count("--eval-every")) saved.eval_every = fl->o.eval_every;
        if (cmd->count("--eval-batches")) saved.eval_batches = fl->o.eval_batches;
        if (cmd->count("--sample-every")) saved.sample_every = fl->o.sample_every;
        if (cmd->count("--sample-tokens")) saved.sample_tokens = fl->o.sample_tokens;
        if (cmd->count("--log-every")) saved.log_every = fl->o.log_every;
        saved.quiet = fl->o.quiet;
      });
    } else {
      f->o.model = build_model(*f);
      r = train(f->o);
    }
    print_result(r, f->json);
    return 0;
  };
}

}  // namespace toy::cli
