// Fine-tuning data: examples with a mask of the tokens the loss counts.
//   JSONL (a .jsonl file), one record per line (blank lines skipped):
//     {"prompt": P, "completion": C}  -> [BOS] P C [EOS]; the loss counts C and EOS
//                                        (BOS when the vocabulary adds one, EOS when it has one;
//                                        no template)
//     {"messages": [{"role", "content"}, ...]}  -> rendered through the model's chat template
//                                        (roles system, user, assistant); the loss counts each
//                                        assistant turn's content and the marker that ends it
//   any other file: plain text for continued pretraining, cut into windows of ctx + 1 tokens,
//   every token counted.
// An empty or malformed record, a role the template does not know, a record with nothing to
// learn: a toy::Error naming the file and line. Records longer than ctx + 1 tokens are
// truncated (counted, for a warning); one left with no counted token is dropped (counted).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "toy/core/rng.h"
#include "toy/core/tensor.h"
#include "toy/infer/chat.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {

struct SftExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // per token: counted by the loss (as a target)
  int64_t line = 0;              // 1-based line of the record (0 for plain text windows)
};

struct SftData {
  std::vector<SftExample> examples;
  int64_t truncated = 0;  // records cut to ctx + 1 tokens
  int64_t dropped = 0;    // records left with nothing to learn after truncation
};

// Reads path for a model with this tokenizer and chat template (nullptr: the model's template
// is one toy cannot read, `no_template_why` says why, so "messages" records are an error),
// context ctx.
SftData read_sft_data(const std::string& path, const Tokenizer& tok, const ChatTemplate* chat, int64_t ctx,
                      std::string_view no_template_why = {});
// Parses one JSONL record (text of one line) into an example; `where` names it in errors.
SftExample parse_sft_record(const std::string& line, const Tokenizer& tok, const ChatTemplate* chat,
                            const std::string& where, std::string_view no_template_why = {});

// A seeded split: `fraction` of the examples (at least one when there are two or more, never
// all) go to validation.
void split_sft(std::vector<SftExample> all, double fraction, uint64_t seed, std::vector<SftExample>& train,
               std::vector<SftExample>& val);

// A micro-batch of examples, padded to the longest: ids [B, T] and targets [B, T] (the
// ignore index on padding and on tokens the loss does not count). Returns the number of
// counted targets.
int64_t make_sft_batch(const std::vector<const SftExample*>& batch, int64_t vocab, Tensor& ids, Tensor& targets);
// Rows of exactly `ctx` tokens, each holding the examples of one inner list one after another
// (their inputs must fit: sum of (tokens - 1) <= ctx): ids and targets [R, ctx], positions
// restarting at 0 for each example, and segment ids (1, 2, ... per example; 0 for the
// padding at a row's end, whose targets are ignored). Returns the number of counted targets.
int64_t make_packed_sft_batch(const std::vector<std::vector<const SftExample*>>& rows, int64_t ctx, int64_t vocab,
                              Tensor& ids, Tensor& targets, Tensor& positions, Tensor& segments);

}  // namespace toy
