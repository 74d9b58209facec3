// What a training run will need, estimated before anything is allocated or written, so a run
// that cannot fit is refused up front with the numbers (instead of failing at step 1, or
// being killed by the OOM killer an hour in).
#pragma once
#include <cstdint>
#include <string>

#include "toy/models/config.h"

namespace toy {

struct TrainingMemory {
  double weights = 0;      // F32 weights
  double state = 0;        // gradients, AdamW m and v, the best-validation copy
  double activations = 0;  // what one micro-batch's forward keeps for the backward, plus logits
  double total() const { return weights + state + activations; }
};

// Estimate for a DecoderLM of config `m` (vocab resolved) trained on micro-batches of `batch`
// windows of m.ctx tokens.
TrainingMemory estimate_training_memory(const ModelConfig& m, int64_t batch);
// Throws toy::Error when the estimate exceeds `available` bytes, naming the parts and `hint`
// (what to lower).
void check_training_memory(const TrainingMemory& need, uint64_t available, const std::string& hint);
// Reading and encoding a corpus of `bytes` bytes (text, tokens, the train/val copies).
double corpus_memory(uint64_t bytes);

}  // namespace toy
