#include "toy/models/config.h"

#include <nlohmann/json.hpp>

#include <fmt/core.h>

#include <string>

#include "toy/core/error.h"

namespace toy {

double json_float(float f) { return std::stod(fmt::format("{}", f)); }

std::string to_string(NormKind k) { return k == NormKind::RMS ? "rms" : "layer"; }
std::string to_string(MlpKind k) { return k == MlpKind::SwiGLU ? "swiglu" : "gelu"; }
std::string to_string(PosKind k) { return k == PosKind::RoPE ? "rope" : "learned"; }

LayerKind ModelConfig::layer_kind(int64_t l) const {
  return layer_kinds.empty() ? LayerKind::Attention : layer_kinds[size_t(l)];
}

void ModelConfig::resolve() {
  if (ffn == 0) {
    // SwiGLU has three matrices: 8/3 * dim (rounded up to a multiple of 8) matches the
    // parameter count of a 4 * dim GELU MLP.
    ffn = mlp == MlpKind::GELU ? 4 * dim : (8 * dim / 3 + 7) / 8 * 8;
  }
}

void ModelConfig::validate() const {
  TOY_CHECK(vocab > 0, "[model] vocabulary size must be > 0, got {}", vocab);
  TOY_CHECK(dim > 0 && layers > 0 && heads > 0 && ffn > 0 && ctx > 0,
            "[model] dim, layers, heads, ffn and ctx must be > 0 (got dim {}, layers {}, heads {}, ffn {}, ctx {})", dim,
            layers, heads, ffn, ctx);
  TOY_CHECK(dim % heads == 0, "[model] dim {} must be a multiple of heads {}", dim, heads);
  TOY_CHECK(kv_heads > 0 && heads % kv_heads == 0, "[model] heads {} must be a multiple of kv heads {}", heads,
            kv_heads);
  TOY_CHECK(pos != PosKind::RoPE || head_dim() % 2 == 0, "[model] RoPE needs an even head dim, got {}", head_dim());
  TOY_CHECK(norm_eps > 0 && rope_base > 1, "[model] norm eps must be > 0 and rope base > 1");
  TOY_CHECK(init_scale > 0, "[model] init scale must be > 0, got {}", init_scale);
  TOY_CHECK(dropout >= 0 && dropout < 1, "[model] dropout must be in [0, 1), got {}", dropout);
  TOY_CHECK(layer_kinds.empty() || int64_t(layer_kinds.size()) == layers,
            "[model] {} layer kinds given for {} layers", layer_kinds.size(), layers);
  TOY_CHECK(layers <= 10000 && dim <= (int64_t(1) << 20) && ctx <= (int64_t(1) << 24),
            "[model] implausible size (layers {}, dim {}, ctx {})", layers, dim, ctx);
}

std::string ModelConfig::gguf_arch(bool tokenizer_ok) const {
  if (!tokenizer_ok || depth_scale || dropout < 0) return "toy";
  const bool gpt2 = norm == NormKind::Layer && mlp == MlpKind::GELU && pos == PosKind::Learned && bias &&
                    kv_heads == heads;
  const bool llama = norm == NormKind::RMS && mlp == MlpKind::SwiGLU && pos == PosKind::RoPE && !bias;
  if (gpt2) return "gpt2";
  if (llama) return "llama";
  return "toy";
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
  } else {
    fail("[model] unknown preset '{}' (expected gpt or llama)", name);
  }
  return c;
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json kinds = nlohmann::json::array();
  for (LayerKind k : layer_kinds) kinds.push_back(k == LayerKind::Attention ? "attention" : "?");
  return {{"preset", preset},     {"vocab", vocab},       {"dim", dim},
          {"layers", layers},     {"heads", heads},       {"kv_heads", kv_heads},
          {"ffn", ffn},           {"ctx", ctx},           {"norm", to_string(norm)},
          {"mlp", to_string(mlp)}, {"pos", to_string(pos)}, {"bias", bias},
          {"tied", tied},         {"depth_scale", depth_scale}, {"norm_eps", json_float(norm_eps)},
          {"rope_base", json_float(rope_base)}, {"init_scale", json_float(init_scale)}, {"dropout", json_float(dropout)},
          {"layer_kinds", kinds}};
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  try {
    ModelConfig c;
    c.preset = j.at("preset");
    c.vocab = j.at("vocab");
    c.dim = j.at("dim");
    c.layers = j.at("layers");
    c.heads = j.at("heads");
    c.kv_heads = j.at("kv_heads");
    c.ffn = j.at("ffn");
    c.ctx = j.at("ctx");
    // Exactly the names to_string writes: a misspelt kind must not load another model.
    auto pick = [&](const char* key, const char* a, const char* b) {
      const std::string v = j.at(key);
      TOY_CHECK(v == a || v == b, "[model] config {} must be '{}' or '{}', got '{}'", key, a, b, v);
      return v == a;
    };
    c.norm = pick("norm", "rms", "layer") ? NormKind::RMS : NormKind::Layer;
    c.mlp = pick("mlp", "swiglu", "gelu") ? MlpKind::SwiGLU : MlpKind::GELU;
    c.pos = pick("pos", "rope", "learned") ? PosKind::RoPE : PosKind::Learned;
    c.bias = j.at("bias");
    c.tied = j.at("tied");
    c.depth_scale = j.at("depth_scale");
    c.norm_eps = j.at("norm_eps");
    c.rope_base = j.at("rope_base");
    c.init_scale = j.at("init_scale");
    c.dropout = j.at("dropout");
    for (const auto& k : j.at("layer_kinds")) {
      TOY_CHECK(k == "attention", "[model] unknown layer kind {}", k.dump());
      c.layer_kinds.push_back(LayerKind::Attention);
    }
    c.validate();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("[model] malformed model config: {}", e.what());
  }
}

}  // namespace toy
