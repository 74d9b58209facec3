// Training from scratch: the loop behind `toy train`.
//   data -> tokenizer (trained on the corpus, saved in the model) -> 90/10 split -> random
//   windows -> DecoderLM -> AdamW with warmup + cosine, gradient clipping and accumulation.
// The run folder (see run_folder.h) gets model.gguf and last.gguf or best.gguf, checkpoint.gguf
// (model + optimizer + best weights + position in every random stream + the corpus's identity;
// written to a temporary file and renamed), tokens.bin, events.jsonl and report.html.
// What is never lost: everything is validated (including the memory the run needs) before the
// folder is touched; a stop request (SIGINT/SIGTERM/SIGHUP via request_stop) or stop_after
// writes a checkpoint, as do save_every steps and save_minutes of training; a step whose loss
// or gradient is not finite stops the run with the last good checkpoint and model kept.
// Resuming validates the checkpoint (format version, finite state, shapes, step, config, the
// corpus's hash) and continues bit for bit (for a fixed thread count).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "toy/models/config.h"
#include "toy/train/loop.h"

namespace toy {

struct TrainOptions : LoopOptions {
  std::vector<std::string> data;  // files or folders; empty = default corpus
  std::string out;                // run folder
  std::string tokenizer = "char"; // char | byte | bpe:N
  ModelConfig model = ModelConfig::from_preset("gpt");
  int64_t steps = 2000;
  int64_t eval_every = 250;   // 0 = only at the end
  int64_t eval_batches = 20;  // batches per loss estimate (train and val)
  int64_t sample_every = 0;   // 0 = only at the end
  int64_t sample_tokens = 200;
  double val_fraction = 0.1;
  int threads = 0;
  std::string keep = "best";  // model.gguf holds the best-validation weights (best) or the last step's (last)
  // f32, or bf16: the projections' products take operands rounded to BF16 (f32 accumulation,
  // F32 master weights, AdamW in f32); the output head, norms and attention stay f32.
  std::string precision = "f32";
  // Not saved with the run: it applies to one invocation.
  bool allow_data_change = false;  // a resume may continue on a corpus that changed

  // The core's defaults for training from scratch (nanoGPT's shakespeare-char recipe).
  TrainOptions() {
    batch = 12, accum = 1, lr = 1e-3f, min_lr = 1e-4f, warmup = 100;
    weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f, clip = 1.0f, seed = 1337, log_every = 10;
  }
  // Throws toy::Error naming the first nonsense value.
  void validate() const;
  nlohmann::json to_json() const;
  // Strict (types and ranges checked); `where` names the source in messages.
  static TrainOptions from_json(const nlohmann::json& j, const std::string& where);
};

struct TrainResult {
  int64_t steps = 0;          // steps completed
  double train_loss = NAN;    // last estimate over eval_batches training windows (NaN: none made)
  double val_loss = NAN;      // last estimate over eval_batches validation windows (NaN: none made)
  double last_step_loss = 0;
  double tokens_per_s = 0;
  double seconds = 0;
  std::string out;
  bool stopped = false;       // stopped early (a signal or stop_after): resumable
  std::string model = "last"; // which weights model.gguf holds: "best" (validation) or "last"
  int64_t best_step = -1;     // step of the best validation loss (-1: no validation yet)
  double best_val_loss = NAN;
};

// Starts a new run in opts.out.
TrainResult train(const TrainOptions& opts);
// Continues the run in `dir` from its checkpoint; `override_fn` may change the saved options
// that may differ on resume (steps, stop_after, threads, eval/sample cadence).
TrainResult resume(const std::string& dir, const std::function<void(TrainOptions&)>& override_fn = {});

// Set by the signal handlers `toy train` installs (async-signal-safe); the loop checks it
// after each step and stops with a checkpoint.
void request_stop();
bool stop_requested();
void clear_stop_request();  // once a loop has honoured it

// The checkpoint layout this toy writes and reads (key toy.checkpoint.version).
inline constexpr uint32_t kCheckpointVersion = 1;

}  // namespace toy
