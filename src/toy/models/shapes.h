// The exact shapes of published models, for random-weight files (toy init) and benchmarks:
// every dimension, the vocabulary size, the context, RoPE base, norm epsilon and the
// pre-tokenizer of the real model. `tiny` is a small shape for tests that fits any
// architecture (qwen3's tiny states a head dim other than dim / heads, as Qwen3 does).
#pragma once
#include <string>
#include <vector>

#include "toy/models/config.h"

namespace toy {

struct ModelShape {
  std::string name;
  std::string arch;  // the one architecture of the real model; empty: any
  int64_t dim, layers, heads, kv_heads, head_dim, ffn, vocab, ctx;
  float rope_base, norm_eps;
};

const std::vector<ModelShape>& model_shapes();
// The valid architecture x shape pairs, one "arch shape" per line (for --help and errors).
std::string model_shape_pairs();
// The configuration of `shape` in architecture `arch`; throws naming the valid pairs.
ModelConfig shape_config(const std::string& arch, const std::string& shape);
// Factor i of n of the LongRoPE tables toy init writes for phi3 (long or short ones).
float long_rope_factor(int64_t i, int64_t n, bool long_ones);
// The pre-tokenizer the real model's file names (tokenizer.ggml.pre).
std::string shape_pretokenizer(const std::string& arch, const std::string& shape);

}  // namespace toy
