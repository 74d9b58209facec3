// Internal to the trainer: everything a run holds, and the checkpoint that saves and restores
// it. trainer.cpp drives the loop; checkpoint.cpp writes and validates checkpoints.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "toy/core/rng.h"
#include "toy/data/batches.h"
#include "toy/data/corpus.h"
#include "toy/io/gguf.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"
#include "toy/train/loop.h"
#include "toy/train/optimizer.h"
#include "toy/train/trainer.h"

namespace toy {

// Independent random streams of a run (all counter-based, keyed by the seed).
constexpr uint64_t kDataStream = 1, kDropoutStream = 2, kEvalStream = 3, kSampleStream = 4;

struct Run {
  TrainOptions o;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> tokens;
  TokenSplit split;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<AdamW> opt;
  Generator data_gen{0, kDataStream}, dropout_gen{0, kDropoutStream};
  LoopState loop;            // steps, time, tokens, the best weights
  std::vector<std::string> files;
  std::vector<CorpusFile> corpus;  // identity of the corpus the run trains on
  uint64_t corpus_hash = 0;
  uint64_t token_cache_key = 0;    // the corpus text and the tokenizer's identity
};

std::string checkpoint_path(const std::string& dir);
// Writes dir/checkpoint.gguf atomically; refuses (throws) when any weight is not finite.
void save_checkpoint(Run& r);
// Loads and validates dir/checkpoint.gguf into r (options, model, tokenizer, optimizer, best
// weights, random streams, corpus identity). Throws toy::Error naming the file and what is
// wrong: another format version, non-finite state, shapes, a step out of range, a config that
// disagrees with itself.
void load_checkpoint(Run& r, const std::string& dir);
// Same, from a reader already open (its path names it in messages).
void load_checkpoint(Run& r, const gguf::Reader& rd, const std::string& dir);
// Checkpoint helpers shared by toy train's and toy finetune's checkpoints; `who` ("[train]",
// "[finetune]") starts their messages.
// Copies tensor `name` of the checkpoint into dst after checking its shape and that it is
// finite (and, for second moments, never negative).
void load_checked(const gguf::Reader& rd, const std::string& name, Tensor& dst, bool non_negative, const char* who);
std::string hex(uint64_t v);  // 16 hex digits
// Field `key` of j as 16 hex digits.
uint64_t parse_hex(const nlohmann::json& j, const char* key, const std::string& where);
// Index of the first NaN/Inf element of t, or -1.
int64_t first_non_finite(const Tensor& t);
// Throws when a parameter of m holds NaN/Inf: "<context>: weight 'NAME' holds nan (element
// I)<consequence>".
void require_finite_weights(const DecoderLM& m, const std::string& context, const std::string& consequence);

}  // namespace toy
