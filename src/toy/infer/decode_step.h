// One step of incremental decoding with a bounded context window.
#pragma once
#include <cstdint>
#include <vector>

#include "toy/core/tensor.h"

namespace toy {

class DecoderLM;

// Logits for the token after `history` (whose last token has not been fed yet; the cache
// holds everything before it). When the cache is full, the cache is reset and the last
// max(1, ctx/2) tokens of history are re-read, so generation can go on past ctx.
Tensor decode_next(DecoderLM& model, const std::vector<int32_t>& history);

// The prompt a model with context ctx can take: the last ctx - 1 tokens (room for one
// generated token), and never fewer than one.
std::vector<int32_t> fit_prompt(std::vector<int32_t> ids, int64_t ctx);

}  // namespace toy
