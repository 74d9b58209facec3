#include "toy/models/config.h"

#include <nlohmann/json.hpp>

#include <fmt/core.h>

#include <cmath>
#include <string>

#include "toy/core/error.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"

namespace toy {

double json_float(float f) { return std::stod(fmt::format("{}", f)); }

std::string to_string(NormKind k) { return k == NormKind::RMS ? "rms" : "layer"; }
std::string to_string(MlpKind k) { return k == MlpKind::SwiGLU ? "swiglu" : k == MlpKind::GELU ? "gelu" : "geglu"; }
std::string to_string(PosKind k) { return k == PosKind::RoPE ? "rope" : "learned"; }

LayerKind ModelConfig::layer_kind(int64_t l) const {
  return layer_kinds.empty() ? LayerKind::Attention : layer_kinds[size_t(l)];
}

bool ModelConfig::layer_has_rope(int64_t l) const {
  return pos == PosKind::RoPE && (nope_interval == 0 || (l + 1) % nope_interval != 0);
}

bool ModelConfig::layer_slides(int64_t l) const {
  return swa.window > 0 && (swa.pattern == 0 || l % swa.pattern < swa.pattern - 1);  // (0: every layer, as llama.cpp)
}

bool ModelConfig::has_gdn() const {
  for (LayerKind k : layer_kinds)
    if (k == LayerKind::GatedDeltaNet) return true;
  return false;
}

bool ModelConfig::has_shortconv() const {
  for (LayerKind k : layer_kinds)
    if (k == LayerKind::ShortConv) return true;
  return false;
}

std::vector<LayerKind> ModelConfig::parse_layer_kinds(const std::string& pattern, int64_t layers) {
  TOY_CHECK(!pattern.empty(), "[model] the layer-kind pattern is empty (letters d, c and a)");
  for (char c : pattern)
    TOY_CHECK(c == 'd' || c == 'c' || c == 'a', "[model] layer-kind pattern '{}': '{}' is not d (Gated DeltaNet), c "
              "(short conv) or a (attention)", printable(pattern), printable(std::string(1, c)));
  std::vector<LayerKind> kinds;
  for (int64_t l = 0; l < layers; ++l) {
    const char c = pattern[size_t(l) % pattern.size()];
    kinds.push_back(c == 'd' ? LayerKind::GatedDeltaNet : c == 'c' ? LayerKind::ShortConv : LayerKind::Attention);
  }
  return kinds;
}

std::vector<LayerKind> ModelConfig::interval_layer_kinds(int64_t interval, int64_t layers) {
  TOY_CHECK(interval >= 1, "[model] the full-attention interval must be at least 1, got {}", interval);
  std::vector<LayerKind> kinds;
  for (int64_t l = 0; l < layers; ++l)
    kinds.push_back((l + 1) % interval == 0 ? LayerKind::Attention : LayerKind::GatedDeltaNet);
  return kinds;
}

std::string to_string(RopeScaling s) { return s == RopeScaling::None ? "none" : s == RopeScaling::Linear ? "linear" : "yarn"; }

void ModelConfig::resolve() {
  if (head_dim == 0 && heads > 0) head_dim = dim / heads;
  if (has_gdn()) {
    if (gdn.v_heads == 0) gdn.v_heads = heads;
    if (gdn.k_heads == 0) gdn.k_heads = gdn.v_heads;
    if (gdn.head_dim == 0) gdn.head_dim = head_dim;
  }
  if (ffn == 0) {
    // SwiGLU has three matrices: 8/3 * dim (rounded up to a multiple of 8) matches the
    // parameter count of a 4 * dim GELU MLP.
    ffn = mlp == MlpKind::GELU ? 4 * dim : (8 * dim / 3 + 7) / 8 * 8;
  }
  if (moe.experts > 0 && moe.ffn == 0 && moe.used > 0) moe.ffn = std::max<int64_t>(8, ffn / moe.used / 8 * 8);
}

void ModelConfig::validate() const {
  TOY_CHECK(vocab > 0, "[model] vocabulary size must be > 0, got {}", vocab);
  TOY_CHECK(dim > 0 && layers > 0 && heads > 0 && ffn > 0 && ctx > 0,
            "[model] dim, layers, heads, ffn and ctx must be > 0 (got dim {}, layers {}, heads {}, ffn {}, ctx {})", dim,
            layers, heads, ffn, ctx);
  TOY_CHECK(head_dim > 0 || dim % heads == 0, "[model] dim {} must be a multiple of heads {} (or give the head dim)",
            dim, heads);
  TOY_CHECK(head_dim >= 0 && head_dim <= 4096, "[model] head dim must be in 1..4096, got {}", head_dim);
  TOY_CHECK(kv_heads > 0 && heads % kv_heads == 0, "[model] heads {} must be a multiple of kv heads {}", heads,
            kv_heads);
  const int64_t hd = head_dim ? head_dim : dim / heads;
  const int64_t n_rot = rope.n_rot ? rope.n_rot : hd;
  TOY_CHECK(pos != PosKind::RoPE || (n_rot % 2 == 0 && n_rot <= hd && n_rot > 0),
            "[model] RoPE rotates an even number of dims no larger than the head dim {}, got {}", hd, n_rot);
  TOY_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps < 1, "[model] norm eps must be in (0, 1), got {}",
            norm_eps);
  TOY_CHECK(std::isfinite(rope.base) && rope.base > 1, "[model] rope base must be a finite number > 1, got {}",
            rope.base);
  TOY_CHECK(std::isfinite(rope.factor) && rope.factor > 0 && rope.factor <= 1024,
            "[model] rope scaling factor must be in (0, 1024], got {}", rope.factor);
  TOY_CHECK(rope.orig_ctx >= 0 && rope.orig_ctx <= (int64_t(1) << 24), "[model] rope original context {} is out of "
            "range", rope.orig_ctx);
  TOY_CHECK(std::isfinite(rope.ext_factor) && std::isfinite(rope.attn_factor) && std::isfinite(rope.beta_fast) &&
                std::isfinite(rope.beta_slow),
            "[model] rope yarn parameters must be finite");
  TOY_CHECK(!(bias && qkv_bias), "[model] bias (every linear) and qkv_bias (q/k/v only) exclude each other");
  TOY_CHECK(!qk_norm || norm == NormKind::RMS, "[model] q/k norm is an RMSNorm: it needs the rms norm kind");
  TOY_CHECK(std::isfinite(init_scale) && init_scale > 0 && init_scale <= 100, "[model] init scale must be in (0, 100], "
            "got {}", init_scale);
  TOY_CHECK(dropout >= 0 && dropout < 1, "[model] dropout must be in [0, 1), got {}", dropout);
  TOY_CHECK(vocab <= (int64_t(1) << 24) && heads <= 4096 && kv_heads <= heads && ffn <= (int64_t(1) << 22),
            "[model] implausible size (vocab {}, heads {}, kv heads {}, ffn {})", vocab, heads, kv_heads, ffn);
  TOY_CHECK(layer_kinds.empty() || int64_t(layer_kinds.size()) == layers,
            "[model] {} layer kinds given for {} layers", layer_kinds.size(), layers);
  if (has_gdn()) {
    TOY_CHECK(gdn.k_heads > 0 && gdn.v_heads > 0 && gdn.head_dim > 0 && gdn.v_heads % gdn.k_heads == 0 &&
                  gdn.v_heads <= 4096 && gdn.head_dim <= 4096,
              "[model] Gated DeltaNet heads: V heads {} must be a positive multiple of K heads {}, head dim {} in "
              "1..4096", gdn.v_heads, gdn.k_heads, gdn.head_dim);
    TOY_CHECK(gdn.conv_kernel >= 1 && gdn.conv_kernel <= 64, "[model] Gated DeltaNet conv kernel must be in 1..64, "
              "got {}", gdn.conv_kernel);
    TOY_CHECK(gdn.v_heads * gdn.head_dim * gdn.head_dim <= (int64_t(1) << 26),
              "[model] implausible Gated DeltaNet state: {} V heads of {} x {}", gdn.v_heads, gdn.head_dim,
              gdn.head_dim);
    TOY_CHECK(norm == NormKind::RMS && mlp == MlpKind::SwiGLU, "[model] Gated DeltaNet layers come in Qwen3.5's "
              "block: RMSNorm and a SwiGLU MLP");
  }
  if (has_shortconv()) {
    TOY_CHECK(shortconv_kernel >= 2 && shortconv_kernel <= 64, "[model] the short conv's kernel must be in 2..64, got "
              "{}", shortconv_kernel);
    TOY_CHECK(norm == NormKind::RMS && mlp == MlpKind::SwiGLU && !has_gdn() && moe.experts == 0 && !bias,
              "[model] short-convolution layers come in LFM2's block: RMSNorm, a SwiGLU MLP, no biases, no experts "
              "or Gated DeltaNet layers");
  }
  TOY_CHECK(!attn_gate || (norm == NormKind::RMS && !bias && !qkv_bias),
            "[model] gated attention comes in Qwen3.5's block: RMSNorm, no biases");
  TOY_CHECK(nope_interval >= 0 && nope_interval <= 10000, "[model] no-RoPE layer interval must be in 0..10000, got {}",
            nope_interval);
  TOY_CHECK(!fused_gate_up || mlp == MlpKind::SwiGLU, "[model] a fused gate/up tensor needs the SwiGLU MLP");
  TOY_CHECK(!fused_qkv || !attn_gate, "[model] gated attention's q projection cannot be fused with k and v");
  TOY_CHECK(std::isfinite(attn_scale) && attn_scale >= 0 && attn_scale <= 100, "[model] attention scale must be in "
            "[0, 100], got {}", attn_scale);
  TOY_CHECK(std::isfinite(logit_softcap) && logit_softcap >= 0 && logit_softcap <= 1e6, "[model] logit soft-cap must "
            "be in [0, 1e6], got {}", logit_softcap);
  TOY_CHECK(swa.window >= 0 && swa.window <= (int64_t(1) << 24) && swa.pattern >= 0 && swa.pattern <= 10000,
            "[model] sliding window {} must be in 0..2^24 and its pattern {} in 0..10000", swa.window, swa.pattern);
  TOY_CHECK(std::isfinite(swa.rope_base) && swa.rope_base > 1, "[model] sliding layers' rope base must be a finite "
            "number > 1, got {}", swa.rope_base);
  TOY_CHECK(!rope.long_short || (rope.orig_ctx > 0 && !rope.freq_factors && rope.scaling == RopeScaling::None),
            "[model] LongRoPE factors need the original context (rope.scaling.original_context_length) and no "
            "other scaling");
  TOY_CHECK(std::isfinite(rope.attn_factor) && rope.attn_factor > 0 && rope.attn_factor <= 100,
            "[model] rope attention factor must be in (0, 100], got {}", rope.attn_factor);
  if (moe.experts > 0) {
    TOY_CHECK(moe.experts <= 4096 && moe.used >= 1 && moe.used <= moe.experts && moe.ffn > 0 &&
                  moe.ffn <= (int64_t(1) << 22),
              "[model] mixture of experts: {} experts, {} used per token, expert width {} (need 1 <= used <= experts "
              "<= 4096 and a width > 0)", moe.experts, moe.used, moe.ffn);
    TOY_CHECK(mlp == MlpKind::SwiGLU && !bias && !fused_gate_up && !has_gdn(), "[model] expert blocks are SwiGLU "
              "without biases, in attention layers");
  }
  TOY_CHECK(!qk_norm_whole || qk_norm, "[model] a whole-projection q/k norm is a q/k norm");
  TOY_CHECK(moe.shared_ffn >= 0 && moe.shared_ffn <= (int64_t(1) << 22) && (moe.shared_ffn == 0 || moe.experts > 0),
            "[model] a shared expert's width must be in 0..2^22 and needs experts, got {}", moe.shared_ffn);
  for (float s : {embedding_scale, residual_scale, logit_scale})
    TOY_CHECK(std::isfinite(s) && s >= 0 && s <= 1e6, "[model] Granite's multipliers must be in [0, 1e6], got {}", s);
  TOY_CHECK(lens_dim >= 0 && lens_dim <= (int64_t(1) << 20), "[model] lens width must be in 0..2^20, got {}",
            lens_dim);
  TOY_CHECK(lens_dim == 0 || !tied, "[model] a projection lens needs an untied output head");
  TOY_CHECK(layers <= 10000 && dim <= (int64_t(1) << 20) && ctx <= (int64_t(1) << 24),
            "[model] implausible size (layers {}, dim {}, ctx {})", layers, dim, ctx);
}

std::string ModelConfig::gguf_arch(bool tokenizer_ok) const {
  if (!tokenizer_ok || depth_scale || dropout < 0 || lens_dim) return "toy";
  const bool plain_rope = rope.scaling == RopeScaling::None && (rope.n_rot == 0 || rope.n_rot == head_dim);
  const bool llama_like = norm == NormKind::RMS && mlp == MlpKind::SwiGLU && pos == PosKind::RoPE && !bias;
  // Gemma's and Phi-3's variations belong to their architectures only.
  const bool gemma_parts = mlp == MlpKind::GeGLU || embed_scale || post_norms || swa.window || logit_softcap;
  const bool granite_parts = embedding_scale != 0.0f || residual_scale != 0.0f || logit_scale != 0.0f ||
                             moe.shared_ffn != 0;
  const bool others_parts = nope_interval || fused_gate_up || rope.long_short || gemma_parts || moe.experts ||
                            qk_norm_whole || granite_parts || attn_scale != 0.0f;
  if (has_shortconv()) {
    // LFM2: short-conv and attention layers, per-head q/k norms, NEOX RoPE over the whole head;
    // sliding attention (every attention layer, the model's RoPE base) when a file sets it.
    const bool swa_ok = swa.window == 0 || (swa.pattern == 0 && swa.rope_base == rope.base);
    const bool lfm2 = llama_like && rope.neox && qk_norm && !qk_norm_whole && !qkv_bias && !attn_gate &&
                      plain_rope && !rope.freq_factors && !fused_qkv && head_dim * heads == dim && swa_ok &&
                      !nope_interval && !fused_gate_up && !rope.long_short && mlp == MlpKind::SwiGLU &&
                      !embed_scale && !post_norms && logit_softcap == 0.0f && !granite_parts && attn_scale == 0.0f;
    return lfm2 ? "lfm2" : "toy";
  }
  if (qwen35_layout()) {
    // Qwen3.5: NEOX RoPE (partial allowed, plain frequencies), q/k norms, gated attention.
    const bool qwen35 = norm == NormKind::RMS && mlp == MlpKind::SwiGLU && pos == PosKind::RoPE && !bias &&
                        !qkv_bias && qk_norm && attn_gate && rope.neox && rope.scaling == RopeScaling::None &&
                        !rope.freq_factors && !others_parts;
    return qwen35 ? "qwen35" : "toy";
  }
  if (moe.experts || qk_norm_whole) {
    // Qwen3-MoE: Qwen3's attention (per-head q/k norms, NEOX), renormalised expert weights.
    // OLMoE: q/k norms over the whole projection, NEOX, raw expert weights, an untied head.
    // Granite-MoE: Llama's attention (adjacent-pair RoPE, the whole head), the multipliers
    // (logit_scale required), renormalised weights, a shared expert optional.
    const bool common = llama_like && moe.experts > 0 && !qkv_bias && !rope.freq_factors && !nope_interval &&
                        !fused_gate_up && !rope.long_short && !gemma_parts;
    if (common && !rope.neox && !qk_norm && moe.norm_weights && logit_scale != 0.0f &&
        (rope.n_rot == 0 || rope.n_rot == head_dim))
      return "granitemoe";
    const bool base = common && rope.neox && qk_norm && plain_rope && !granite_parts && attn_scale == 0.0f;
    if (base && !qk_norm_whole && moe.norm_weights) return "qwen3moe";
    if (base && qk_norm_whole && !moe.norm_weights && !tied && head_dim * heads == dim && kv_heads == heads)
      return "olmoe";
    return "toy";
  }
  if (granite_parts) return "toy";
  if (gemma_parts || attn_scale != 0.0f) {
    // Gemma 3: every part at once; llama.cpp scales queries by 1/sqrt(key_length) (27B's 62
    // layers: 1/sqrt(dim / heads), which attn_scale then states).
    const float want_scale = layers == 62 ? 1.0f / std::sqrt(float(dim / heads)) : 0.0f;
    const bool gemma3 = norm == NormKind::RMS && mlp == MlpKind::GeGLU && pos == PosKind::RoPE && !bias &&
                        !qkv_bias && qk_norm && rope.neox && embed_scale && post_norms && attn_scale == want_scale &&
                        (rope.n_rot == 0 || rope.n_rot == head_dim) && rope.scaling != RopeScaling::Yarn &&
                        !rope.freq_factors && !nope_interval && !fused_gate_up && !rope.long_short;
    return gemma3 && gemma_parts ? "gemma3" : "toy";
  }
  if (fused_gate_up || rope.long_short) {
    // Phi-3: fused gate/up, NEOX RoPE (partial allowed), LongRoPE factors optional; its output
    // projection is [dim, dim].
    const bool phi3 = llama_like && fused_gate_up && rope.neox && !qkv_bias && !qk_norm && head_dim * heads == dim &&
                      rope.scaling == RopeScaling::None && !rope.freq_factors && !nope_interval;
    return phi3 ? "phi3" : "toy";
  }
  if (nope_interval) {
    // SmolLM3: llama with no RoPE on every 4th layer (llama.cpp's fixed step), the whole head rotated.
    const bool smollm3 = llama_like && nope_interval == 4 && !rope.neox && !qkv_bias && !qk_norm &&
                         !rope.freq_factors && (rope.n_rot == 0 || rope.n_rot == head_dim);
    return smollm3 ? "smollm3" : "toy";
  }
  const bool gpt2 = norm == NormKind::Layer && mlp == MlpKind::GELU && pos == PosKind::Learned && bias &&
                    kv_heads == heads && !qkv_bias && !qk_norm && head_dim * heads == dim;
  if (gpt2) return "gpt2";
  if (llama_like && !rope.neox && !qkv_bias && !qk_norm) return "llama";
  if (llama_like && rope.neox && qkv_bias && !qk_norm && plain_rope && !rope.freq_factors) return "qwen2";
  if (llama_like && rope.neox && !qkv_bias && qk_norm && plain_rope && !rope.freq_factors) return "qwen3";
  return "toy";
}

ModelConfig ModelConfig::for_arch(const std::string& arch) {
  ModelConfig c = from_preset(arch == "gpt2" ? "gpt" : "llama");
  c.preset = arch;
  if (arch == "gpt2" || arch == "llama") return c;
  c.rope.neox = true;
  if (arch == "qwen2") {
    c.qkv_bias = true;
  } else if (arch == "qwen3") {
    c.qk_norm = true;
  } else if (arch == "qwen35") {
    c.qk_norm = true;
    c.attn_gate = true;
  } else if (arch == "smollm3") {
    c.rope.neox = false;
    c.nope_interval = 4;  // llama.cpp's fixed step (SmolLM3's no_rope_layer_interval)
  } else if (arch == "phi3") {
    c.fused_gate_up = true;
  } else if (arch == "qwen3moe") {
    c.qk_norm = true;
    c.moe.norm_weights = true;
  } else if (arch == "granitemoe") {
    c.rope.neox = false;
    c.moe.norm_weights = true;
  } else if (arch == "olmoe") {
    c.qk_norm = true;
    c.qk_norm_whole = true;
    c.moe.norm_weights = false;
    c.tied = false;
  } else if (arch == "lfm2") {
    c.qk_norm = true;  // (its layer kinds come from the file's per-layer kv head counts)
  } else if (arch == "gemma3") {
    c.mlp = MlpKind::GeGLU;
    c.qk_norm = true;
    c.embed_scale = true;
    c.post_norms = true;
  } else {
    fail("[model] architecture '{}' is not supported (toy runs gpt2, llama, qwen2, qwen3, qwen35, smollm3, phi3, "
         "gemma3, qwen3moe, olmoe, granitemoe and lfm2)", printable(arch));
  }
  return c;
}

ModelConfig ModelConfig::from_preset(const std::string& name) {
  ModelConfig c;
  c.preset = name;
  if (name == "gpt") {
    c.norm = NormKind::Layer;
    c.mlp = MlpKind::GELU;
    c.pos = PosKind::Learned;
    c.bias = true;
    c.tied = true;
  } else if (name == "llama") {
    c.norm = NormKind::RMS;
    c.mlp = MlpKind::SwiGLU;
    c.pos = PosKind::RoPE;
    c.bias = false;
    c.tied = true;
  } else if (name == "qwen35" || name == "moe-tiny") {
    // Llama's block with NEOX RoPE and q/k RMSNorm, then Qwen3.5's gated attention (the layer
    // kinds and the rotated part of each head depend on the depth and head dim: the caller
    // sets them), or Qwen3-MoE's experts (a qwen3moe file llama.cpp runs): 8 of width
    // ffn / 2 (resolve()), 2 chosen per token, their weights renormalised.
    c = from_preset("llama");
    c.preset = name;
    c.rope.neox = true;
    c.qk_norm = true;
    if (name == "qwen35") c.attn_gate = true;
    else c.moe = MoeConfig{8, 2, 0, true};
  } else {
    fail("[model] unknown preset '{}' (expected gpt, llama, qwen35 or moe-tiny)", name);
  }
  return c;
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json kinds = nlohmann::json::array();
  for (LayerKind k : layer_kinds)
    kinds.push_back(k == LayerKind::Attention ? "attention" : k == LayerKind::GatedDeltaNet ? "gdn" : "shortconv");
  const nlohmann::json r = {{"neox", rope.neox},
                            {"base", json_float(rope.base)},
                            {"n_rot", rope.n_rot},
                            {"scaling", to_string(rope.scaling)},
                            {"factor", json_float(rope.factor)},
                            {"orig_ctx", rope.orig_ctx},
                            {"ext_factor", json_float(rope.ext_factor)},
                            {"attn_factor", json_float(rope.attn_factor)},
                            {"beta_fast", json_float(rope.beta_fast)},
                            {"beta_slow", json_float(rope.beta_slow)},
                            {"freq_factors", rope.freq_factors}};
  nlohmann::json j = {{"preset", preset},     {"vocab", vocab},       {"dim", dim},
          {"layers", layers},     {"heads", heads},       {"kv_heads", kv_heads},
          {"head_dim", head_dim}, {"ffn", ffn},           {"ctx", ctx},
          {"norm", to_string(norm)}, {"mlp", to_string(mlp)}, {"pos", to_string(pos)},
          {"rope", r},            {"bias", bias},         {"qkv_bias", qkv_bias},
          {"qk_norm", qk_norm},   {"tied", tied},         {"depth_scale", depth_scale},
          {"norm_eps", json_float(norm_eps)}, {"init_scale", json_float(init_scale)},
          {"dropout", json_float(dropout)}, {"layer_kinds", kinds}};
  if (lens_dim) j["lens_dim"] = lens_dim;  // (only a lens model's, which files never hold unfolded)
  // Fields of Qwen3.5's block, written when used (older files load without them).
  if (attn_gate) j["attn_gate"] = true;
  // Published architectures' variations, written when used.
  if (nope_interval) j["nope_interval"] = nope_interval;
  if (fused_qkv) j["fused_qkv"] = true;
  if (fused_gate_up) j["fused_gate_up"] = true;
  if (embed_scale) j["embed_scale"] = true;
  if (post_norms) j["post_norms"] = true;
  if (attn_scale != 0.0f) j["attn_scale"] = json_float(attn_scale);
  if (logit_softcap != 0.0f) j["logit_softcap"] = json_float(logit_softcap);
  if (swa.window)
    j["swa"] = {{"window", swa.window}, {"pattern", swa.pattern}, {"rope_base", json_float(swa.rope_base)}};
  if (rope.long_short) j["rope"]["long_short"] = true;
  if (moe.experts)
    j["moe"] = {{"experts", moe.experts}, {"used", moe.used}, {"ffn", moe.ffn}, {"norm_weights", moe.norm_weights},
                {"shared_ffn", moe.shared_ffn}};
  if (embedding_scale != 0.0f) j["embedding_scale"] = json_float(embedding_scale);
  if (residual_scale != 0.0f) j["residual_scale"] = json_float(residual_scale);
  if (logit_scale != 0.0f) j["logit_scale"] = json_float(logit_scale);
  if (qk_norm_whole) j["qk_norm_whole"] = true;
  if (has_shortconv()) j["shortconv_kernel"] = shortconv_kernel;
  if (has_gdn())
    j["gdn"] = {{"k_heads", gdn.k_heads}, {"v_heads", gdn.v_heads}, {"head_dim", gdn.head_dim},
                {"conv_kernel", gdn.conv_kernel}};
  return j;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  ModelConfig c;
  c.preset = get_string(j, "preset", where);
  c.vocab = get_int(j, "vocab", where);
  c.dim = get_int(j, "dim", where);
  c.layers = get_int(j, "layers", where);
  c.heads = get_int(j, "heads", where);
  c.kv_heads = get_int(j, "kv_heads", where);
  c.ffn = get_int(j, "ffn", where);
  c.ctx = get_int(j, "ctx", where);
  // Exactly the names to_string writes: a misspelt kind must not load another model.
  auto pick = [&](const char* key, const char* a, const char* b) {
    const std::string v = get_string(j, key, where);
    TOY_CHECK(v == a || v == b, "{}: field '{}' must be '{}' or '{}', got '{}'", where, key, a, b, printable(v));
    return v == a;
  };
  c.norm = pick("norm", "rms", "layer") ? NormKind::RMS : NormKind::Layer;
  {
    const std::string m = get_string(j, "mlp", where);
    TOY_CHECK(m == "swiglu" || m == "gelu" || m == "geglu", "{}: field 'mlp' must be 'swiglu', 'gelu' or 'geglu', got "
              "'{}'", where, printable(m));
    c.mlp = m == "swiglu" ? MlpKind::SwiGLU : m == "gelu" ? MlpKind::GELU : MlpKind::GeGLU;
  }
  c.pos = pick("pos", "rope", "learned") ? PosKind::RoPE : PosKind::Learned;
  c.bias = get_bool(j, "bias", where);
  c.tied = get_bool(j, "tied", where);
  c.depth_scale = get_bool(j, "depth_scale", where);
  c.norm_eps = get_float(j, "norm_eps", where);
  // Fields added after the first release are optional (a model saved before them loads with
  // their defaults); when present they are as strict as the rest.
  if (j.contains("head_dim")) c.head_dim = get_int(j, "head_dim", where);
  if (j.contains("qkv_bias")) c.qkv_bias = get_bool(j, "qkv_bias", where);
  if (j.contains("qk_norm")) c.qk_norm = get_bool(j, "qk_norm", where);
  if (j.contains("lens_dim")) c.lens_dim = get_int(j, "lens_dim", where);
  if (j.contains("rope")) {
    const nlohmann::json& r = get_object(j, "rope", where);
    const std::string rw = where + " rope";
    c.rope.neox = get_bool(r, "neox", rw);
    c.rope.base = get_float(r, "base", rw);
    c.rope.n_rot = get_int(r, "n_rot", rw);
    const std::string sc = get_string(r, "scaling", rw);
    TOY_CHECK(sc == "none" || sc == "linear" || sc == "yarn", "{}: field 'scaling' must be none, linear or yarn, got "
              "'{}'", rw, printable(sc));
    c.rope.scaling = sc == "none" ? RopeScaling::None : sc == "linear" ? RopeScaling::Linear : RopeScaling::Yarn;
    c.rope.factor = get_float(r, "factor", rw);
    c.rope.orig_ctx = get_int(r, "orig_ctx", rw);
    c.rope.ext_factor = get_float(r, "ext_factor", rw);
    c.rope.attn_factor = get_float(r, "attn_factor", rw);
    c.rope.beta_fast = get_float(r, "beta_fast", rw);
    c.rope.beta_slow = get_float(r, "beta_slow", rw);
    c.rope.freq_factors = get_bool(r, "freq_factors", rw);
    if (r.contains("long_short")) c.rope.long_short = get_bool(r, "long_short", rw);
  } else {
    c.rope.base = get_float(j, "rope_base", where);
  }
  c.init_scale = get_float(j, "init_scale", where);
  c.dropout = get_float(j, "dropout", where);
  if (j.contains("attn_gate")) c.attn_gate = get_bool(j, "attn_gate", where);
  if (j.contains("nope_interval")) c.nope_interval = get_int(j, "nope_interval", where);
  if (j.contains("fused_qkv")) c.fused_qkv = get_bool(j, "fused_qkv", where);
  if (j.contains("fused_gate_up")) c.fused_gate_up = get_bool(j, "fused_gate_up", where);
  if (j.contains("embed_scale")) c.embed_scale = get_bool(j, "embed_scale", where);
  if (j.contains("post_norms")) c.post_norms = get_bool(j, "post_norms", where);
  if (j.contains("attn_scale")) c.attn_scale = get_float(j, "attn_scale", where);
  if (j.contains("logit_softcap")) c.logit_softcap = get_float(j, "logit_softcap", where);
  if (j.contains("moe")) {
    const nlohmann::json& m = get_object(j, "moe", where);
    const std::string mw = where + " moe";
    c.moe.experts = get_int(m, "experts", mw);
    c.moe.used = get_int(m, "used", mw);
    c.moe.ffn = get_int(m, "ffn", mw);
    c.moe.norm_weights = get_bool(m, "norm_weights", mw);
    if (m.contains("shared_ffn")) c.moe.shared_ffn = get_int(m, "shared_ffn", mw);
  }
  if (j.contains("embedding_scale")) c.embedding_scale = get_float(j, "embedding_scale", where);
  if (j.contains("residual_scale")) c.residual_scale = get_float(j, "residual_scale", where);
  if (j.contains("logit_scale")) c.logit_scale = get_float(j, "logit_scale", where);
  if (j.contains("shortconv_kernel")) c.shortconv_kernel = get_int(j, "shortconv_kernel", where);
  if (j.contains("qk_norm_whole")) c.qk_norm_whole = get_bool(j, "qk_norm_whole", where);
  if (j.contains("swa")) {
    const nlohmann::json& w = get_object(j, "swa", where);
    const std::string ww = where + " swa";
    c.swa.window = get_int(w, "window", ww);
    c.swa.pattern = get_int(w, "pattern", ww);
    c.swa.rope_base = get_float(w, "rope_base", ww);
  }
  if (j.contains("gdn")) {
    const nlohmann::json& g = get_object(j, "gdn", where);
    const std::string gw = where + " gdn";
    c.gdn.k_heads = get_int(g, "k_heads", gw);
    c.gdn.v_heads = get_int(g, "v_heads", gw);
    c.gdn.head_dim = get_int(g, "head_dim", gw);
    c.gdn.conv_kernel = get_int(g, "conv_kernel", gw);
  }
  for (const auto& k : get_array(j, "layer_kinds", where)) {
    if (k == "gdn" || k == "shortconv") {
      c.layer_kinds.push_back(k == "gdn" ? LayerKind::GatedDeltaNet : LayerKind::ShortConv);
      continue;
    }
    TOY_CHECK(k == "attention", "{}: unknown layer kind {}", where,
              printable(k.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 64));
    c.layer_kinds.push_back(LayerKind::Attention);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return c;
}

}  // namespace toy
