// DecoderLM: one decoder-only Transformer on the engine, configured by ModelConfig.
// Parameters are named by their GGUF tensor names:
//   token_embd.weight [V, D]            position_embd.weight [ctx, D]  (learned positions)
//   blk.N.attn_norm.weight/.bias [D]    blk.N.ffn_norm.weight/.bias [D]
//   gpt (fused, as GPT-2's GGUF):  blk.N.attn_qkv.weight [3D, D] / .bias [3D]
//   llama:  blk.N.attn_q.weight [H*d, D], attn_k/attn_v [Hkv*d, D] (concatenated in the forward
//           so one matmul projects all three; RoPE is "normal" adjacent pairs, llama.cpp's
//           layout for arch llama, so rows need no permutation when saved)
//   blk.N.attn_output.weight [D, H*d]
//   GELU: blk.N.ffn_up.weight [F, D], ffn_down [D, F]; SwiGLU adds ffn_gate [F, D]
//   (concatenated with ffn_up in the forward, as q/k/v are)
//   output_norm.weight/.bias [D]        output.weight [V, D] (untied only)
// Shapes use B batch, T time, D dim, H heads, Hkv kv heads, d head dim, F ffn, V vocab.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "toy/core/rng.h"
#include "toy/models/config.h"
#include "toy/nn/params.h"

namespace toy {

class DecoderLM {
 public:
  explicit DecoderLM(ModelConfig cfg);  // parameters allocated (zero); call init()
  // Every parameter's name and shape, in order, without allocating anything (for checking a
  // file's tensors and the memory a run needs before committing to it).
  static std::vector<std::pair<std::string, Shape>> parameter_shapes(ModelConfig cfg);
  const ModelConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  // Seeded init: embeddings N(0, 0.02), matrices N(0, init_scale/sqrt(fan_in)), norm weights
  // 1, biases 0. Each parameter draws from its own RNG stream, so the init of one tensor does
  // not depend on the others.
  void init(uint64_t seed);

  // Hidden states after the final norm: ids I32 [B, T] -> [B, T, D]. `dropout_gen` (training
  // only) draws the dropout masks.
  Tensor hidden(const Tensor& ids, bool training = false, Generator* dropout_gen = nullptr);
  // Logits [B, T, V].
  Tensor logits(const Tensor& ids, bool training = false, Generator* dropout_gen = nullptr);
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T] (ignore index -100),
  // computed without a full logits buffer when the vocabulary is large.
  Tensor loss(const Tensor& ids, const Tensor& targets, bool training = false, Generator* dropout_gen = nullptr);
  // The output head weight (token_embd.weight when tied).
  const Tensor& head_weight() const;

  // --- incremental decoding with a KV cache (batch 1) ---
  // Clears the cache.
  void reset_cache();
  // Runs ids [T] at positions cache_len()..; returns logits of the last position [V].
  Tensor decode(const std::vector<int32_t>& ids);
  int64_t cache_len() const { return cache_len_; }

 private:
  struct Layer {
    Tensor attn_norm_w, attn_norm_b, qkv_w, qkv_b, q_w, k_w, v_w, q_b, k_b, v_b, out_w, out_b;
    Tensor ffn_norm_w, ffn_norm_b, gate_w, gate_b, up_w, up_b, down_w, down_b;
  };
  // The weights each block multiplies by: q/k/v as one [(H + 2 Hkv) d, D] matrix and, for
  // SwiGLU, gate/up as one [2F, D] matrix (views of the parameters where they are already
  // fused, concatenations otherwise).
  struct Projections {
    Tensor qkv_w, qkv_b, gate_up_w, gate_up_b;
  };
  struct ShapesOnly {};
  DecoderLM(ModelConfig cfg, ShapesOnly);
  // Declares every parameter through add(name, shape) -> Tensor and binds the result.
  template <class Add>
  void declare(Add add);
  Projections projections(const Layer& L) const;
  Tensor norm(const Tensor& x, const Tensor& w, const Tensor& b) const;
  Tensor block(int64_t l, const Tensor& x, const Tensor& positions, bool training, Generator* gen, int64_t start);
  Tensor embed(const Tensor& ids, int64_t start_pos, bool training, Generator* gen);

  ModelConfig cfg_;
  ParamStore params_;
  Tensor tok_emb_, pos_emb_, out_norm_w_, out_norm_b_, out_w_;
  std::vector<Layer> layers_;
  // KV cache: per layer [1, ctx, Hkv, d]. Weights must not change while it is filled (its
  // keys and values came from them), so the concatenated projections are built once with it
  // instead of once per token.
  std::vector<Tensor> k_cache_, v_cache_;
  std::vector<Projections> decode_projections_;
  int64_t cache_len_ = 0;
};

}  // namespace toy
