// nn::Moe — a mixture-of-experts feed-forward block as llama.cpp's build_moe_ffn computes it
// (Qwen3-MoE, OLMoE, Granite-MoE): a router (ffn_gate_inp) scores the E experts, softmax, the
// `used` most probable are chosen per token, their probabilities (optionally renormalised to
// sum 1, optionally scaled) weight the chosen experts' SwiGLU outputs, which are summed.
//
// Experts are 3-D tensors, one matrix per expert: gate and up [E, F, D], down [E, D, F], in
// any dtype the file stores, all through mul_mat_id: F32 experts (a model toy trains or
// fine-tunes in full) as one SGEMM per chosen expert, its backward reaching their weights;
// stored experts (F16, BF16, GGUF blocks) as linear multiplies such weights — a decoding
// token reads only its chosen experts' rows (all k in one pass), a prompt makes one GEMM per
// expert; under autograd grouped by expert through linear, differentiable to x and the router
// (QLoRA trains through them), never to the frozen experts.
//
// The auxiliary load-balancing loss (Switch Transformer's, as Hugging Face's Qwen3-MoE and
// OLMoE compute it over all layers at once): aux = E * sum_e f_e P_e, f_e the number of times
// expert e was chosen per token row (summed over the k slots, so perfectly balanced routing
// gives k), P_e the mean router probability of e.
// A shared expert (a plain SwiGLU MLP every token runs) adds its output to the experts' sum.
//
// LoRA on the experts (llama.cpp's build_lora_mm_id): an expert tensor [E, N, K] may carry an
// adapter a [E, r, K], b [E, N, r]; the chosen expert e's product gains scale * B_e A_e x,
// computed with mul_mat_id on both paths (its backward writes each chosen expert's rows).
#pragma once
#include <cstdint>
#include <vector>

#include "toy/core/tensor.h"
#include "toy/nn/linear.h"
#include "toy/nn/mlp.h"

namespace toy::nn {

// What every MoE layer of one forward adds to the load-balancing loss: per expert, the count
// of choices (a constant) and the summed router probabilities (differentiable), and the
// number of token rows routed.
struct MoeBalance {
  std::vector<double> counts;  // [E]
  Tensor prob_sums;            // F32 [E]
  int64_t rows = 0;
  // E * sum_e (counts_e / rows) (prob_sums_e / rows) — a 0-d tensor; undefined if empty.
  Tensor loss() const;
};

struct Moe {
  Linear router;             // [E, D] (ffn_gate_inp; never quantized, as llama-quantize keeps it)
  Tensor gate, up, down;     // [E, F, D], [E, F, D], [E, D, F]
  Lora gate_lora, up_lora, down_lora;  // each undefined unless an adapter is attached
  int64_t used = 2;          // experts per token
  bool norm_weights = true;  // renormalise the chosen probabilities to sum 1
  float weights_scale = 0;   // 0 or 1: none
  Mlp shared;                // a shared expert every token runs (Granite-MoE's *_shexp), or undefined

  int64_t experts() const { return gate.size(0); }
  // x [B, T, D] -> [B, T, D]. With `balance`, this layer's routing statistics are added to it.
  Tensor operator()(const Tensor& x, MoeBalance* balance = nullptr) const;
};

}  // namespace toy::nn
