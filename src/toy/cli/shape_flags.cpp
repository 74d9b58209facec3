#include "toy/cli/shape_flags.h"

#include <algorithm>

#include "toy/cli/flags.h"

namespace toy::cli {

void add_shape_flags(CLI::App* cmd, ShapeFlags& f, const std::string& preset) {
  f.preset = preset;
  cmd->add_option("--preset", f.preset, "Model preset: gpt (GPT-2 shape), llama, qwen35 (hybrid: Gated DeltaNet and "
                  "gated attention) or moe-tiny (mixture of experts, Qwen3-MoE's block)")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt", "llama", "qwen35", "moe-tiny"}));
  add_int(cmd, "--layers", f.layers, 1, 10000, "Transformer layers");
  add_int(cmd, "--heads", f.heads, 1, 4096, "Attention heads");
  add_int(cmd, "--kv-heads", f.kv_heads, 1, 4096, "Key/value heads (GQA; default = heads)");
  add_int(cmd, "--dim", f.dim, 1, int64_t(1) << 20, "Model width");
  add_int(cmd, "--ffn", f.ffn, 1, int64_t(1) << 22, "MLP width (default: 4*dim for GELU, ~8/3*dim for SwiGLU)");
  cmd->add_option("--norm", f.norm, "Override the preset: rms or layer")->check(CLI::IsMember({"rms", "layer"}));
  cmd->add_option("--mlp", f.mlp, "Override the preset: swiglu or gelu")->check(CLI::IsMember({"swiglu", "gelu"}));
  cmd->add_option("--pos", f.pos, "Override the preset: rope or learned")->check(CLI::IsMember({"rope", "learned"}));
  add_int(cmd, "--bias", f.bias, 0, 1, "Override the preset: biases on (1) or off (0)");
  add_int(cmd, "--tied", f.tied, 0, 1, "Override the preset: tied output head (1) or untied (0)");
  add_real(cmd, "--dropout", f.dropout, {0, 1, false, true}, "Dropout on embeddings and residual branches");
  add_real(cmd, "--init-scale", f.init_scale, {0, 100, true}, "Matrices are N(0, s/sqrt(fan_in))");
  cmd->add_flag("--depth-scale", f.depth_scale, "Scale the pre-norm outputs of layer l by 1/sqrt(l) (Curse of Depth)");
  auto* kinds = cmd->add_option("--layer-kinds", f.layer_kinds,
                                "Layer kinds, repeated to --layers: d (Gated DeltaNet), c (LFM2's short conv) and a "
                                "(attention), e.g. ddda");
  add_int(cmd, "--full-attention-interval", f.full_attention_interval, 1, 10000,
          "Every N-th layer attention, the others Gated DeltaNet (qwen35's default: 4)")
      ->excludes(kinds);
  add_int(cmd, "--gdn-heads", f.gdn_heads, 1, 4096, "Gated DeltaNet V heads (default: --heads)");
  add_int(cmd, "--gdn-k-heads", f.gdn_k_heads, 1, 4096, "Gated DeltaNet K heads, dividing the V heads (default: as V)");
  add_int(cmd, "--gdn-head-dim", f.gdn_head_dim, 1, 4096, "Gated DeltaNet head width (default: the attention's)");
  add_int(cmd, "--conv-kernel", f.conv_kernel, 1, 64, "Causal conv taps: Gated DeltaNet's (default 4), the short conv's (default 3)");
  add_int(cmd, "--experts", f.experts, 1, 4096, "Mixture of experts: experts per layer (moe-tiny: 8)");
  add_int(cmd, "--experts-used", f.experts_used, 1, 4096, "Mixture of experts: experts chosen per token (moe-tiny: 2)");
  add_int(cmd, "--expert-ffn", f.expert_ffn, 1, int64_t(1) << 22,
          "Mixture of experts: each expert's width (default: the MLP width / experts used)");
}

ModelConfig shape_from_flags(const ShapeFlags& f) {
  ModelConfig m = ModelConfig::from_preset(f.preset);
  if (f.layers) m.layers = *f.layers;
  if (f.heads) m.heads = *f.heads;
  m.kv_heads = f.kv_heads ? *f.kv_heads : m.heads;
  if (f.dim) m.dim = *f.dim;
  if (f.ffn) m.ffn = *f.ffn;
  if (!f.norm.empty()) m.norm = f.norm == "rms" ? NormKind::RMS : NormKind::Layer;
  if (!f.mlp.empty()) m.mlp = f.mlp == "swiglu" ? MlpKind::SwiGLU : MlpKind::GELU;
  if (!f.pos.empty()) m.pos = f.pos == "rope" ? PosKind::RoPE : PosKind::Learned;
  if (f.bias) m.bias = *f.bias != 0;
  if (f.tied) m.tied = *f.tied != 0;
  if (f.dropout) m.dropout = *f.dropout;
  if (f.init_scale) m.init_scale = *f.init_scale;
  m.depth_scale = f.depth_scale;
  if (!f.layer_kinds.empty())
    m.layer_kinds = ModelConfig::parse_layer_kinds(f.layer_kinds, m.layers);
  else if (f.full_attention_interval || f.preset == "qwen35")
    m.layer_kinds = ModelConfig::interval_layer_kinds(f.full_attention_interval.value_or(4), m.layers);
  if (f.gdn_heads) m.gdn.v_heads = *f.gdn_heads;
  if (f.gdn_k_heads) m.gdn.k_heads = *f.gdn_k_heads;
  if (f.gdn_head_dim) m.gdn.head_dim = *f.gdn_head_dim;
  if (f.conv_kernel) m.gdn.conv_kernel = m.shortconv_kernel = *f.conv_kernel;
  if (f.experts) m.moe.experts = *f.experts;
  if (f.experts_used) m.moe.used = *f.experts_used;
  if (f.expert_ffn) m.moe.ffn = *f.expert_ffn;
  if (f.preset == "qwen35" && m.heads > 0) {
    const int64_t hd = m.dim / m.heads;
    m.rope.n_rot = std::max<int64_t>(2, hd / 4 / 2 * 2);  // a quarter of the head, even
  }
  return m;
}

}  // namespace toy::cli
