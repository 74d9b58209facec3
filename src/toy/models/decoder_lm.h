// DecoderLM: a decoder-only Transformer as a stack of nn modules, configured by ModelConfig.
// Parameters are named by their GGUF tensor names:
//   token_embd.weight [V, D]            position_embd.weight [ctx, D]  (learned positions)
//   projection lens (lens_dim E > 0): token_embd.weight [V, E] and token_embd_proj.weight [D, E]
//   blk.N.attn_norm.weight/.bias [D]    blk.N.ffn_norm.weight/.bias [D]
//   gpt (fused, as GPT-2's GGUF):  blk.N.attn_qkv.weight [(H + 2 Hkv) d, D] / .bias
//   others: blk.N.attn_q.weight [H*d, D], attn_k/attn_v [Hkv*d, D] (+ .bias: gpt biases, qwen2)
//           (RoPE "normal" rotates adjacent pairs as llama.cpp does for arch llama, so rows need
//           no permutation when saved; qwen2/qwen3 rotate halves, NEOX)
//   blk.N.attn_q_norm.weight / attn_k_norm.weight [d]  (qwen3: per-head RMSNorm before RoPE)
//   qwen35: gated attention's attn_q [2 H d, D] (per head, d query rows then d gate rows); the
//           FFN norm is blk.N.post_attention_norm.weight; a Gated DeltaNet layer instead of
//           attention has attn_qkv [2 Hk dk + Hv dv, D], attn_gate [Hv dv, D], ssm_conv1d.weight
//           [2 Hk dk + Hv dv, K], ssm_dt.bias [Hv], ssm_a [Hv], ssm_beta.weight / ssm_alpha.weight
//           [Hv, D], ssm_norm.weight [dv], ssm_out.weight [D, Hv dv] (nn/gated_delta_net.h)
//   lfm2: a short-conv layer instead of attention has shortconv.in_proj.weight [3D, D],
//         shortconv.conv.weight [D, L], shortconv.out_proj.weight [D, D] (nn/short_conv.h); the
//         final norm is token_embd_norm.weight
//   blk.N.attn_output.weight [D, H*d]
//   GELU: blk.N.ffn_up.weight [F, D], ffn_down [D, F]; SwiGLU adds ffn_gate [F, D]
//   output_norm.weight/.bias [D]        output.weight [V, D] (untied only)
//   rope_freqs.weight [n_rot/2]         (Llama 3 long-context factors, when the file has them)
// Shapes use B batch, T time, D dim, H heads, Hkv kv heads, d head dim, F ffn, V vocab.
// A model toy trains owns f32 parameters; a model loaded for inference holds the file's
// tensors as they are stored (views of the mapped file, any dtype, frozen). Generation state
// (nn::KVCache) belongs to the caller.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "toy/core/rng.h"
#include "toy/models/config.h"
#include "toy/nn/attention.h"
#include "toy/nn/embedding.h"
#include "toy/nn/gated_delta_net.h"
#include "toy/nn/kv_cache.h"
#include "toy/nn/linear.h"
#include "toy/nn/mlp.h"
#include "toy/nn/moe.h"
#include "toy/nn/norm.h"
#include "toy/nn/params.h"
#include "toy/nn/short_conv.h"

namespace toy {

// Several sequences packed into each row of a batch: per-token positions (restarting at 0 for
// each sequence) and segment ids, both I32 [B, T]; attention is block-causal within a segment,
// so no sequence sees another and each computes what it would alone.
struct Packing {
  Tensor positions;
  Tensor segments;
};

class DecoderLM {
 public:
  // Supplies the tensor of a parameter (checked against its name and shape), e.g. from a file.
  using WeightSource = std::function<Tensor(const std::string& name, const Shape& shape)>;

  explicit DecoderLM(ModelConfig cfg);  // f32 parameters (zero), trainable; call init()
  // Parameters taken as the source gives them (any dtype), frozen.
  DecoderLM(ModelConfig cfg, const WeightSource& weights);
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
  // init()'s rule for one parameter (named), drawing from stream `stream` of the seed (init()
  // gives the i-th parameter stream i + 1).
  static void init_parameter(Tensor& p, uint64_t seed, uint64_t stream, float init_scale);

  // Hidden states after the final norm: ids I32 [B, T] -> [B, T, D]. `dropout_gen` (training
  // only) draws the dropout masks. With a cache, the tokens continue what it holds (their
  // positions start at cache->size()) and the cache advances by T.
  Tensor hidden(const Tensor& ids, bool training = false, Generator* dropout_gen = nullptr,
                nn::KVCache* cache = nullptr, const Packing* packing = nullptr);
  // Logits [B, T, V].
  // Where the weights live (params().move_to moves them); batches made on the host are
  // uploaded to it by logits() and loss().
  Device device() const;
  Tensor logits(const Tensor& ids, bool training = false, Generator* dropout_gen = nullptr,
                nn::KVCache* cache = nullptr);
  // Mean next-token cross-entropy of ids [B, T] against targets [B, T] (ignore index -100),
  // computed without a full logits buffer when the vocabulary is large.
  Tensor loss(const Tensor& ids, const Tensor& targets, bool training = false, Generator* dropout_gen = nullptr,
              const Packing* packing = nullptr);
  // The output head weight (token_embd.weight when tied).
  const Tensor& head_weight() const { return head_.weight; }
  // Activation recomputation (checkpointing): a training forward keeps only each block's input
  // and recomputes the block during backward (the same dropout masks), trading ~1/3 more
  // compute for the activations' memory.
  void set_recompute(bool on) { recompute_ = on; }
  // Mixture of experts: loss() adds coef x the load-balancing loss of its forward's routing
  // (nn/moe.h) while training. 0: off.
  void set_moe_aux_loss(float coef) {
    TOY_CHECK(coef == 0 || cfg_.moe.experts > 0, "[model] --moe-aux-loss applies to a mixture of experts; this "
              "model has none");
    moe_aux_coef_ = coef;
  }
  // The blocks' projections, each with the GGUF name of its weight ("blk.3.attn_q.weight"),
  // in parameter order: where LoRA adapters attach.
  std::vector<std::pair<std::string, nn::Linear*>> projections();
  // Mixed precision for training from scratch: every F32 projection and the output head
  // multiply in `compute` (BF16 or F16) over their F32 masters (nn::Linear::compute); F32
  // turns it off. (A tied head rounds the embedding table for the head's product only.)
  void set_mixed_precision(DType compute) {
    for (auto& [name, lin] : projections()) lin->compute = compute;
    head_.compute = compute;
  }
  // A mixture's expert tensors (ffn_gate_exps, ffn_up_exps, ffn_down_exps: [E, N, K]) with
  // their adapters, by GGUF name in parameter order: where expert LoRA attaches.
  struct ExpertWeight {
    Tensor* weight;
    nn::Lora* lora;
  };
  std::vector<std::pair<std::string, ExpertWeight>> expert_weights();
  // Projection lens: token_embd.weight <- F32 [V, D] rows of E P^T (the projected table),
  // token_embd_proj.weight removed, lens_dim 0 — the same function, as llama.cpp's layout.
  void fold_lens();

  // --- generation with a caller-owned cache ---
  // A cache for `batch` sequences of up to `capacity` tokens (0: the model's context).
  nn::KVCache new_cache(int64_t batch = 1, int64_t capacity = 0, DType dtype = DType::F32) const;
  // Runs ids [T] (one sequence) after what the cache holds; logits of the last position [V].
  // Once warm, a call makes no heap allocation (tested).
  Tensor decode(nn::KVCache& cache, std::span<const int32_t> ids);
  Tensor decode(nn::KVCache& cache, const std::vector<int32_t>& ids) {
    return decode(cache, std::span<const int32_t>(ids));
  }
  Tensor decode(nn::KVCache& cache, int32_t id) { return decode(cache, std::span<const int32_t>(&id, 1)); }
  // One token for each of several sequences, each with its own cache of one sequence (they
  // may hold different lengths): logits [N, V], row i continuing caches[i]. Every weight
  // matrix is read once for all N (a GEMM); each attention layer reads each cache.
  Tensor decode_step(std::span<nn::KVCache* const> caches, std::span<const int32_t> ids);
  // The prompts of several sequences at once, each after what its cache (of one sequence)
  // holds: logits [N, V] of each one's last token. Every weight matrix is read once for all
  // their tokens (one GEMM over the prompts together); each attention layer reads each cache.
  // (Recurrent layers keep one state per sequence: a hybrid model runs the prompts one by one.)
  Tensor prefill(std::span<nn::KVCache* const> caches, std::span<const std::span<const int32_t>> prompts);

 private:
  struct Block {
    LayerKind kind = LayerKind::Attention;
    nn::Norm attn_norm, ffn_norm;
    nn::Norm attn_post_norm, ffn_post_norm;  // Gemma 3's norms of the attention and MLP outputs
    nn::Attention attn;     // attention layers
    nn::GatedDeltaNet gdn;  // Gated DeltaNet layers
    nn::ShortConv conv;     // short-convolution layers (LFM2)
    nn::Mlp mlp;
    nn::Moe moe;            // instead of mlp when the model has experts
  };
  struct ShapesOnly {};
  DecoderLM(ModelConfig cfg, ShapesOnly);
  // Declares every parameter through add(name, shape, trainable) -> Tensor and binds the modules.
  template <class Add>
  void declare(Add add);
  // The output head on hidden states h (soft-capped when the model says so).
  Tensor head_logits(const Tensor& h) const;
  Tensor embed(const Tensor& ids, int64_t start, const Tensor& positions, bool training, Generator* gen);
  // (step_caches: a decode step or, with prefill_lengths, a prefill of several sequences.)
  Tensor block(int64_t l, const Tensor& x, const Tensor& positions, const Tensor& segments, bool training,
               Generator* gen, nn::KVCache* cache, std::span<nn::KVCache* const> step_caches = {},
               std::span<const int64_t> prefill_lengths = {});

  ModelConfig cfg_;
  ParamStore params_;
  nn::Embedding tok_emb_, pos_emb_;
  nn::Linear lens_;  // projection lens (defined when lens_dim > 0)
  std::vector<Block> blocks_;
  nn::Norm out_norm_;
  nn::Linear head_;
  bool recompute_ = false;
  float moe_aux_coef_ = 0;  // the load-balancing loss's weight in loss() (training)
  // Routing statistics of the current training forward (when moe_aux_coef_ > 0).
  std::optional<nn::MoeBalance> balance_;
};

}  // namespace toy
