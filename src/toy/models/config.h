// DecoderLM configuration: what a GGUF file states about a decoder-only model, or what a
// preset and flags say for a model toy trains.
//   gpt    — LayerNorm, GELU MLP, learned positions, biases, tied head (the GPT-2 shape)
//   llama  — RMSNorm, SwiGLU MLP, RoPE, GQA-capable, no biases
//   qwen35 — Qwen3.5's block: llama's with NEOX RoPE, q/k norms and gated attention; its layers
//            attention or Gated DeltaNet (layer_kinds; the command line picks the pattern and
//            the rotated part of each head)
// Models loaded from GGUF add what their architecture needs: q/k/v biases (qwen2), per-head
// q/k RMSNorm (qwen3, qwen35), an explicit head dim (qwen3), RoPE on halves (NEOX: qwen2/qwen3/
// qwen35), partial rotation and long-context scaling (Llama 3's per-frequency factors, linear,
// YaRN), Gated DeltaNet layers (qwen35).
// Published architectures loaded from GGUF (and written by toy init) add: no-RoPE layers
// (smollm3), fused q/k/v and gate/up tensors with LongRoPE factors (phi3), Gemma 3's scaled
// embeddings, post-norms, GeGLU, q/k norms, sliding-window layers and logit soft-capping (gemma3),
// mixture-of-experts blocks (qwen3moe: Qwen3's attention; olmoe: q/k norms over the whole
// projection, unnormalised expert weights; granitemoe: Llama's attention, Granite's multipliers
// and an optional shared expert), LFM2's short-convolution layers among GQA attention ones with
// per-head q/k norms (lfm2).
// The GGUF architecture name follows from the fields: "gpt2", "llama", "qwen2", "qwen3", "qwen35",
// "smollm3", "phi3", "gemma3", "qwen3moe", "olmoe", "granitemoe", "lfm2" when llama.cpp runs the model as it is, otherwise "toy" (our own name, so llama.cpp refuses
// the file rather than running it wrong).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace toy {

enum class NormKind { RMS, Layer };
enum class MlpKind { SwiGLU, GELU, GeGLU };  // GeGLU: down(gelu_tanh(gate x) * up x) (Gemma)
enum class PosKind { RoPE, Learned };
// The per-layer mixer: attention, a Gated DeltaNet (linear attention with a recurrent state, as
// Qwen3.5 defines it), or LFM2's gated short convolution (nn/short_conv.h).
enum class LayerKind { Attention, GatedDeltaNet, ShortConv };

// A Gated DeltaNet layer's widths (llama.cpp's ssm.* keys): K heads (ssm.group_count) and V
// heads (ssm.time_step_rank), both head_dim wide (ssm.state_size); the causal conv over the
// q/k/v channels has conv_kernel taps (ssm.conv_kernel).
struct GdnConfig {
  int64_t k_heads = 0, v_heads = 0, head_dim = 0;  // 0: the attention's heads and head dim
  int64_t conv_kernel = 4;
  int64_t key_dim() const { return k_heads * head_dim; }
  int64_t value_dim() const { return v_heads * head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // q, k, v channels
};
enum class RopeScaling { None, Linear, Yarn };

// Rotary position embedding as llama.cpp applies it (ggml_rope_ext).
struct RopeConfig {
  bool neox = false;       // rotate the two halves of each head (qwen2/qwen3), not adjacent pairs (llama)
  float base = 10000.0f;   // frequency base
  int64_t n_rot = 0;       // rotated dims per head (0 = all of them)
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.0f;     // linear: positions divided by it; yarn: the context extension factor
  int64_t orig_ctx = 0;    // yarn: the context the model was trained for
  float ext_factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f;  // yarn ramp
  bool freq_factors = false;  // the model has rope_freqs.weight [n_rot/2] dividing each frequency (Llama 3)
  // Phi-3's LongRoPE: rope_factors_long.weight and rope_factors_short.weight [n_rot/2] divide the
  // frequencies, the long ones when the run's context (a cache's capacity, else the sequence)
  // exceeds orig_ctx; cos and sin are multiplied by attn_factor either way.
  bool long_short = false;
};

// Mixture-of-experts feed-forward blocks (every layer's, when experts > 0; nn/moe.h): E experts
// of width ffn, `used` chosen per token by a softmax router, their probabilities renormalised
// to sum 1 when norm_weights (Qwen3-MoE) or used as they are (OLMoE).
struct MoeConfig {
  int64_t experts = 0, used = 0, ffn = 0;
  bool norm_weights = true;
  int64_t shared_ffn = 0;  // a shared expert (a SwiGLU MLP every token runs, *_shexp) this wide; 0: none
};

// Sliding-window attention (Gemma 3): with pattern n, layer l attends only to the `window`
// latest positions (a query at p sees keys at p - window < k <= p) when l % n < n - 1; every
// n-th layer is global (pattern 0: every layer slides, as llama.cpp reads it). Sliding layers rotate with their own RoPE base and no scaling.
struct SwaConfig {
  int64_t window = 0;  // 0: no sliding layers
  int64_t pattern = 6;
  float rope_base = 10000.0f;
};

struct ModelConfig {
  std::string preset = "llama";
  int64_t vocab = 0;
  int64_t dim = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 4;
  int64_t ffn = 0;  // 0: the preset's default for dim (gpt 4*dim, llama ~8/3*dim)
  int64_t ctx = 64;         // the context the model was trained for (positions it knows)
  int64_t head_dim = 0;     // 0: dim / heads (qwen3 states it: 1024 / 16 heads with head dim 128)
  NormKind norm = NormKind::RMS;
  MlpKind mlp = MlpKind::SwiGLU;
  PosKind pos = PosKind::RoPE;
  RopeConfig rope;
  bool bias = false;         // biases on every linear layer and LayerNorm (GPT-2)
  bool qkv_bias = false;     // biases on the q, k and v projections only (Qwen2)
  bool qk_norm = false;      // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool attn_gate = false;    // gated attention (Qwen3.5): the q projection also gives a per-head
                             // gate, and the output is multiplied by its sigmoid
  bool tied = true;          // output head shares token_embd.weight
  bool depth_scale = false;  // "Curse of Depth": pre-norm outputs of layer l scaled by 1/sqrt(l)
  float norm_eps = 1e-5f;
  float init_scale = 1.0f;   // matrices ~ N(0, init_scale / sqrt(fan_in))
  float dropout = 0.0f;
  std::vector<LayerKind> layer_kinds;  // empty: every layer is attention
  GdnConfig gdn;                       // the Gated DeltaNet layers' widths
  // Published architectures' variations (each 0 / false when unused):
  int64_t nope_interval = 0;  // SmolLM3: layers l with (l + 1) % n == 0 have no RoPE at all
  bool fused_qkv = false;     // q, k, v rows in one attn_qkv tensor (Phi-3's layout; any llama-like file may use it)
  bool fused_gate_up = false; // ffn_up holds gate rows then up rows, [2F, D], and there is no ffn_gate (Phi-3)
  bool embed_scale = false;   // token embeddings multiplied by sqrt(dim) (Gemma)
  bool post_norms = false;    // RMSNorm of the attention and MLP outputs before each residual add (Gemma 3):
                              // blk.N.post_attention_norm / blk.N.post_ffw_norm
  float attn_scale = 0.0f;    // the query scale; 0: 1 / sqrt(head_dim)
  float logit_softcap = 0.0f; // logits = c tanh(logits / c); 0: none (Gemma's final_logit_softcapping)
  // Granite's multipliers (0: none): embeddings times embedding_scale, each residual branch's
  // output (attention, MLP) times residual_scale before it is added, logits divided by logit_scale.
  float embedding_scale = 0.0f, residual_scale = 0.0f, logit_scale = 0.0f;
  SwaConfig swa;
  MoeConfig moe;
  bool qk_norm_whole = false;  // q/k RMSNorm over the whole projection (weights [H d], [Hkv d]; OLMoE), not per head
  int64_t shortconv_kernel = 3;  // LFM2's short conv taps (lfm2.shortconv.l_cache), for ShortConv layers
  // Projection lens (`toy finetune --donor-embeddings`): the token table is lens_dim wide (a
  // donor model's, frozen) and token_embd_proj.weight [dim, lens_dim] projects each row to
  // dim. 0: no lens. Needs an untied head; a file for llama.cpp folds it (fold_lens).
  int64_t lens_dim = 0;

  // Fills defaults that depend on other fields (ffn from dim, head_dim from dim / heads).
  void resolve();
  LayerKind layer_kind(int64_t l) const;
  // Whether layer l rotates q and k (SmolLM3's no-RoPE layers do not), and whether it slides.
  bool layer_has_rope(int64_t l) const;
  bool layer_slides(int64_t l) const;
  bool has_gdn() const;
  bool has_shortconv() const;  // LFM2: its final norm is token_embd_norm
  // Whether some layer keeps a recurrent state (a sequence cannot be cut back or packed).
  bool has_recurrent() const { return has_gdn() || has_shortconv(); }
  // Qwen3.5's tensor names and block layout (the FFN norm is post_attention_norm).
  bool qwen35_layout() const { return attn_gate || has_gdn(); }
  // "ddda" (d: Gated DeltaNet, c: short conv, a: attention) repeated to `layers`; throws on other letters.
  static std::vector<LayerKind> parse_layer_kinds(const std::string& pattern, int64_t layers);
  // Every interval-th layer attention, the others Gated DeltaNet (llama.cpp's rule when a file
  // has no per-layer list).
  static std::vector<LayerKind> interval_layer_kinds(int64_t interval, int64_t layers);
  // Throws toy::Error naming the first nonsense value.
  void validate() const;
  // "gpt2", "llama", "qwen2", "qwen3", "qwen35", "smollm3", "phi3", "gemma3" or "toy" (see above); tokenizer_ok says whether the
  // vocabulary is one llama.cpp can read (byte / bpe, not char).
  std::string gguf_arch(bool tokenizer_ok) const;
  // The configuration a GGUF architecture implies for the fields its keys do not state
  // (norm, MLP, positions, biases, RoPE layout); throws for an architecture toy cannot run.
  static ModelConfig for_arch(const std::string& arch);

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
std::string to_string(RopeScaling s);

}  // namespace toy
