// LoRA adapters on a DecoderLM's projections: adding trainable ones, saving and loading them
// in llama.cpp's LoRA adapter format, and merging them into the weights.
//
// Adapter file (llama.cpp's, as its convert_lora_to_gguf.py writes it): general.type
// "adapter", general.architecture the base model's, adapter.type "lora", adapter.lora.alpha
// (f32); for each adapted weight W [out, in] two tensors named after it, "W.lora_a" [rank,
// in] and "W.lora_b" [out, rank]. Applied as W x + S × alpha / rank × B A x (S the user's
// scale, 1 by default; alpha 0 means S alone), as llama.cpp applies it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "toy/models/decoder_lm.h"

namespace toy {

struct LoraOptions {
  std::vector<std::string> targets;  // weight kinds ("attn_q", ...); empty: the default set
  int64_t rank = 8;
  float alpha = 16;
  float dropout = 0;
  uint64_t seed = 0;
};

// "q,k,v,o,gate,up,down" or GGUF weight kinds (attn_q, attn_k, attn_v, attn_output,
// ffn_gate, ffn_up, ffn_down, attn_qkv, a Gated DeltaNet layer's attn_gate, ssm_alpha,
// ssm_beta, ssm_out, an expert block's ffn_gate_inp and *_shexp, LFM2's shortconv.in_proj and
// shortconv.out_proj, a mixture's expert tensors ffn_gate_exps, ffn_up_exps, ffn_down_exps —
// one adapter per expert, a [E, rank, in] and b [E, out, rank] as llama.cpp's
// build_lora_mm_id reads them), comma-separated, in any mix; duplicates collapse.
// An unknown name is an error listing the valid ones.
std::vector<std::string> parse_lora_targets(const std::string& list);
// Every kind of projection the model's blocks have (what --lora-targets may name).
std::vector<std::string> lora_target_kinds(DecoderLM& m);
// The default targets for a model: every projection of its blocks (the seven usual ones, or
// attn_qkv, attn_output, ffn_up, ffn_down for GPT-2's layout; a hybrid adds its Gated DeltaNet
// layers' attn_qkv, attn_gate, ssm_out — not ssm_alpha/ssm_beta, one output per head, which
// a user may still name; LFM2 adds its short convs' shortconv.in_proj, shortconv.out_proj). A
// mixture's router and expert tensors are left out unless named.
std::vector<std::string> default_lora_targets(DecoderLM& m);

// Adds trainable F32 adapters to every block's targeted projections: A ~ N(0, 1/sqrt(in)),
// B = 0, so the model computes exactly what it did. Each A draws from its own seeded stream.
// A target the model does not have is an error naming it.
void add_lora(DecoderLM& m, const LoraOptions& o);
// The adapted projections' weight names and adapters.
std::vector<std::pair<std::string, const nn::Lora*>> lora_adapters(DecoderLM& m);

// Writes the attached adapters as an adapter file (atomically). `alpha` is written as the
// file's adapter.lora.alpha; the adapters' scale must be alpha / rank (as add_lora sets it).
void save_lora_adapter(const std::string& path, DecoderLM& m, const std::string& arch, float alpha);
// Attaches an adapter file's adapters, frozen, with scale S × alpha / rank. Checks the
// file type, the architecture, every pair and every shape against the model.
void load_lora_adapter(DecoderLM& m, const std::string& arch, const std::string& path, float user_scale = 1.0f);

// W <- W + scale B A for every adapted projection (each expert's W_e + scale B_e A_e), computed in F32 (a stored F16/BF16/block
// weight is widened first) and kept as `out` (F32, F16 or BF16) — one projection at a time, so
// no F32 copy of every merged weight exists at once; the adapters and their parameters are
// removed.
void merge_lora(DecoderLM& m, DType out = DType::F32);

}  // namespace toy
