// Incremental generation with a bounded context window: prompt fitting, the next-token step
// (re-reading half the window once it is full), and the sampling loop of `toy generate` and
// training samples.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "toy/core/tensor.h"

namespace toy {

class DecoderLM;
namespace nn {
class KVCache;
}
class Sampler;
class Tokenizer;

// Logits for the token after `history` (whose last token has not been fed yet; the cache
// holds everything before it). When the cache is full, it is cleared and the last
// max(1, capacity/2) tokens of history are re-read, so generation can go on past it.
Tensor decode_next(DecoderLM& model, nn::KVCache& cache, const std::vector<int32_t>& history);

// The prompt a model with context ctx can take: the last ctx - 1 tokens (room for one
// generated token), and never fewer than one.
std::vector<int32_t> fit_prompt(std::vector<int32_t> ids, int64_t ctx);

// What a generate() call did, for the timing line llama.cpp users expect.
struct GenerateStats {
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double prompt_seconds = 0, generate_seconds = 0;
  std::string finish_reason = "length";  // "stop" (end of text or a stop string) or "length"
};

// Generates up to n tokens after `prompt` (fitted to the context; must not be empty) with a
// cache of `capacity` tokens (0: the model's context), stopping at end-of-text or where the
// text contains one of `stop` (the stop string itself is not output). The prompt is prefilled
// as one sequence, then tokens are decoded one at a time. Each piece of complete UTF-8 text
// goes to on_text as soon as no stop string can still begin in it.
GenerateStats generate(DecoderLM& model, const Tokenizer& tok, Sampler& sampler, std::vector<int32_t> prompt,
                       int64_t n, const std::function<void(const std::string&)>& on_text, int64_t capacity = 0,
                       const std::vector<std::string>& stop = {});

}  // namespace toy
