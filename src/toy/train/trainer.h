// Training from scratch: the loop behind `toy train`.
//   data -> tokenizer (trained on the corpus, saved in the model) -> 90/10 split -> random
//   windows -> DecoderLM -> AdamW with warmup + cosine, gradient clipping and accumulation.
// The run folder gets model.gguf, checkpoint.gguf (model + optimizer + position in every
// random stream; written to a temporary file and renamed), events.jsonl and report.html.
// Stopping (Ctrl-C or stop_after) writes a checkpoint; resuming from it continues bit for bit
// (for a fixed thread count) as if the run had never stopped.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "toy/models/config.h"

namespace toy {

struct TrainOptions {
  std::vector<std::string> data;  // files or folders; empty = default corpus
  std::string out;                // run folder
  std::string tokenizer = "char"; // char | byte | bpe:N
  ModelConfig model = ModelConfig::from_preset("gpt");
  int64_t batch = 12;
  int64_t accum = 1;
  int64_t steps = 2000;
  float lr = 1e-3f, min_lr = 1e-4f;
  int64_t warmup = 100;
  float weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f, clip = 1.0f;
  uint64_t seed = 1337;
  int64_t eval_every = 250;   // 0 = only at the end
  int64_t eval_batches = 20;  // batches per loss estimate (train and val)
  int64_t sample_every = 0;   // 0 = only at the end
  int64_t sample_tokens = 200;
  int64_t log_every = 10;     // plain progress lines (non-terminal output)
  double val_fraction = 0.1;
  int threads = 0;
  int64_t stop_after = 0;     // stop (with a checkpoint) after this step; 0 = run to the end
  bool quiet = false;

  // Throws toy::Error naming the first nonsense value.
  void validate() const;
  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);
};

struct TrainResult {
  int64_t steps = 0;          // steps completed
  double train_loss = NAN;    // last estimate over eval_batches training windows (NaN: none made)
  double val_loss = NAN;      // last estimate over eval_batches validation windows (NaN: none made)
  double last_step_loss = 0;
  double tokens_per_s = 0;
  double seconds = 0;
  std::string out;
  bool stopped = false;       // stopped early (Ctrl-C or stop_after): resumable
};

// Starts a new run in opts.out.
TrainResult train(const TrainOptions& opts);
// Continues the run in `dir` from its checkpoint; `override_fn` may change the saved options
// that may differ on resume (steps, stop_after, threads, eval/sample cadence).
TrainResult resume(const std::string& dir, const std::function<void(TrainOptions&)>& override_fn = {});

// Set by the SIGINT handler `toy train` installs; the loop checks it after each step.
void request_stop();

}  // namespace toy
