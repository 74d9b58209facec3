#include "toy/models/decoder_lm.h"

#include <cmath>
#include <string>

#include <fmt/core.h>

#include "toy/autograd/grad_mode.h"
#include "toy/core/machine.h"
#include "toy/ops/ops.h"

namespace toy {

namespace {
std::string blk(int64_t l, const char* name) { return fmt::format("blk.{}.{}", l, name); }
}  // namespace

DecoderLM::DecoderLM(ModelConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.resolve();
  cfg_.validate();
  declare([&](const std::string& name, const Shape& s) { return params_.add(name, zeros(s)); });
}

DecoderLM::DecoderLM(ModelConfig cfg, ShapesOnly) : cfg_(std::move(cfg)) {}

std::vector<std::pair<std::string, Shape>> DecoderLM::parameter_shapes(ModelConfig cfg) {
  cfg.resolve();
  cfg.validate();
  std::vector<std::pair<std::string, Shape>> out;
  DecoderLM m(std::move(cfg), ShapesOnly{});
  m.declare([&](const std::string& name, const Shape& s) {
    out.emplace_back(name, s);
    return Tensor();
  });
  return out;
}

template <class Add>
void DecoderLM::declare(Add add) {
  const int64_t D = cfg_.dim, V = cfg_.vocab, F = cfg_.ffn, d = cfg_.head_dim();
  const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads;
  const bool gpt_qkv = cfg_.norm == NormKind::Layer && cfg_.mlp == MlpKind::GELU && cfg_.pos == PosKind::Learned;
  tok_emb_ = add("token_embd.weight", {V, D});
  if (cfg_.pos == PosKind::Learned) pos_emb_ = add("position_embd.weight", {cfg_.ctx, D});
  const bool norm_bias = cfg_.norm == NormKind::Layer && cfg_.bias;
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    Layer L;
    L.attn_norm_w = add(blk(l, "attn_norm.weight"), {D});
    if (norm_bias) L.attn_norm_b = add(blk(l, "attn_norm.bias"), {D});
    if (gpt_qkv) {
      // GPT-2's GGUF layout: one fused projection, rows Q then K then V.
      L.qkv_w = add(blk(l, "attn_qkv.weight"), {(H + 2 * Hkv) * d, D});
      if (cfg_.bias) L.qkv_b = add(blk(l, "attn_qkv.bias"), {(H + 2 * Hkv) * d});
    } else {
      L.q_w = add(blk(l, "attn_q.weight"), {H * d, D});
      L.k_w = add(blk(l, "attn_k.weight"), {Hkv * d, D});
      L.v_w = add(blk(l, "attn_v.weight"), {Hkv * d, D});
      if (cfg_.bias) {
        // Split weights have split biases (Qwen2-style attn_q/k/v biases).
        L.q_b = add(blk(l, "attn_q.bias"), {H * d});
        L.k_b = add(blk(l, "attn_k.bias"), {Hkv * d});
        L.v_b = add(blk(l, "attn_v.bias"), {Hkv * d});
      }
    }
    L.out_w = add(blk(l, "attn_output.weight"), {D, H * d});
    if (cfg_.bias) L.out_b = add(blk(l, "attn_output.bias"), {D});
    L.ffn_norm_w = add(blk(l, "ffn_norm.weight"), {D});
    if (norm_bias) L.ffn_norm_b = add(blk(l, "ffn_norm.bias"), {D});
    if (cfg_.mlp == MlpKind::SwiGLU) {
      L.gate_w = add(blk(l, "ffn_gate.weight"), {F, D});
      if (cfg_.bias) L.gate_b = add(blk(l, "ffn_gate.bias"), {F});
    }
    L.up_w = add(blk(l, "ffn_up.weight"), {F, D});
    if (cfg_.bias) L.up_b = add(blk(l, "ffn_up.bias"), {F});
    L.down_w = add(blk(l, "ffn_down.weight"), {D, F});
    if (cfg_.bias) L.down_b = add(blk(l, "ffn_down.bias"), {D});
    layers_.push_back(L);
  }
  out_norm_w_ = add("output_norm.weight", {D});
  if (norm_bias) out_norm_b_ = add("output_norm.bias", {D});
  if (!cfg_.tied) out_w_ = add("output.weight", {V, D});
}

void DecoderLM::init(uint64_t seed) {
  NoGradGuard ng;
  uint64_t stream = 0;
  for (Tensor& p : params_.all()) {
    Generator g(seed, ++stream);
    const std::string& n = p.name();
    const bool is_bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    if (n == "token_embd.weight" || n == "position_embd.weight") {
      fill_normal_(p, g, 0.0f, 0.02f);
    } else if (n.find("norm") != std::string::npos && !is_bias) {
      fill_(p, 1.0);
    } else if (is_bias) {
      fill_(p, 0.0);
    } else {
      // Matrices [out, in]: N(0, s / sqrt(fan_in)).
      fill_normal_(p, g, 0.0f, cfg_.init_scale / std::sqrt(float(p.size(1))));
    }
  }
}

Tensor DecoderLM::norm(const Tensor& x, const Tensor& w, const Tensor& b) const {
  return cfg_.norm == NormKind::RMS ? rms_norm(x, w, cfg_.norm_eps) : layer_norm(x, w, b, cfg_.norm_eps);
}

Tensor DecoderLM::embed(const Tensor& ids, int64_t start, bool training, Generator* gen) {
  Tensor x = get_rows(tok_emb_, ids);  // [B, T, D]
  if (cfg_.pos == PosKind::Learned) {
    const int64_t T = ids.size(-1);
    Tensor pos = slice(pos_emb_, 0, start, start + T);  // [T, D] view of the table
    x = add(x, pos);
  }
  if (training && cfg_.dropout > 0) x = dropout(x, cfg_.dropout, true, gen ? *gen : default_generator());
  return x;
}

DecoderLM::Projections DecoderLM::projections(const Layer& L) const {
  Projections p;
  if (L.qkv_w.defined()) {
    p.qkv_w = L.qkv_w;
    p.qkv_b = L.qkv_b;
  } else {
    p.qkv_w = concat({L.q_w, L.k_w, L.v_w}, 0);
    if (L.q_b.defined()) p.qkv_b = concat({L.q_b, L.k_b, L.v_b}, 0);
  }
  if (cfg_.mlp == MlpKind::SwiGLU) {
    p.gate_up_w = concat({L.gate_w, L.up_w}, 0);
    if (L.gate_b.defined()) p.gate_up_b = concat({L.gate_b, L.up_b}, 0);
  }
  return p;
}

Tensor DecoderLM::block(int64_t l, const Tensor& x, const Tensor& positions, bool training, Generator* gen,
                        int64_t start) {
  const Layer& L = layers_[size_t(l)];
  const int64_t B = x.size(0), T = x.size(1), d = cfg_.head_dim();
  const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads;
  const float depth = cfg_.depth_scale ? 1.0f / std::sqrt(float(l + 1)) : 1.0f;
  Generator& g = gen ? *gen : default_generator();

  Tensor h = norm(x, L.attn_norm_w, L.attn_norm_b);
  if (depth != 1.0f) h = scale(h, depth);
  const Projections P = decode_projections_.empty() ? projections(L) : decode_projections_[size_t(l)];
  Tensor qkv = reshape(linear(h, P.qkv_w, P.qkv_b), Shape{B, T, H + 2 * Hkv, d});
  if (cfg_.pos == PosKind::RoPE) {
    // RoPE rotates the q and k heads of the packed tensor: no slices, and the backward
    // returns one packed gradient instead of three scattered ones.
    RopeOptions ro;
    ro.freq_base = cfg_.rope_base;
    ro.heads_begin = 0;
    ro.heads_end = H + Hkv;
    qkv = rope(qkv, positions, ro);
  }
  Tensor o;
  if (k_cache_.empty()) {
    o = attention_qkv(qkv, H, Hkv);  // [B, T, H, d]
  } else {
    // Incremental decoding: append k and v to the cache, attend to all of it.
    Tensor q = slice(qkv, 2, 0, H), k = slice(qkv, 2, H, H + Hkv), v = slice(qkv, 2, H + Hkv, H + 2 * Hkv);
    Tensor& kc = k_cache_[size_t(l)];
    Tensor& vc = v_cache_[size_t(l)];
    Tensor kr = slice(kc, 1, start, start + T), vr = slice(vc, 1, start, start + T);
    copy_(kr, k);
    copy_(vr, v);
    o = attention(q, slice(kc, 1, 0, start + T), slice(vc, 1, 0, start + T));
  }
  Tensor a = linear(reshape(o, Shape{B, T, H * d}), L.out_w, L.out_b);
  if (training && cfg_.dropout > 0) a = dropout(a, cfg_.dropout, true, g);
  Tensor xa = add(x, a);

  Tensor h2 = norm(xa, L.ffn_norm_w, L.ffn_norm_b);
  if (depth != 1.0f) h2 = scale(h2, depth);
  Tensor m;
  if (cfg_.mlp == MlpKind::GELU) {
    m = linear(gelu(linear(h2, L.up_w, L.up_b)), L.down_w, L.down_b);
  } else {
    // One matmul for gate and up, then the split form of swiglu.
    m = linear(swiglu(linear(h2, P.gate_up_w, P.gate_up_b)), L.down_w, L.down_b);
  }
  if (training && cfg_.dropout > 0) m = dropout(m, cfg_.dropout, true, g);
  return add(xa, m);
}

Tensor DecoderLM::hidden(const Tensor& ids, bool training, Generator* gen) {
  TOY_CHECK(ids.dtype() == DType::I32 && ids.ndim() == 2, "[model] ids must be i32 [B, T], got {}", describe(ids));
  const int64_t T = ids.size(1);
  TOY_CHECK(T <= cfg_.ctx, "[model] sequence of {} tokens is longer than the context {}", T, cfg_.ctx);
  Tensor x = embed(ids, 0, training, gen);
  Tensor positions = arange(T, DType::I32);
  for (int64_t l = 0; l < cfg_.layers; ++l) x = block(l, x, positions, training, gen, 0);
  return norm(x, out_norm_w_, out_norm_b_);
}

const Tensor& DecoderLM::head_weight() const { return cfg_.tied ? tok_emb_ : out_w_; }

Tensor DecoderLM::logits(const Tensor& ids, bool training, Generator* gen) {
  return linear(hidden(ids, training, gen), head_weight());
}

Tensor DecoderLM::loss(const Tensor& ids, const Tensor& targets, bool training, Generator* gen) {
  Tensor h = hidden(ids, training, gen);
  const int64_t rows = h.numel() / cfg_.dim;
  // Past ~4M logits, compute the loss in chunks of rows (each a recomputation region) so
  // that no logits-sized buffer exists; below that one pass is faster.
  constexpr int64_t kChunkElements = int64_t(1) << 22;
  if (rows * cfg_.vocab > kChunkElements)
    return linear_cross_entropy(h, head_weight(), targets, std::max<int64_t>(1, kChunkElements / cfg_.vocab));
  return cross_entropy(linear(h, head_weight()), targets);
}

void DecoderLM::reset_cache() {
  k_cache_.clear();
  v_cache_.clear();
  decode_projections_.clear();
  cache_len_ = 0;
}

Tensor DecoderLM::decode(const std::vector<int32_t>& ids) {
  NoGradGuard ng;
  const int64_t T = int64_t(ids.size());
  TOY_CHECK(T > 0, "[model] decode needs at least one token");
  TOY_CHECK(cache_len_ + T <= cfg_.ctx, "[model] KV cache full: {} cached + {} new tokens exceed the context {}",
            cache_len_, T, cfg_.ctx);
  for (int32_t id : ids)
    TOY_CHECK(id >= 0 && id < cfg_.vocab, "[model] token id {} is out of the vocabulary [0, {})", id, cfg_.vocab);
  if (k_cache_.empty()) {
    // The context comes from the model file: check what its cache needs before allocating.
    const double bytes = 2.0 * double(cfg_.layers) * double(cfg_.ctx) * double(cfg_.kv_heads * cfg_.head_dim()) * 4;
    const uint64_t avail = available_memory_bytes();
    TOY_CHECK(bytes <= double(avail), "[model] a KV cache for the context of {} tokens needs {}, more than the {} "
              "available", cfg_.ctx, format_bytes(bytes), format_bytes(double(avail)));
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      k_cache_.push_back(zeros(Shape{1, cfg_.ctx, cfg_.kv_heads, cfg_.head_dim()}));
      v_cache_.push_back(zeros(Shape{1, cfg_.ctx, cfg_.kv_heads, cfg_.head_dim()}));
      decode_projections_.push_back(projections(layers_[size_t(l)]));
    }
  }
  const int64_t start = cache_len_;
  Tensor idt = from_vector(ids, Shape{1, T});
  Tensor x = embed(idt, start, false, nullptr);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(start + t);
  Tensor positions = from_vector(pos, Shape{T});
  for (int64_t l = 0; l < cfg_.layers; ++l) x = block(l, x, positions, false, nullptr, start);
  cache_len_ += T;
  Tensor last = slice(x, 1, T - 1, T);  // [1, 1, D]
  return reshape(linear(norm(last, out_norm_w_, out_norm_b_), head_weight()), Shape{cfg_.vocab});
}

}  // namespace toy
