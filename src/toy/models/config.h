// DecoderLM configuration: one decoder-only model family configured by flags, with presets.
//   gpt    — LayerNorm, GELU MLP, learned positions, biases, tied head (the GPT-2 shape)
//   llama  — RMSNorm, SwiGLU MLP, RoPE, GQA-capable, no biases
// The GGUF architecture name follows from the flags: "gpt2" or "llama" when llama.cpp can
// run the model as it is, otherwise "toy" (our own name, so llama.cpp refuses the file
// rather than running it wrong).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace toy {

enum class NormKind { RMS, Layer };
enum class MlpKind { SwiGLU, GELU };
enum class PosKind { RoPE, Learned };
// The per-layer mixer; Gated DeltaNet layers come with the hybrid-layers issue.
enum class LayerKind { Attention };

struct ModelConfig {
  std::string preset = "llama";
  int64_t vocab = 0;
  int64_t dim = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 4;
  int64_t ffn = 0;  // 0: the preset's default for dim (gpt 4*dim, llama ~8/3*dim)
  int64_t ctx = 64;
  NormKind norm = NormKind::RMS;
  MlpKind mlp = MlpKind::SwiGLU;
  PosKind pos = PosKind::RoPE;
  bool bias = false;         // biases on linear layers and LayerNorms
  bool tied = true;          // output head shares token_embd.weight
  bool depth_scale = false;  // "Curse of Depth": pre-norm outputs of layer l scaled by 1/sqrt(l)
  float norm_eps = 1e-5f;
  float rope_base = 10000.0f;
  float init_scale = 1.0f;   // matrices ~ N(0, init_scale / sqrt(fan_in))
  float dropout = 0.0f;
  std::vector<LayerKind> layer_kinds;  // empty: every layer is attention

  int64_t head_dim() const { return dim / heads; }
  // Fills defaults that depend on other fields (ffn from dim).
  void resolve();
  LayerKind layer_kind(int64_t l) const;
  // Throws toy::Error naming the first nonsense value.
  void validate() const;
  // "gpt2", "llama" or "toy" (see above); tokenizer_ok says whether the vocabulary is one
  // llama.cpp can read (byte / bpe, not char).
  std::string gguf_arch(bool tokenizer_ok) const;

  static ModelConfig from_preset(const std::string& name);  // throws on unknown names
  nlohmann::json to_json() const;
  // Strict: every field present with its JSON type (no 32.7 for an integer); `where` names
  // the source in messages.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where = "[model] config");
};

// A float as the double with the same shortest decimal form (0.9f -> 0.9, not 0.8999999761...),
// for readable JSON.
double json_float(float f);

std::string to_string(NormKind k);
std::string to_string(MlpKind k);
std::string to_string(PosKind k);

}  // namespace toy
