// Token streams for training: a train/validation split and random windows of ctx+1 tokens
// made into batches [B, T] (inputs) and [B, T] (targets = inputs shifted by one).
// Window starts come from a counter-based generator, so a resumed run draws the same
// windows as one that never stopped.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "toy/core/hash.h"
#include "toy/core/rng.h"
#include "toy/core/tensor.h"

namespace toy {

struct TokenSplit {
  std::vector<int32_t> train, val;
};
// First (1 - val_fraction) of the tokens for training, the rest for validation.
TokenSplit split_tokens(const std::vector<int32_t>& tokens, double val_fraction);

class BatchSampler {
 public:
  // Throws if the tokens are fewer than one window (ctx + 1).
  BatchSampler(const std::vector<int32_t>* tokens, int64_t ctx, int64_t batch, const char* what);
  // Inputs and targets [B, T] from B windows drawn with gen: window b from counter
  // gen.offset() + b (the B counters are reserved).
  void sample(Generator& gen, Tensor& inputs, Tensor& targets) const;
  int64_t windows() const { return int64_t(tokens_->size()) - ctx_; }
  int64_t batch() const { return batch_; }

 private:
  const std::vector<int32_t>* tokens_;
  int64_t ctx_, batch_;
};

// Encoded tokens cached in a file (with a key naming the corpus and tokenizer), so a rerun
// or resume need not encode the corpus again. load returns false (and the caller rebuilds
// the cache) when it is missing, stale, damaged, holds ids outside [0, vocab) or more than
// max_tokens tokens (checked before anything is allocated).
bool load_token_cache(const std::string& path, uint64_t key, int64_t vocab, uint64_t max_tokens,
                      std::vector<int32_t>& tokens);
// Written to a temporary file and renamed.
void save_token_cache(const std::string& path, uint64_t key, const std::vector<int32_t>& tokens);

}  // namespace toy
