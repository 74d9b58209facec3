#include "toy/models/shapes.h"

#include <fmt/core.h>

#include <cmath>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy {

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = {
      //  name            arch     dim  layers heads kv  head_dim ffn   vocab   ctx    rope base  eps
      {"tiny", "", 256, 2, 4, 2, 0, 768, 1024, 2048, 10000.0f, 1e-6f},
      {"smollm2-135m", "llama", 576, 30, 9, 3, 0, 1536, 49152, 8192, 100000.0f, 1e-5f},
      {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 0, 4864, 151936, 32768, 1000000.0f, 1e-6f},
      {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f},
      {"gpt2-124m", "gpt2", 768, 12, 12, 12, 0, 3072, 50257, 1024, 10000.0f, 1e-5f},
      // Qwen3.5-0.8B's text model (its Gated DeltaNet widths: shape_config).
      {"qwen3.5-0.8b", "qwen35", 1024, 24, 8, 2, 256, 3584, 248320, 262144, 10000000.0f, 1e-6f},
      {"smollm3-3b", "smollm3", 2048, 36, 16, 4, 0, 11008, 128256, 65536, 5000000.0f, 1e-6f},
      // Phi-3.5-mini: LongRoPE from 4096 to 131072 positions, untied head (shape_config).
      {"phi-3.5-mini", "phi3", 3072, 32, 32, 32, 0, 8192, 32064, 131072, 10000.0f, 1e-5f},
      // Gemma 3: 512-token sliding windows on 5 of every 6 layers (shape_config).
      {"gemma3-270m", "gemma3", 640, 18, 4, 1, 256, 2048, 262144, 32768, 1000000.0f, 1e-6f},
      {"gemma3-1b", "gemma3", 1152, 26, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f},
      // Mixtures of experts (their expert counts and widths: shape_config).
      {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f},
      {"olmoe-1b-7b", "olmoe", 2048, 16, 16, 16, 0, 1024, 50304, 4096, 10000.0f, 1e-5f},
      {"granite-3.1-1b-a400m", "granitemoe", 1024, 24, 16, 8, 0, 512, 49155, 131072, 10000.0f, 1e-6f},
      // LFM2-350M: short-conv layers with attention at 2, 5, 8, 10, 12 and 14 (shape_config).
      {"lfm2-350m", "lfm2", 1024, 16, 16, 8, 0, 4608, 65536, 128000, 1000000.0f, 1e-5f},
  };
  return shapes;
}

std::string model_shape_pairs() {
  std::string s;
  for (const ModelShape& m : model_shapes())
    for (const char* arch : {"llama", "qwen2", "qwen3", "qwen35", "gpt2", "smollm3", "phi3", "gemma3", "qwen3moe",
                             "olmoe", "granitemoe", "lfm2"})
      if (m.arch.empty() || m.arch == arch) s += fmt::format("  --arch {:<7} --shape {}\n", arch, m.name);
  return s;
}

namespace {

// Architectures toy runs only as published (no preset trains them from scratch).
bool published_only(const std::string& arch) {
  return arch == "smollm3" || arch == "phi3" || arch == "gemma3" || arch == "qwen3moe" || arch == "olmoe" ||
         arch == "granitemoe" || arch == "lfm2";
}

// Their `tiny`: width 64, a 288-token vocabulary, and every part of the architecture present —
// SmolLM3's no-RoPE 4th layer; Phi-3's GQA and partial rotation; Gemma 3's sliding and global
// layers (pattern 2, an 8-token window), its head dim other than dim / heads, and a soft cap;
// 4 experts of width 64, 2 per token (Qwen3-MoE: head dim 32 as Qwen3's; OLMoE: no GQA;
// Granite-MoE: its multipliers and a shared expert); LFM2's short-conv and attention layers
// alternating.
void tiny_of(const std::string& arch, ModelConfig& c) {
  c.dim = 64, c.layers = 4, c.heads = 4, c.kv_heads = 2, c.head_dim = 0, c.ffn = 96, c.vocab = 288, c.ctx = 256;
  if (arch == "phi3") c.layers = 2, c.rope.n_rot = 8, c.ctx = 1024;
  if (arch == "qwen3moe" || arch == "olmoe" || arch == "granitemoe")
    c.layers = 2, c.moe = MoeConfig{4, 2, 64, arch != "olmoe", 0};
  if (arch == "granitemoe") {
    // Granite's multipliers (the 1B-A400M's, but a query scale for 16-wide heads) and, as
    // Granite-MoE-shared files have, a shared expert.
    c.embedding_scale = 12.0f, c.residual_scale = 0.22f, c.attn_scale = 0.2f, c.logit_scale = 6.0f;
    c.moe.shared_ffn = 64;
  }
  if (arch == "qwen3moe") c.head_dim = 32;
  if (arch == "olmoe") c.kv_heads = c.heads;  // (llama.cpp's OLMoE has no GQA: its k norm is dim wide)
  if (arch == "lfm2") c.layer_kinds = {LayerKind::ShortConv, LayerKind::Attention, LayerKind::ShortConv,
                                        LayerKind::Attention};
  if (arch == "gemma3") {
    c.head_dim = 32;
    c.swa = SwaConfig{8, 2, 10000.0f};
    c.logit_softcap = 30.0f;
  }
}

// Phi-3's LongRoPE from orig positions to the model's context: factors that stretch the low
// frequencies (long) or barely touch them (short), and HF's cos/sin scale for that stretch.
void long_rope(ModelConfig& c, int64_t orig) {
  c.rope.long_short = true;
  c.rope.orig_ctx = orig;
  const double stretch = double(c.ctx) / double(orig);
  c.rope.attn_factor = float(std::sqrt(1.0 + std::log(stretch) / std::log(double(orig))));
}

}  // namespace

// Factor i of LongRoPE's n (for toy init's phi3 files): a ramp over the frequencies, 1 at the
// highest; long ones stretch the lowest by up to ~the context extension.
float long_rope_factor(int64_t i, int64_t n, bool long_ones) {
  const double t = n > 1 ? double(i) / double(n - 1) : 0.0;
  return long_ones ? float(1.0 + 31.0 * t * t) : float(1.0 + 0.1 * t);
}

ModelConfig shape_config(const std::string& arch, const std::string& shape) {
  for (const ModelShape& m : model_shapes()) {
    if (m.name != shape) continue;
    TOY_CHECK(m.arch.empty() || m.arch == arch, "[init] shape '{}' is a {} model, not {}; valid pairs:\n{}",
              printable(shape), m.arch, printable(arch), model_shape_pairs());
    ModelConfig c = ModelConfig::for_arch(arch);
    c.dim = m.dim;
    c.layers = m.layers;
    c.heads = m.heads;
    c.kv_heads = arch == "gpt2" ? m.heads : m.kv_heads;  // llama.cpp's gpt2 has no GQA
    c.head_dim = m.head_dim;
    if (arch == "qwen3" && shape == "tiny") c.head_dim = 2 * m.dim / m.heads;  // explicit, as Qwen3's
    c.ffn = m.ffn;
    c.vocab = m.vocab;
    c.ctx = m.ctx;
    c.rope.base = m.rope_base;
    c.norm_eps = m.norm_eps;
    c.tied = true;
    if (arch == "qwen35") {
      // A quarter of each head rotated; Gated DeltaNet layers with every 4th attention — on
      // tiny's 2 layers one of each, with fewer K heads than V heads (the repeat convention).
      c.rope.n_rot = (c.head_dim ? c.head_dim : c.dim / c.heads) / 4;
      if (shape == "tiny") {
        c.layer_kinds = ModelConfig::parse_layer_kinds("da", c.layers);
        c.gdn = GdnConfig{2, 4, 32, 4};
      } else {
        c.layer_kinds = ModelConfig::interval_layer_kinds(4, c.layers);
        c.gdn = GdnConfig{16, 16, 128, 4};  // Qwen3.5-0.8B: linear_num_key/value_heads, head dims, conv
      }
    }
    if (shape == "tiny" && published_only(arch)) tiny_of(arch, c);
    // (tiny: 256 original positions of 1024, as llama.cpp pads its context to 256: a short
    // prompt there runs with the short factors, one past 256 tokens with the long ones.)
    if (arch == "phi3") long_rope(c, shape == "tiny" ? 256 : 4096);
    if (arch == "gemma3" && shape != "tiny") c.swa = SwaConfig{512, 6, 10000.0f};
    if (arch == "phi3" || arch == "olmoe" || (arch == "qwen3moe" && shape != "tiny")) c.tied = false;
    if (arch == "qwen3moe" && shape != "tiny") c.moe = MoeConfig{128, 8, 768, true};
    if (arch == "olmoe" && shape != "tiny") c.moe = MoeConfig{64, 8, 1024, false};
    if (arch == "granitemoe" && shape != "tiny") {
      c.moe = MoeConfig{32, 8, 512, true, 0};
      c.embedding_scale = 12.0f, c.residual_scale = 0.22f, c.attn_scale = 0.015625f, c.logit_scale = 6.0f;
    }
    if (arch == "olmoe" || arch == "granitemoe") c.ffn = c.moe.ffn;
    if (arch == "lfm2" && shape != "tiny") {
      c.layer_kinds.assign(size_t(c.layers), LayerKind::ShortConv);
      for (int64_t l : {2, 5, 8, 10, 12, 14}) c.layer_kinds[size_t(l)] = LayerKind::Attention;
    }
    c.resolve();
    c.validate();
    return c;
  }
  fail("[init] unknown shape '{}'; valid pairs:\n{}", printable(shape), model_shape_pairs());
}

std::string shape_pretokenizer(const std::string& arch, const std::string& shape) {
  if (shape == "smollm2-135m") return "smollm";
  if (arch == "phi3" || arch == "gemma3") return "default";
  if (arch == "qwen3moe") return "qwen2";
  if (arch == "lfm2") return "lfm2";
  if (arch == "olmoe") return "gpt-2";
  if (arch == "granitemoe") return "starcoder";  // (SentencePiece vocabularies: no pre-tokenizer)
  if (arch == "qwen2" || arch == "qwen3") return "qwen2";
  if (arch == "qwen35") return "qwen35";
  if (arch == "gpt2") return "gpt-2";
  return "llama-bpe";
}

}  // namespace toy
