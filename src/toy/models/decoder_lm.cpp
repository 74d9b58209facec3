#include "toy/models/decoder_lm.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <fmt/core.h>

#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/models/shapes.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {
std::string blk(int64_t l, const char* name) { return fmt::format("blk.{}.{}", l, name); }

// I32 [T]: start, start + 1, ...
Tensor position_ids(int64_t start, int64_t T) {
  Tensor p = empty(Shape{T}, DType::I32);
  int32_t* d = p.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) d[t] = int32_t(start + t);
  return p;
}

RopeOptions rope_options(const ModelConfig& c, const Tensor& freq_factors) {
  RopeOptions o;
  o.n_dims = int(c.rope.n_rot ? c.rope.n_rot : c.head_dim);
  o.neox = c.rope.neox;
  o.freq_base = c.rope.base;
  if (c.rope.scaling != RopeScaling::None) o.freq_scale = 1.0f / c.rope.factor;
  if (c.rope.scaling == RopeScaling::Yarn) {
    o.ext_factor = c.rope.ext_factor;
    o.attn_factor = c.rope.attn_factor;
    o.beta_fast = c.rope.beta_fast;
    o.beta_slow = c.rope.beta_slow;
    o.n_ctx_orig = int(c.rope.orig_ctx ? c.rope.orig_ctx : c.ctx);
  }
  if (c.rope.long_short) o.attn_factor = c.rope.attn_factor;  // LongRoPE's cos/sin scale
  o.freq_factors = freq_factors;
  return o;
}

// A sliding layer's RoPE: its own base, no scaling (llama.cpp's freq_base_swa / freq_scale_swa).
RopeOptions swa_rope_options(const ModelConfig& c) {
  RopeOptions o;
  o.n_dims = int(c.rope.n_rot ? c.rope.n_rot : c.head_dim);
  o.neox = c.rope.neox;
  o.freq_base = c.swa.rope_base;
  return o;
}
}  // namespace

template <class Add>
void DecoderLM::declare(Add add) {
  const int64_t D = cfg_.dim, V = cfg_.vocab, F = cfg_.ffn, d = cfg_.head_dim;
  const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads;
  const bool gpt_qkv = cfg_.norm == NormKind::Layer && cfg_.mlp == MlpKind::GELU && cfg_.pos == PosKind::Learned;
  const bool norm_bias = cfg_.norm == NormKind::Layer && cfg_.bias;
  const auto norm_kind = cfg_.norm == NormKind::RMS ? nn::Norm::Kind::RMS : nn::Norm::Kind::Layer;
  auto make_norm = [&](const std::string& base, int64_t width, bool with_bias) {
    nn::Norm n{norm_kind, add(base + ".weight", Shape{width}, true), Tensor(), cfg_.norm_eps};
    if (with_bias) n.bias = add(base + ".bias", Shape{width}, true);
    return n;
  };
  auto make_linear = [&](const std::string& base, int64_t out, int64_t in, bool with_bias) {
    nn::Linear lin{add(base + ".weight", Shape{out, in}, true), Tensor()};
    if (with_bias) lin.bias = add(base + ".bias", Shape{out}, true);
    return lin;
  };
  const int64_t E = cfg_.lens_dim;
  tok_emb_.weight = add("token_embd.weight", Shape{V, E ? E : D}, true);
  lens_ = E ? make_linear("token_embd_proj", D, E, false) : nn::Linear{};
  if (cfg_.pos == PosKind::Learned) pos_emb_.weight = add("position_embd.weight", Shape{cfg_.ctx, D}, true);
  Tensor freq_factors, long_factors;
  const int64_t n_rot = cfg_.rope.n_rot ? cfg_.rope.n_rot : d;
  if (cfg_.pos == PosKind::RoPE && cfg_.rope.freq_factors)
    freq_factors = add("rope_freqs.weight", Shape{n_rot / 2}, false);  // a constant of the model, never trained
  if (cfg_.pos == PosKind::RoPE && cfg_.rope.long_short) {
    // (Constants too.) The short factors are the ones a run within the original context uses.
    long_factors = add("rope_factors_long.weight", Shape{n_rot / 2}, false);
    freq_factors = add("rope_factors_short.weight", Shape{n_rot / 2}, false);
  }
  blocks_.clear();
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    Block b;
    b.kind = cfg_.layer_kind(l);
    b.attn_norm = make_norm(blk(l, "attn_norm"), D, norm_bias);
    if (b.kind == LayerKind::ShortConv) {
      nn::ShortConv& s = b.conv;
      s.in_proj = make_linear(blk(l, "shortconv.in_proj"), 3 * D, D, false);
      s.conv = add(blk(l, "shortconv.conv.weight"), Shape{D, cfg_.shortconv_kernel}, true);
      s.out_proj = make_linear(blk(l, "shortconv.out_proj"), D, D, false);
    } else if (b.kind == LayerKind::GatedDeltaNet) {
      const GdnConfig& gc = cfg_.gdn;
      nn::GatedDeltaNet& n = b.gdn;
      n.k_heads = gc.k_heads, n.v_heads = gc.v_heads, n.head_dim = gc.head_dim, n.eps = cfg_.norm_eps;
      n.qkv = make_linear(blk(l, "attn_qkv"), gc.conv_dim(), D, false);
      n.gate = make_linear(blk(l, "attn_gate"), gc.value_dim(), D, false);
      n.conv = add(blk(l, "ssm_conv1d.weight"), Shape{gc.conv_dim(), gc.conv_kernel}, true);
      n.dt_bias = add(blk(l, "ssm_dt.bias"), Shape{gc.v_heads}, true);
      n.a = add(blk(l, "ssm_a"), Shape{gc.v_heads}, true);
      n.beta = make_linear(blk(l, "ssm_beta"), gc.v_heads, D, false);
      n.alpha = make_linear(blk(l, "ssm_alpha"), gc.v_heads, D, false);
      n.norm = nn::Norm{nn::Norm::Kind::RMS, add(blk(l, "ssm_norm.weight"), Shape{gc.head_dim}, true), Tensor(),
                        cfg_.norm_eps};
      n.out = make_linear(blk(l, "ssm_out"), D, gc.value_dim(), false);
    } else {
      nn::Attention& a = b.attn;
      a.heads = H, a.kv_heads = Hkv, a.head_dim = d;
      if (gpt_qkv || cfg_.fused_qkv) {
        // GPT-2's GGUF layout (and Phi-3's): one fused projection, rows Q then K then V.
        a.qkv = make_linear(blk(l, "attn_qkv"), (H + 2 * Hkv) * d, D, cfg_.bias || cfg_.qkv_bias);
      } else {
        const bool qkv_bias = cfg_.bias || cfg_.qkv_bias;  // split weights, split biases (Qwen2-style)
        a.gated = cfg_.attn_gate;
        a.q = make_linear(blk(l, "attn_q"), (a.gated ? 2 : 1) * H * d, D, qkv_bias);
        a.k = make_linear(blk(l, "attn_k"), Hkv * d, D, qkv_bias);
        a.v = make_linear(blk(l, "attn_v"), Hkv * d, D, qkv_bias);
      }
      if (cfg_.qk_norm) {
        const int64_t qw = cfg_.qk_norm_whole ? H * d : d, kw = cfg_.qk_norm_whole ? Hkv * d : d;
        a.q_norm = nn::Norm{nn::Norm::Kind::RMS, add(blk(l, "attn_q_norm.weight"), Shape{qw}, true), Tensor(),
                            cfg_.norm_eps};
        a.k_norm = nn::Norm{nn::Norm::Kind::RMS, add(blk(l, "attn_k_norm.weight"), Shape{kw}, true), Tensor(),
                            cfg_.norm_eps};
        a.norm_whole = cfg_.qk_norm_whole;
      }
      a.out = make_linear(blk(l, "attn_output"), D, H * d, cfg_.bias);
      a.scale = cfg_.attn_scale;
      if (cfg_.layer_slides(l)) {
        a.window = cfg_.swa.window;
        a.rope = swa_rope_options(cfg_);
      } else if (cfg_.layer_has_rope(l)) {
        a.rope = rope_options(cfg_, freq_factors);
        if (long_factors.defined()) a.rope_long = rope_options(cfg_, long_factors), a.long_after = cfg_.rope.orig_ctx;
      }
      if (cfg_.post_norms) b.attn_post_norm = make_norm(blk(l, "post_attention_norm"), D, false);
    }
    // (A Gated DeltaNet block is Qwen3.5's: RMSNorm and SwiGLU, validate() says so.)
    b.ffn_norm = make_norm(blk(l, cfg_.qwen35_layout() ? "post_attention_norm" : "ffn_norm"), D, norm_bias);
    b.mlp.kind = cfg_.mlp == MlpKind::SwiGLU ? nn::Mlp::Kind::SwiGLU
                 : cfg_.mlp == MlpKind::GeGLU ? nn::Mlp::Kind::GeGLU
                                              : nn::Mlp::Kind::GELU;
    const bool gated = cfg_.mlp != MlpKind::GELU;
    if (cfg_.moe.experts > 0) {
      const int64_t E = cfg_.moe.experts, Fe = cfg_.moe.ffn;
      nn::Moe& moe = b.moe;
      moe.router = make_linear(blk(l, "ffn_gate_inp"), E, D, false);
      moe.gate = add(blk(l, "ffn_gate_exps.weight"), Shape{E, Fe, D}, true);
      moe.up = add(blk(l, "ffn_up_exps.weight"), Shape{E, Fe, D}, true);
      moe.down = add(blk(l, "ffn_down_exps.weight"), Shape{E, D, Fe}, true);
      moe.used = cfg_.moe.used;
      moe.norm_weights = cfg_.moe.norm_weights;
      if (cfg_.moe.shared_ffn > 0) {
        const int64_t Fs = cfg_.moe.shared_ffn;
        moe.shared.kind = nn::Mlp::Kind::SwiGLU;
        moe.shared.gate = make_linear(blk(l, "ffn_gate_shexp"), Fs, D, false);
        moe.shared.up = make_linear(blk(l, "ffn_up_shexp"), Fs, D, false);
        moe.shared.down = make_linear(blk(l, "ffn_down_shexp"), D, Fs, false);
      }
    } else {
      if (gated && !cfg_.fused_gate_up) b.mlp.gate = make_linear(blk(l, "ffn_gate"), F, D, cfg_.bias);
      b.mlp.up = make_linear(blk(l, "ffn_up"), cfg_.fused_gate_up ? 2 * F : F, D, cfg_.bias);
      b.mlp.down = make_linear(blk(l, "ffn_down"), D, F, cfg_.bias);
    }
    if (cfg_.post_norms) b.ffn_post_norm = make_norm(blk(l, "post_ffw_norm"), D, false);
    blocks_.push_back(std::move(b));
  }
  out_norm_ = make_norm(cfg_.has_shortconv() ? "token_embd_norm" : "output_norm", D, norm_bias);  // (LFM2's name)
  head_.weight = cfg_.tied ? tok_emb_.weight : add("output.weight", Shape{V, D}, true);
}

DecoderLM::DecoderLM(ModelConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.resolve();
  cfg_.validate();
  declare([&](const std::string& name, const Shape& s, bool trainable) -> Tensor {
    return params_.add(name, zeros(s), trainable);
  });
}

DecoderLM::DecoderLM(ModelConfig cfg, const WeightSource& weights) : cfg_(std::move(cfg)) {
  cfg_.resolve();
  cfg_.validate();
  declare([&](const std::string& name, const Shape& s, bool) -> Tensor {
    return params_.add(name, weights(name, s), false);
  });
}

DecoderLM::DecoderLM(ModelConfig cfg, ShapesOnly) : cfg_(std::move(cfg)) {}

std::vector<std::pair<std::string, Shape>> DecoderLM::parameter_shapes(ModelConfig cfg) {
  cfg.resolve();
  cfg.validate();
  std::vector<std::pair<std::string, Shape>> out;
  DecoderLM m(std::move(cfg), ShapesOnly{});
  m.declare([&](const std::string& name, const Shape& s, bool) {
    out.emplace_back(name, s);
    return Tensor();
  });
  return out;
}

std::vector<std::pair<std::string, nn::Linear*>> DecoderLM::projections() {
  std::vector<std::pair<std::string, nn::Linear*>> out;
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    for (nn::Linear* lin : {&b.attn.qkv, &b.attn.q, &b.attn.k, &b.attn.v, &b.attn.out, &b.gdn.qkv, &b.gdn.gate,
                            &b.gdn.alpha, &b.gdn.beta, &b.gdn.out, &b.conv.in_proj, &b.conv.out_proj, &b.mlp.gate, &b.mlp.up, &b.mlp.down,
                            &b.moe.router, &b.moe.shared.gate, &b.moe.shared.up, &b.moe.shared.down})
      if (lin->defined()) out.emplace_back(lin->weight.name(), lin);
  }
  return out;
}

std::vector<std::pair<std::string, DecoderLM::ExpertWeight>> DecoderLM::expert_weights() {
  std::vector<std::pair<std::string, ExpertWeight>> out;
  for (Block& b : blocks_) {
    nn::Moe& m = b.moe;
    if (!m.gate.defined()) continue;
    out.emplace_back(m.gate.name(), ExpertWeight{&m.gate, &m.gate_lora});
    out.emplace_back(m.up.name(), ExpertWeight{&m.up, &m.up_lora});
    out.emplace_back(m.down.name(), ExpertWeight{&m.down, &m.down_lora});
  }
  return out;
}

void DecoderLM::init(uint64_t seed) {
  uint64_t stream = 0;
  for (Tensor& p : params_.values()) init_parameter(p, seed, ++stream, cfg_.init_scale);
}

void DecoderLM::init_parameter(Tensor& p, uint64_t seed, uint64_t stream, float init_scale) {
  NoGradGuard ng;
  Generator g(seed, stream);
  const std::string& n = p.name();
  const bool is_bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
  const auto ends_with = [&](const char* s) { return n.ends_with(s); };
  if (n == "rope_freqs.weight") {
    fill_(p, 1.0);  // no scaling until a file says otherwise
  } else if (n == "rope_factors_long.weight" || n == "rope_factors_short.weight") {
    float* f = p.data<float>();  // LongRoPE tables: a ramp over the frequencies (models/shapes.h)
    for (int64_t i = 0; i < p.numel(); ++i) f[i] = long_rope_factor(i, p.numel(), n == "rope_factors_long.weight");
  } else if (ends_with(".ssm_a")) {
    // Gated DeltaNet decay rates (as flash-linear-attention / Mamba initialise them): a = -A,
    // A ~ U(1, 16); with dt below, a head's decay per token exp(-A dt) spans short to long
    // memories.
    fill_uniform_(p, g, -16.0f, -1.0f);
  } else if (ends_with(".ssm_dt.bias")) {
    // dt log-uniform in [1e-3, 1e-1], stored as softplus^-1(dt) = dt + log(1 - e^-dt).
    Tensor u = empty(p.shape());
    fill_uniform_(u, g, std::log(1e-3f), std::log(1e-1f));
    const std::vector<float> lu = u.to_f32_vector();
    float* dst = p.data<float>();
    for (size_t i = 0; i < lu.size(); ++i) {
      const float dt = std::exp(lu[i]);
      dst[i] = dt + std::log(-std::expm1(-dt));
    }
  } else if (n == "token_embd.weight" || n == "position_embd.weight") {
    fill_normal_(p, g, 0.0f, 0.02f);
  } else if (n.find("norm") != std::string::npos && !is_bias) {
    fill_(p, 1.0);
  } else if (is_bias) {
    fill_(p, 0.0);
  } else {
    // Matrices [out, in]: N(0, s / sqrt(fan_in)).
    fill_normal_(p, g, 0.0f, init_scale / std::sqrt(float(p.size(-1))));  // (experts [E, out, in] too)
  }
}

void DecoderLM::fold_lens() {
  if (!lens_.defined()) return;
  NoGradGuard ng;
  const int64_t V = cfg_.vocab, D = cfg_.dim;
  Tensor folded = empty(Shape{V, D});
  constexpr int64_t kRows = 4096;  // the table's F32 rows exist a chunk at a time
  for (int64_t r0 = 0; r0 < V; r0 += kRows) {
    const int64_t n = std::min(kRows, V - r0);
    Tensor ids = empty(Shape{n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = int32_t(r0 + i);
    Tensor rows = slice(folded, 0, r0, r0 + n);
    copy_(rows, lens_(tok_emb_(ids)));
  }
  params_.remove("token_embd_proj.weight");
  tok_emb_.weight = params_.replace("token_embd.weight", folded);
  lens_ = nn::Linear{};
  cfg_.lens_dim = 0;
}

Tensor DecoderLM::embed(const Tensor& ids, int64_t start, const Tensor& positions, bool training, Generator* gen) {
  Tensor x = tok_emb_(ids);  // [B, T, D] ([B, T, E] through the lens)
  if (lens_.defined()) x = lens_(x);
  if (cfg_.embed_scale) x = scale(x, std::sqrt(float(cfg_.dim)));
  if (cfg_.embedding_scale != 0.0f) x = scale(x, cfg_.embedding_scale);  // (Granite)
  if (cfg_.pos == PosKind::Learned) {
    const int64_t T = ids.size(-1);
    // (Positions [B, T] — packed rows, several sequences — are checked as the table's ids.)
    TOY_CHECK(positions.ndim() == 2 || start + T <= cfg_.ctx, "[model] position {} is past the {} learned positions",
              start + T - 1, cfg_.ctx);
    Tensor pos = positions.ndim() == 2                    ? pos_emb_(positions)  // [B, T, D]: packed rows
                 : pos_emb_.weight.dtype() == DType::F32 ? slice(pos_emb_.weight, 0, start, start + T)  // a view
                                                          : pos_emb_(positions);
    x = add(x, pos);
  }
  if (training && cfg_.dropout > 0) x = dropout(x, cfg_.dropout, true, gen ? *gen : default_generator());
  return x;
}

Tensor DecoderLM::block(int64_t l, const Tensor& x, const Tensor& positions, const Tensor& segments, bool training,
                        Generator* gen, nn::KVCache* cache, std::span<nn::KVCache* const> step_caches,
                        std::span<const int64_t> prefill_lengths) {
  const Block& b = blocks_[size_t(l)];
  const float depth = cfg_.depth_scale ? 1.0f / std::sqrt(float(l + 1)) : 1.0f;
  Generator& g = gen ? *gen : default_generator();
  Tensor h = b.attn_norm(x);
  if (depth != 1.0f) h = scale(h, depth);
  Tensor a;
  if (!prefill_lengths.empty())
    a = b.attn.prefill(h, positions, step_caches, prefill_lengths, l);  // (attention layers only: prefill())
  else if (!step_caches.empty())
    a = b.kind == LayerKind::GatedDeltaNet ? b.gdn.step(h, step_caches, l)
        : b.kind == LayerKind::ShortConv   ? b.conv.step(h, step_caches, l)
                                           : b.attn.step(h, positions, step_caches, l);
  else
    a = b.kind == LayerKind::GatedDeltaNet ? b.gdn(h, cache, l)
        : b.kind == LayerKind::ShortConv   ? b.conv(h, cache, l)
                                           : b.attn(h, positions, cache, l, segments);
  if (b.attn_post_norm.defined()) a = b.attn_post_norm(a);
  if (cfg_.residual_scale != 0.0f) a = scale(a, cfg_.residual_scale);
  if (training && cfg_.dropout > 0) a = dropout(a, cfg_.dropout, true, g);
  Tensor xa = add(x, a);
  Tensor h2 = b.ffn_norm(xa);
  if (depth != 1.0f) h2 = scale(h2, depth);
  Tensor m = b.moe.gate.defined() ? b.moe(h2, balance_ ? &*balance_ : nullptr) : b.mlp(h2);
  if (b.ffn_post_norm.defined()) m = b.ffn_post_norm(m);
  if (cfg_.residual_scale != 0.0f) m = scale(m, cfg_.residual_scale);
  if (training && cfg_.dropout > 0) m = dropout(m, cfg_.dropout, true, g);
  return add(xa, m);
}

Device DecoderLM::device() const { return tok_emb_.weight.device(); }

Tensor DecoderLM::hidden(const Tensor& ids_in, bool training, Generator* gen, nn::KVCache* cache,
                         const Packing* packing) {
  TOY_CHECK(ids_in.dtype() == DType::I32 && ids_in.ndim() == 2, "[model] ids must be i32 [B, T], got {}",
            describe(ids_in));
  const Device dev = device();
  // A batch made on the host is checked there (no read back on a device) and uploaded once.
  const Tensor ids = !is_host(dev) && is_host(ids_in.device()) ? upload_checked_ids(ids_in, dev, cfg_.vocab, "model", "ids")
                                                               : to(ids_in, dev);
  const int64_t T = ids.size(1);
  int64_t start = 0;
  if (cache) {
    TOY_CHECK(cache->batch() == ids.size(0), "[model] the cache holds {} sequences, the batch has {}", cache->batch(),
              ids.size(0));
    cache->check_room(T);
    start = cache->size();
  } else {
    TOY_CHECK(T <= cfg_.ctx, "[model] sequence of {} tokens is longer than the context {}", T, cfg_.ctx);
  }
  std::optional<nn::TrainingScope> scope;  // LoRA dropout draws from the same generator
  if (training) scope.emplace(gen ? *gen : default_generator());
  Tensor positions = to(position_ids(start, T), dev), segments;
  if (packing) {
    TOY_CHECK(!cache, "[model] packed rows are for training, not for a cache");
    TOY_CHECK(!cfg_.has_recurrent(), "[model] packed rows need attention's block-causal mask; a {} layer's state "
              "would carry one example into the next: train this model without --pack",
              cfg_.has_gdn() ? "Gated DeltaNet" : "short-convolution");
    TOY_CHECK(packing->positions.dtype() == DType::I32 && packing->positions.shape() == ids.shape() &&
                  packing->segments.dtype() == DType::I32 && packing->segments.shape() == ids.shape(),
              "[model] packed rows need i32 positions and segments shaped as the ids {}, got {} and {}",
              ids.shape().str(), describe(packing->positions), describe(packing->segments));
    positions = to(packing->positions, dev), segments = to(packing->segments, dev);
  }
  Tensor x = embed(ids, start, positions, training, gen);
  const bool recompute = recompute_ && !cache && grad_enabled();
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    if (!recompute) {
      x = block(l, x, positions, segments, training, gen, cache);
      continue;
    }
    // The first run draws from the caller's generator (advancing it); the re-run during
    // backward draws the same masks from a copy of it as the block began, under the same
    // training scope. (A copy, not the caller's object: backward runs after the caller's
    // generator may be gone — a micro-batch's generator is a local of its loss function.)
    Generator* g = training ? (gen ? gen : &default_generator()) : nullptr;
    auto replay = std::make_shared<std::optional<Generator>>();
    if (g) replay->emplace(*g);
    auto first = std::make_shared<bool>(true);
    x = checkpoint(
        [this, l, positions, segments, training, g, replay, first](const std::vector<Tensor>& in) {
          Generator again;
          Generator* draw = g;
          if (g && !*first) again = **replay, draw = &again;
          *first = false;
          std::optional<nn::TrainingScope> scope;
          if (draw) scope.emplace(*draw);
          return block(l, in[0], positions, segments, training, draw, nullptr);
        },
        {x});
  }
  if (cache) cache->advance(T);
  return out_norm_(x);
}

Tensor DecoderLM::head_logits(const Tensor& h) const {
  Tensor z = head_(h);
  if (cfg_.logit_scale != 0.0f) z = scale(z, 1.0f / cfg_.logit_scale);  // (Granite)
  if (cfg_.logit_softcap == 0.0f) return z;
  const float c = cfg_.logit_softcap;  // Gemma's soft cap: c tanh(z / c)
  return scale(tanh(scale(z, 1.0f / c)), c);
}

Tensor DecoderLM::logits(const Tensor& ids, bool training, Generator* gen, nn::KVCache* cache) {
  return head_logits(hidden(ids, training, gen, cache));
}

Tensor DecoderLM::loss(const Tensor& ids, const Tensor& targets, bool training, Generator* gen,
                       const Packing* packing) {
  // Mixture of experts: the forward's routing statistics, for the load-balancing loss.
  if (training && moe_aux_coef_ > 0 && cfg_.moe.experts > 0) {
    // A recomputed block runs its first forward without a graph: the routing statistics
    // would reach the loss as constants, never the routers.
    TOY_CHECK(!(recompute_ && grad_enabled()), "[model] --moe-aux-loss cannot be combined with --recompute (the "
              "load-balancing loss needs each layer's routing graph, which recomputation drops): leave one out");
    balance_.emplace();
  }
  Tensor h = hidden(ids, training, gen, nullptr, packing);
  Tensor aux;
  if (balance_) {
    const Tensor b = balance_->loss();
    if (b.defined()) aux = scale(b, moe_aux_coef_);
    balance_.reset();
  }
  auto with_aux = [&](const Tensor& l) { return aux.defined() ? add(l, aux) : l; };
  const int32_t ignore = CrossEntropyOptions{}.ignore_index;
  const Tensor targets_d = !is_host(device()) && is_host(targets.device())
                               ? upload_checked_ids(targets, device(), cfg_.vocab, "model", "targets", &ignore)
                               : to(targets, device());
  const int64_t rows = h.numel() / cfg_.dim;
  // Past ~4M logits, compute the loss in chunks of rows (each a recomputation region) so
  // that no logits-sized buffer exists; below that one pass is faster. A GPU takes chunks of
  // 256M logits (1 GiB): its products want many rows, and each chunk adds a whole [V, D]
  // gradient into the head's (GPT-2 124M, 16K rows: 198 chunks of 83 rows took 40% of a
  // bf16 step on an H200; 4 chunks are a few per cent).
  const int64_t chunk_elements = device() == Device::CUDA ? int64_t(1) << 28 : int64_t(1) << 22;
  if (rows * cfg_.vocab > chunk_elements && cfg_.logit_softcap == 0.0f && cfg_.logit_scale == 0.0f) {
    // Mixed precision (set_mixed_precision): the head multiplies in the projections' type too
    // (head_logits below rounds through nn::Linear itself).
    const Tensor head_w = head_.compute != DType::F32 && head_.weight.dtype() == DType::F32
                              ? cast(head_.weight, head_.compute)
                              : head_.weight;
    // The batch's count of counted targets, from the host copy when there is one (a device
    // run then reads nothing back for it).
    CrossEntropyOptions o;
    if (is_host(targets.device())) {
      const Tensor t = contiguous(targets);
      const int32_t* p = t.data<int32_t>();
      int64_t counted = 0;
      for (int64_t i = 0; i < t.numel(); ++i) counted += p[i] != o.ignore_index;
      o.normalizer = counted > 0 ? float(counted) : 1.0f;
    }
    return with_aux(
        linear_cross_entropy(h, head_w, targets_d, std::max<int64_t>(1, chunk_elements / cfg_.vocab), o));
  }
  return with_aux(cross_entropy(head_logits(h), targets_d));
}

nn::KVCache DecoderLM::new_cache(int64_t batch, int64_t capacity, DType dtype) const {
  if (capacity == 0) capacity = cfg_.ctx;
  TOY_CHECK(cfg_.pos != PosKind::Learned || capacity <= cfg_.ctx,
            "[model] a cache of {} tokens is longer than the model's {} learned positions", capacity, cfg_.ctx);
  std::vector<nn::RecurrentShape> recurrent;
  if (cfg_.has_recurrent())
    for (const Block& b : blocks_)
      recurrent.push_back(b.kind == LayerKind::GatedDeltaNet ? b.gdn.state_shape()
                          : b.kind == LayerKind::ShortConv   ? b.conv.state_shape()
                                                             : nn::RecurrentShape{});
  // Sliding layers keep only their window (a ring).
  std::vector<int64_t> windows;
  for (int64_t l = 0; l < cfg_.layers && cfg_.swa.window > 0; ++l)
    windows.push_back(cfg_.layer_slides(l) ? cfg_.swa.window : 0);
  return nn::KVCache(cfg_.layers, batch, capacity, cfg_.kv_heads, cfg_.head_dim, dtype, std::move(recurrent),
                     device(), std::move(windows));
}

Tensor DecoderLM::decode(nn::KVCache& cache, std::span<const int32_t> ids) {
  NoGradGuard ng;
  const int64_t T = int64_t(ids.size());
  TOY_CHECK(T > 0, "[model] decode needs at least one token");
  for (int32_t id : ids)
    TOY_CHECK(id >= 0 && id < cfg_.vocab, "[model] token id {} is out of the vocabulary [0, {})", id, cfg_.vocab);
  Tensor batch = empty(Shape{1, T}, DType::I32);  // from the caching allocator: no heap allocation
  std::copy(ids.begin(), ids.end(), batch.data<int32_t>());
  Tensor x = hidden(batch, false, nullptr, &cache);
  Tensor last = slice(x, 1, T - 1, T);  // [1, 1, D]
  return reshape(head_logits(last), Shape{cfg_.vocab});
}

Tensor DecoderLM::decode_step(std::span<nn::KVCache* const> caches, std::span<const int32_t> ids) {
  NoGradGuard ng;
  const int64_t N = int64_t(caches.size());
  TOY_CHECK(N > 0 && ids.size() == caches.size(), "[model] decode_step needs one token per cache, got {} tokens for {}",
            ids.size(), caches.size());
  Tensor tokens = empty(Shape{N, 1}, DType::I32), positions = empty(Shape{N, 1}, DType::I32);
  for (int64_t i = 0; i < N; ++i) {
    nn::KVCache& c = *caches[size_t(i)];
    TOY_CHECK(c.batch() == 1, "[model] decode_step takes caches of one sequence each, got one of {}", c.batch());
    c.check_room(1);
    TOY_CHECK(ids[size_t(i)] >= 0 && ids[size_t(i)] < cfg_.vocab, "[model] token id {} is out of the vocabulary [0, {})",
              ids[size_t(i)], cfg_.vocab);
    tokens.data<int32_t>()[i] = ids[size_t(i)];
    positions.data<int32_t>()[i] = int32_t(c.size());
  }
  Tensor x = embed(tokens, 0, positions, false, nullptr);
  for (int64_t l = 0; l < cfg_.layers; ++l) x = block(l, x, positions, Tensor(), false, nullptr, nullptr, caches);
  for (nn::KVCache* c : caches) c->advance(1);
  return reshape(head_logits(out_norm_(x)), Shape{N, cfg_.vocab});
}

Tensor DecoderLM::prefill(std::span<nn::KVCache* const> caches, std::span<const std::span<const int32_t>> prompts) {
  NoGradGuard ng;
  const size_t N = caches.size();
  TOY_CHECK(N > 0 && prompts.size() == N, "[model] prefill needs one prompt per cache, got {} prompts for {}",
            prompts.size(), N);
  std::vector<int64_t> lengths(N);
  int64_t S = 0;
  for (size_t i = 0; i < N; ++i) {
    nn::KVCache& c = *caches[i];
    TOY_CHECK(c.batch() == 1, "[model] prefill takes caches of one sequence each, got one of {}", c.batch());
    TOY_CHECK(!prompts[i].empty(), "[model] prefill: prompt {} is empty", i);
    c.check_room(int64_t(prompts[i].size()));
    for (int32_t id : prompts[i])
      TOY_CHECK(id >= 0 && id < cfg_.vocab, "[model] token id {} is out of the vocabulary [0, {})", id, cfg_.vocab);
    lengths[i] = int64_t(prompts[i].size());
    S += lengths[i];
  }
  const int64_t V = cfg_.vocab;
  if (N == 1 || cfg_.has_recurrent()) {
    Tensor out = empty(Shape{int64_t(N), V}, DType::F32);
    for (size_t i = 0; i < N; ++i) {
      Tensor row = slice(out, 0, int64_t(i), int64_t(i) + 1);
      copy_(row, reshape(decode(*caches[i], prompts[i]), Shape{1, V}));
    }
    return out;
  }
  Tensor tokens = empty(Shape{1, S}, DType::I32), positions = empty(Shape{1, S}, DType::I32);
  for (size_t i = 0, at = 0; i < N; ++i)
    for (size_t t = 0; t < prompts[i].size(); ++t, ++at) {
      tokens.data<int32_t>()[at] = prompts[i][t];
      positions.data<int32_t>()[at] = int32_t(caches[i]->size() + int64_t(t));
    }
  Tensor x = embed(tokens, 0, positions, false, nullptr);
  for (int64_t l = 0; l < cfg_.layers; ++l)
    x = block(l, x, positions, Tensor(), false, nullptr, nullptr, caches, lengths);
  // Each sequence's last row, then the norm and the head on those N rows only.
  std::vector<Tensor> last;
  last.reserve(N);
  int64_t end = 0;
  for (size_t i = 0; i < N; ++i) {
    caches[i]->advance(lengths[i]);
    end += lengths[i];
    last.push_back(slice(x, 1, end - 1, end));
  }
  return reshape(head_logits(out_norm_(concat(last, 1))), Shape{int64_t(N), V});
}

}  // namespace toy
