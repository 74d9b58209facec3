// Fine-tuning a model from a GGUF file: the loop behind `toy finetune`.
//   base GGUF -> (full: F32 copies of the weights that train, the frozen ones kept as the file
//   stores them; LoRA: the base frozen — F32, F16, BF16 or quantized — and F32 adapters train)
//   -> SFT examples (data/sft.h) with a seeded validation split -> micro-batches (padded, or
//   packed into rows of ctx tokens under a block-causal mask), masked cross-entropy, gradient
//   accumulation, global-norm clipping, AdamW with warmup + cosine.
// Projection lens (--donor-embeddings): the token table comes frozen from another model (of
// any width) through a trainable [d_model, d_donor] projection, with the donor's tokenizer and
// an untied head; the base is -m, or a fresh model of `shape` when -m is not given.
// The run folder (run_folder.h rules) gets model.gguf (the merged model, in merge_type; same
// architecture and tokenizer as the base, so llama.cpp runs it; a lens folded into token_embd),
// for LoRA adapter.gguf (llama.cpp's adapter format), checkpoint.gguf, events.jsonl and
// report.html. As toy train's: a stop request (Ctrl-C) or stop_after writes a checkpoint (so do
// save_every steps and save_minutes of training) that resume_finetune continues bit for bit;
// with validation examples the outputs hold the weights of the best validation loss.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "toy/models/config.h"
#include "toy/train/loop.h"

namespace toy {

struct FinetuneOptions : LoopOptions {
  std::string model;              // base GGUF (empty with a donor: a fresh model of `shape`)
  std::string data;               // .jsonl records or plain text
  std::string chat_template;      // a .jinja file for "messages" records and model.gguf (empty: the model's)
  std::string out;                // run folder
  std::string method = "lora";    // full | lora
  bool train_embeddings = false;  // full: also token embeddings, final norm and an untied head
  std::string donor_embeddings;   // projection lens: the frozen token table of this GGUF model
  ModelConfig shape = ModelConfig::from_preset("llama");  // the fresh model's shape (no -m)
  int64_t lora_rank = 8;
  float lora_alpha = 16, lora_dropout = 0;
  std::string lora_targets;       // empty: every projection
  int64_t ctx = 0;                // 0: min(the model's context, 512)
  bool pack = false;              // rows of ctx tokens holding several examples (block-causal)
  bool recompute = false;         // recompute each block's activations during backward
  std::string precision = "f32";  // f32 | bf16 | f16: the type the projections' products run in
  float loss_scale = 65536;       // f16: the initial dynamic loss scale
  int64_t steps = 0;              // 0: from epochs
  double epochs = 1;
  double val_fraction = 0.05;
  int64_t eval_every = 0;         // 0: only at the end
  std::string merge_type;         // f32|f16|bf16|q8_0; empty: the base's float type, F16 for a quantized base

  // The core's defaults for fine-tuning (min_lr NaN: lr / 10).
  FinetuneOptions() {
    batch = 4, accum = 1, lr = 1e-4f, min_lr = NAN, warmup = 0;
    weight_decay = 0, beta1 = 0.9f, beta2 = 0.999f, clip = 1.0f, seed = 1337, log_every = 10;
  }

  void validate() const;
  nlohmann::json to_json() const;
  // Strict (types and ranges checked); `where` names the source in messages.
  static FinetuneOptions from_json(const nlohmann::json& j, const std::string& where);
};

struct FinetuneResult {
  int64_t steps = 0;
  double train_loss = NAN;  // mean over the last logging window
  double val_loss = NAN;    // at the end (NaN: no validation examples)
  double tokens_per_s = 0;
  double seconds = 0;
  int64_t trainable_params = 0;
  int64_t skipped_steps = 0;  // f16: steps skipped for an inf/NaN gradient (the scale halved)
  std::string model = "last"; // which weights the outputs hold: "best" (validation) or "last"
  int64_t best_step = -1;     // step of the best validation loss (-1: no validation)
  double best_val_loss = NAN;
  std::string out;
  bool stopped = false;       // stopped early (a signal or stop_after): resumable
};

FinetuneResult finetune(const FinetuneOptions& o);
// Continues the run in `dir` from its checkpoint (checking that the base, donor and data files
// are the ones it started with); `override_fn` may change what may differ on resume (steps,
// stop_after, save_every, save_minutes, eval_every, log_every, quiet).
FinetuneResult resume_finetune(const std::string& dir, const std::function<void(FinetuneOptions&)>& override_fn = {});

// The checkpoint layout `toy finetune` writes and reads (key toy.finetune.version).
inline constexpr uint32_t kFinetuneCheckpointVersion = 1;

}  // namespace toy
