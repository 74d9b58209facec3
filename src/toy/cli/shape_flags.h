// The model-shape flags of a fresh model (`toy train`, and `toy finetune` without -m): a
// preset and overrides on top of it. The context length is each command's own flag.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "toy/models/config.h"

namespace toy::cli {

struct ShapeFlags {
  std::string preset;
  std::optional<int64_t> layers, heads, kv_heads, dim, ffn, bias, tied;
  std::string norm, mlp, pos;
  std::optional<float> dropout, init_scale;
  bool depth_scale = false;
  // Hybrid layers: a d/a pattern or every N-th layer attention (qwen35's default: 4), and the
  // Gated DeltaNet widths.
  std::string layer_kinds;
  std::optional<int64_t> full_attention_interval, gdn_heads, gdn_k_heads, gdn_head_dim, conv_kernel;
  // Mixture of experts (moe-tiny's defaults: 8 experts, 2 per token, each ffn / 2 wide).
  std::optional<int64_t> experts, experts_used, expert_ffn;
};

// --preset (default `preset`), --layers, --heads, --kv-heads, --dim, --ffn, --norm, --mlp,
// --pos, --bias, --tied, --dropout, --init-scale, --depth-scale, --layer-kinds,
// --full-attention-interval, --gdn-heads, --gdn-k-heads, --gdn-head-dim, --conv-kernel,
// --experts, --experts-used, --expert-ffn.
void add_shape_flags(CLI::App* cmd, ShapeFlags& f, const std::string& preset);
// The preset with the overrides given (ctx as the preset has it). qwen35 rotates a quarter of
// each head (as Qwen3.5) and, without a pattern, makes every 4th layer attention.
ModelConfig shape_from_flags(const ShapeFlags& f);

}  // namespace toy::cli
