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
  TOY_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps < 1, "[model] norm eps must be in (0, 1), got {}",
            norm_eps);
  TOY_CHECK(std::isfinite(rope_base) && rope_base > 1, "[model] rope base must be a finite number > 1, got {}",
            rope_base);
  TOY_CHECK(std::isfinite(init_scale) && init_scale > 0 && init_scale <= 100, "[model] init scale must be in (0, 100], "
            "got {}", init_scale);
  TOY_CHECK(dropout >= 0 && dropout < 1, "[model] dropout must be in [0, 1), got {}", dropout);
  TOY_CHECK(vocab <= (int64_t(1) << 24) && heads <= 4096 && kv_heads <= heads && ffn <= (int64_t(1) << 22),
            "[model] implausible size (vocab {}, heads {}, kv heads {}, ffn {})", vocab, heads, kv_heads, ffn);
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
  c.mlp = pick("mlp", "swiglu", "gelu") ? MlpKind::SwiGLU : MlpKind::GELU;
  c.pos = pick("pos", "rope", "learned") ? PosKind::RoPE : PosKind::Learned;
  c.bias = get_bool(j, "bias", where);
  c.tied = get_bool(j, "tied", where);
  c.depth_scale = get_bool(j, "depth_scale", where);
  c.norm_eps = get_float(j, "norm_eps", where);
  c.rope_base = get_float(j, "rope_base", where);
  c.init_scale = get_float(j, "init_scale", where);
  c.dropout = get_float(j, "dropout", where);
  for (const auto& k : get_array(j, "layer_kinds", where)) {
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
