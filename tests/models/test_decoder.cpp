// DecoderLM beyond the reference oracle's configuration: the llama layout (split q/k/v with
// biases, GQA, RoPE on the packed projection, SwiGLU) and incremental decoding. Oracle: the
// model's own full-sequence forward, which the parity test ties to the reference model.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "helpers.h"
#include "proc.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/rng.h"
#include "toy/infer/generate.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/lora.h"
#include "toy/models/shapes.h"
#include "toy/tokenizer/tokenizer.h"

using namespace toy;
using namespace toy::test;

namespace {

// A small model with every parameter random (biases and norm weights too), so that a
// parameter the forward forgets to use changes the numbers.
DecoderLM random_model(const std::string& preset, bool bias, int64_t ctx) {
  ModelConfig c = ModelConfig::from_preset(preset);
  c.vocab = 11, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = preset == "llama" ? 2 : 4, c.ctx = ctx;
  c.bias = bias;
  DecoderLM m(c);
  NoGradGuard ng;
  uint64_t stream = 0;
  for (Tensor& p : m.params().values()) {
    Generator g(5, ++stream);
    fill_normal_(p, g, 0.0f, 0.3f);
  }
  return m;
}

std::vector<int32_t> token_ids(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t((i * 7 + 3) % vocab));
  return ids;
}

// Two rows of 12 token ids and their next-token targets (the last one 0).
std::pair<Tensor, Tensor> next_token_batch(int64_t vocab) {
  const std::vector<int32_t> ids = token_ids(24, vocab);
  std::vector<int32_t> targets(ids.begin() + 1, ids.end());
  targets.push_back(0);
  return {from_vector(ids, Shape{2, 12}), from_vector(targets, Shape{2, 12})};
}

}  // namespace

TEST(Decoder, IncrementalDecodingMatchesTheFullForward) {
  for (const char* preset : {"gpt", "llama"}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (bias ? " with biases" : ""));
      const int64_t T = 12;
      DecoderLM m = random_model(preset, bias, T);
      const std::vector<int32_t> ids = token_ids(T, m.config().vocab);
      Tensor full;
      {
        NoGradGuard ng;
        full = m.logits(from_vector(ids, Shape{1, T}));  // [1, T, V]
      }
      const int64_t V = m.config().vocab;
      // A 5-token prompt, then one token at a time.
      nn::KVCache cache = m.new_cache();
      Tensor last = m.decode(cache, std::vector<int32_t>(ids.begin(), ids.begin() + 5));
      EXPECT_TRUE(close(last, reshape(slice(full, 1, 4, 5), Shape{V}), 1e-4, 1e-4)) << "after the prompt";
      for (int64_t t = 5; t < T; ++t) {
        last = m.decode(cache, {ids[size_t(t)]});
        EXPECT_TRUE(close(last, reshape(slice(full, 1, t, t + 1), Shape{V}), 1e-4, 1e-4)) << "position " << t;
      }
      // A full cache refuses more, saying how to size it.
      EXPECT_THROW(m.decode(cache, {1}), Error);
      // decode_next re-reads the last capacity/2 tokens of the history.
      std::vector<int32_t> history = ids;
      history.push_back(4);
      Tensor next = decode_next(m, cache, history);
      const std::vector<int32_t> tail(history.end() - T / 2, history.end());
      Tensor window;
      {
        NoGradGuard ng;
        window = m.logits(from_vector(tail, Shape{1, int64_t(tail.size())}));
      }
      const int64_t n = int64_t(tail.size());
      EXPECT_TRUE(close(next, reshape(slice(window, 1, n - 1, n), Shape{V}), 1e-4, 1e-4)) << "re-primed window";
    }
  }
}

TEST(Decoder, EveryParameterReceivesAGradient) {
  // Regression: with SwiGLU and biases, ffn_up.bias was created but never used.
  for (const char* preset : {"gpt", "llama"}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (bias ? " with biases" : ""));
      DecoderLM m = random_model(preset, bias, 8);
      const std::vector<int32_t> ids = token_ids(16, m.config().vocab);
      std::vector<int32_t> targets(ids.begin() + 1, ids.end());
      targets.push_back(0);
      backward(m.loss(from_vector(ids, Shape{2, 8}), from_vector(targets, Shape{2, 8})));
      for (const Tensor& p : m.params().values()) {
        ASSERT_TRUE(p.grad().defined()) << p.name();
        double norm = 0;
        for (float v : p.grad().to_f32_vector()) norm += double(v) * v;
        EXPECT_GT(norm, 0.0) << p.name() << " gets no gradient";
      }
    }
  }
}

namespace {

// Every parameter of m random after its init: vectors (norms, biases) perturbed, matrices
// N(0, 0.3) — but those `keep` names (constants, decay rates) as the init made them.
void randomize(DecoderLM& m, uint64_t seed, const std::function<bool(const std::string&)>& keep) {
  NoGradGuard ng;
  uint64_t stream = 0;
  for (Tensor& p : m.params().values()) {
    Generator g(seed, 1000 + ++stream);
    if (keep(p.name())) continue;
    Tensor noise = randn(p.shape(), g, 0.0f, 0.3f);
    copy_(p, p.ndim() == 1 ? add(p, noise) : noise);
  }
}

// The backward's gradient of parameter `name` (already computed for the loss of x, y) against
// central differences of that loss with step h, at three elements (first, `middle`, last).
void expect_central_differences(DecoderLM& m, const Tensor& x, const Tensor& y, const std::string& name, float h,
                                int64_t middle) {
  NoGradGuard ng;
  Tensor& p = m.params().get(name);
  const std::vector<float> grad = p.grad().to_f32_vector();
  float* w = p.data<float>();
  for (int64_t i : {int64_t(0), middle, p.numel() - 1}) {
    const float keep = w[i];
    w[i] = keep + h;
    const double up = m.loss(x, y).item();
    w[i] = keep - h;
    const double down = m.loss(x, y).item();
    w[i] = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(grad[size_t(i)], numeric, 2e-3 + 3e-2 * std::fabs(numeric)) << name << " element " << i;
  }
}

// A small Qwen3.5-style hybrid: Gated DeltaNet layers (fewer K heads than V heads) and gated
// attention with a quarter of each head rotated; every parameter random, the GDN decay rates
// negative as the model keeps them.
DecoderLM random_hybrid(const std::string& kinds, int64_t ctx, uint64_t seed = 5) {
  ModelConfig c = ModelConfig::from_preset("qwen35");
  c.vocab = 11, c.dim = 32, c.layers = int64_t(kinds.size()), c.heads = 4, c.kv_heads = 2, c.ctx = ctx;
  c.rope.n_rot = 4;
  c.layer_kinds = ModelConfig::parse_layer_kinds(kinds, c.layers);
  c.gdn = GdnConfig{1, 2, 8, 4};
  DecoderLM m(c);
  m.init(seed);
  randomize(m, seed, [](const std::string& n) { return n.ends_with(".ssm_a") || n.ends_with(".ssm_dt.bias"); });
  return m;
}

}  // namespace

// Prefill (chunked GDN from 64 tokens on, token by token below) then one token at a time
// equals the full forward at every position, for a hybrid model.
TEST(Decoder, HybridPrefillThenDecodeEqualsTheFullForward) {
  const int64_t T = 84;
  DecoderLM m = random_hybrid("dda", T);
  const std::vector<int32_t> ids = token_ids(T, m.config().vocab);
  const int64_t V = m.config().vocab;
  Tensor full;
  {
    NoGradGuard ng;
    full = m.logits(from_vector(ids, Shape{1, T}));
  }
  for (int64_t prompt : {int64_t(5), int64_t(70)}) {
    SCOPED_TRACE("prompt of " + std::to_string(prompt));
    nn::KVCache cache = m.new_cache();
    Tensor last = m.decode(cache, std::vector<int32_t>(ids.begin(), ids.begin() + prompt));
    EXPECT_TRUE(close(last, reshape(slice(full, 1, prompt - 1, prompt), Shape{V}), 1e-4, 1e-4)) << "after the prompt";
    for (int64_t t = prompt; t < T; ++t) {
      last = m.decode(cache, {ids[size_t(t)]});
      ASSERT_TRUE(close(last, reshape(slice(full, 1, t, t + 1), Shape{V}), 1e-4, 1e-4)) << "position " << t;
    }
    // Starting over resets the recurrent state too.
    cache.clear();
    last = m.decode(cache, std::vector<int32_t>(ids.begin(), ids.begin() + 3));
    EXPECT_TRUE(close(last, reshape(slice(full, 1, 2, 3), Shape{V}), 1e-4, 1e-4)) << "after clear()";
  }
}

// Every parameter of a hybrid gets a gradient, and the GDN layer's own parameters get the
// right one (central differences of the loss, a few elements each).
TEST(Decoder, HybridGradientsMatchFiniteDifferences) {
  DecoderLM m = random_hybrid("da", 12, 7);
  const auto [x, y] = next_token_batch(m.config().vocab);
  backward(m.loss(x, y));
  for (const Tensor& p : m.params().values()) {
    ASSERT_TRUE(p.grad().defined()) << p.name();
    double norm = 0;
    for (float v : p.grad().to_f32_vector()) norm += double(v) * v;
    EXPECT_GT(norm, 0.0) << p.name() << " gets no gradient";
  }
  for (const char* name : {"blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_conv1d.weight",
                           "blk.0.ssm_dt.bias", "blk.0.ssm_a", "blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight",
                           "blk.0.ssm_norm.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight"})
    expect_central_differences(m, x, y, name, 1e-2f, m.params().get(name).numel() / 2);
}

namespace {

// A small model of a published architecture with every parameter random (its RoPE tables
// kept): gemma3 with sliding layers (window 5, every 2nd layer global) and a soft cap, phi3
// with fused q/k/v and gate/up and LongRoPE switching at 16 positions, smollm3 with its
// no-RoPE 4th layer.
DecoderLM random_published(const std::string& arch, int64_t ctx, uint64_t seed = 5) {
  ModelConfig c = ModelConfig::for_arch(arch);
  c.vocab = 11, c.dim = 32, c.layers = 4, c.heads = 4, c.kv_heads = 2, c.ctx = ctx, c.ffn = 48;
  if (arch == "gemma3") c.head_dim = 16, c.swa = SwaConfig{5, 2, 10000.0f}, c.logit_softcap = 5.0f;
  if (arch == "qwen3moe" || arch == "olmoe" || arch == "granitemoe")
    c.moe = MoeConfig{4, 2, 24, arch != std::string("olmoe"), 0};
  if (arch == "granitemoe") {
    c.moe.shared_ffn = 16;
    c.embedding_scale = 3.0f, c.residual_scale = 0.5f, c.attn_scale = 0.3f, c.logit_scale = 2.0f;
  }
  if (arch == "olmoe") c.kv_heads = 4;
  if (arch == "lfm2") c.layer_kinds = ModelConfig::parse_layer_kinds("ca", 4);
  if (arch == "phi3") {
    c.fused_qkv = true, c.rope.n_rot = 4, c.rope.long_short = true, c.rope.orig_ctx = 16, c.rope.attn_factor = 1.2f;
    c.tied = false;
  }
  DecoderLM m(c);
  m.init(seed);
  randomize(m, seed, [](const std::string& n) { return n.starts_with("rope_"); });
  return m;
}

}  // namespace

// Cached decoding of the published architectures equals the full forward at every position,
// fed in chunks of every size (one token, a few, more than a window at once) and through
// decode_step; a sliding layer's cache is a ring of its window, the global layers' the whole
// context.
TEST(Decoder, PublishedArchitecturesDecodeAsTheFullForward) {
  const int64_t T = 40;
  for (const char* arch : {"gemma3", "phi3", "smollm3", "qwen3moe", "olmoe", "granitemoe", "lfm2"}) {
    SCOPED_TRACE(arch);
    DecoderLM m = random_published(arch, T);
    const std::vector<int32_t> ids = token_ids(T, m.config().vocab);
    const int64_t V = m.config().vocab;
    nn::KVCache cache = m.new_cache();  // capacity T: LongRoPE's long factors, as the full forward's
    Tensor full;
    {
      NoGradGuard ng;
      full = m.logits(from_vector(ids, Shape{1, T}));
    }
    int64_t t = 0;
    for (int64_t chunk : {3, 1, 1, 7, 1, 12, 1, 2, 1, 1, 6, 1, 1, 1, 1}) {
      const std::vector<int32_t> part(ids.begin() + t, ids.begin() + t + chunk);
      Tensor last = m.decode(cache, part);
      t += chunk;
      ASSERT_TRUE(close(last, reshape(slice(full, 1, t - 1, t), Shape{V}), 1e-4, 1e-4)) << "after position " << t - 1;
    }
    ASSERT_EQ(t, T);
    // decode_step: two sequences at different lengths, each continuing its own cache.
    nn::KVCache a = m.new_cache(), b = m.new_cache();
    m.decode(a, std::vector<int32_t>(ids.begin(), ids.begin() + 9));
    m.decode(b, std::vector<int32_t>(ids.begin(), ids.begin() + 21));
    std::vector<nn::KVCache*> both{&a, &b};
    const Tensor step = m.decode_step(both, std::vector<int32_t>{ids[9], ids[21]});
    EXPECT_TRUE(close(slice(step, 0, 0, 1), reshape(slice(full, 1, 9, 10), Shape{1, V}), 1e-4, 1e-4));
    EXPECT_TRUE(close(slice(step, 0, 1, 2), reshape(slice(full, 1, 21, 22), Shape{1, V}), 1e-4, 1e-4));
    // prefill: two prompts together, one from the start and one after a cached prefix (a
    // sliding layer's ring wraps within the second).
    nn::KVCache p = m.new_cache(), q = m.new_cache();
    m.decode(q, std::vector<int32_t>(ids.begin(), ids.begin() + 3));
    std::vector<nn::KVCache*> pq{&p, &q};
    const std::vector<std::span<const int32_t>> prompts{std::span<const int32_t>(ids.data(), 12),
                                                        std::span<const int32_t>(ids.data() + 3, 27)};
    const Tensor pre = m.prefill(pq, prompts);
    EXPECT_TRUE(close(slice(pre, 0, 0, 1), reshape(slice(full, 1, 11, 12), Shape{1, V}), 1e-4, 1e-4));
    EXPECT_TRUE(close(slice(pre, 0, 1, 2), reshape(slice(full, 1, 29, 30), Shape{1, V}), 1e-4, 1e-4));
    const Tensor on = m.decode_step(pq, std::vector<int32_t>{ids[12], ids[30]});
    EXPECT_TRUE(close(slice(on, 0, 0, 1), reshape(slice(full, 1, 12, 13), Shape{1, V}), 1e-4, 1e-4));
    EXPECT_TRUE(close(slice(on, 0, 1, 2), reshape(slice(full, 1, 30, 31), Shape{1, V}), 1e-4, 1e-4));
    if (std::string(arch) == "gemma3") {
      // Layers 0 and 2 slide: 5 positions each; 1 and 3 hold all 40.
      EXPECT_EQ(cache.slots(0), 5);
      EXPECT_EQ(cache.slots(1), T);
      EXPECT_TRUE(cache.ring(2));
      EXPECT_FALSE(cache.ring(3));
      const double full_bytes = nn::KVCache::bytes(4, 1, T, 2, 16, DType::F32);
      EXPECT_DOUBLE_EQ(cache.bytes(), full_bytes * (2 * 5 + 2 * T) / (4 * T));
      // An F16 cache: a chunk of new tokens sees its own keys as the cache rounds them, as
      // token-by-token decoding does (the rings included).
      nn::KVCache chunked = m.new_cache(1, 0, DType::F16), single = m.new_cache(1, 0, DType::F16);
      const Tensor c1 = m.decode(chunked, std::vector<int32_t>(ids.begin(), ids.begin() + 17));
      Tensor s1;
      for (int64_t i = 0; i < 17; ++i) s1 = m.decode(single, {ids[size_t(i)]});
      EXPECT_TRUE(close(c1, s1, 1e-4, 1e-4)) << "F16 cache: a 17-token chunk vs one token at a time";
    }
  }
}

// The published architectures' parts get the right gradients (central differences of the
// loss): the sliding-window mask, post-norms, GeGLU, the soft cap (gemma3); fused q/k/v and
// gate/up under LongRoPE (phi3); the no-RoPE layer (smollm3); the router and the chosen
// experts (qwen3moe with renormalised weights, olmoe without; every expert gets a gradient,
// since 24 tokens choose each of the 4 at least once).
TEST(Decoder, PublishedArchitectureGradientsMatchFiniteDifferences) {
  for (const char* arch : {"gemma3", "phi3", "smollm3", "qwen3moe", "olmoe", "granitemoe", "lfm2"}) {
    SCOPED_TRACE(arch);
    DecoderLM m = random_published(arch, 12, 7);
    for (Tensor& p : m.params().values()) {
      NoGradGuard ng;
      if (p.name().starts_with("rope_")) continue;
      Tensor& w = p;
      copy_(w, scale(w, 0.5f));  // gentler weights: the loss stays smooth at the step below
    }
    const auto [x, y] = next_token_batch(m.config().vocab);
    backward(m.loss(x, y));
    for (const Tensor& p : m.params().values()) {
      if (p.name().starts_with("rope_")) continue;
      ASSERT_TRUE(p.grad().defined()) << p.name();
      double norm = 0;
      for (float v : p.grad().to_f32_vector()) norm += double(v) * v;
      EXPECT_GT(norm, 0.0) << p.name() << " gets no gradient";
    }
    NoGradGuard ng;
    std::vector<std::string> names;
    if (std::string(arch) == "gemma3")
      names = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_q_norm.weight",
               "blk.0.post_attention_norm.weight", "blk.0.ffn_gate.weight", "blk.0.post_ffw_norm.weight",
               "blk.1.attn_v.weight"};
    else if (std::string(arch) == "phi3")
      names = {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight", "blk.1.ffn_down.weight", "output.weight"};
    else if (std::string(arch) == "smollm3")
      names = {"blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.2.attn_q.weight"};
    else if (std::string(arch) == "lfm2")  // the short conv's three parts, the q/k norms, the final norm
      names = {"blk.0.shortconv.in_proj.weight", "blk.0.shortconv.conv.weight", "blk.2.shortconv.out_proj.weight",
               "blk.2.shortconv.conv.weight", "blk.1.attn_q_norm.weight", "blk.3.attn_k_norm.weight",
               "token_embd_norm.weight"};
    else if (std::string(arch) == "granitemoe")  // the router, the experts, the shared expert
      names = {"blk.0.ffn_gate_inp.weight", "blk.1.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
               "blk.1.ffn_gate_shexp.weight", "blk.0.ffn_down_shexp.weight", "token_embd.weight"};
    else  // the router, the chosen experts, the whole-projection q/k norms
      names = {"blk.0.ffn_gate_inp.weight", "blk.1.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
               "blk.1.ffn_down_exps.weight", "blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"};
    // (A small step for the experts' models: one that flips a token's choice of experts
    // measures the jump, not the slope.)
    const float h = m.config().moe.experts > 0 ? 2e-3f : 1e-2f;
    for (const std::string& name : names)
      expect_central_differences(m, x, y, name, h, m.params().get(name).numel() / 2 + 1);
  }
}

// depth_scale (layer l's pre-norm outputs times 1/sqrt(l + 1)) is folded into the norms when a
// model is saved: a plain llama / qwen35 file with the same logits (checkpoints stay unfolded).
TEST(Decoder, DepthScaleIsFoldedIntoTheNormsAtSave) {
  const auto tok = Tokenizer::train("byte", "");
  for (const char* preset : {"llama", "qwen35"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = (std::string(preset) == "llama" ? random_model("llama", false, 16) : random_hybrid("da", 16)).config();
    c.vocab = tok->vocab_size();
    c.depth_scale = true;
    DecoderLM scaled(c);
    scaled.init(3);
    {
      NoGradGuard ng;
      uint64_t stream = 0;
      for (Tensor& p : scaled.params().values())  // norms away from 1, so a missed fold shows
        if (p.name().find("norm") != std::string::npos) {
          Generator g(9, ++stream);
          copy_(p, add(p, randn(p.shape(), g, 0.0f, 0.3f)));
        }
    }
    const std::string path = ::testing::TempDir() + "/toy_depth_scale_" + preset + ".gguf";
    save_model(path, scaled, *tok, "depth");
    gguf::Reader r(path);
    EXPECT_EQ(r.get_str("general.architecture"), std::string(preset) == "llama" ? "llama" : "qwen35");
    LoadedModel back = load_model(r);
    EXPECT_FALSE(back.model->config().depth_scale);
    const std::vector<int32_t> ids = token_ids(10, c.vocab);
    NoGradGuard ng;
    const Tensor x = from_vector(ids, Shape{1, 10});
    EXPECT_TRUE(close(back.model->logits(x), scaled.logits(x), 1e-5, 1e-5));
  }
}

// A qwen35 file with next-token-prediction (MTP) blocks after its trunk (block_count counts
// them): toy runs the trunk, notes the rest, and computes what the file without them computes;
// widths that disagree are a clear error.
TEST(Qwen35Files, NextTokenPredictionBlocksAreSkippedAndBadWidthsRefused) {
  const std::string base = ::testing::TempDir() + "/toy_q35_mtp_base.gguf";
  ASSERT_EQ(toy::test::run_toy({"init", "--arch", "qwen35", "--shape", "tiny", "--seed", "3", "--out", base}).status, 0);
  auto rewrite = [&](const std::string& out, const std::function<void(gguf::Writer&, const gguf::Reader&)>& more,
                     const std::string& skip_key) {
    gguf::Reader r(base);
    gguf::Writer w;
    for (const auto& [key, value] : r.metadata())
      if (key != skip_key) w.set(key, value);
    for (const gguf::TensorInfo& t : r.tensors()) w.add_tensor(t.name, r.tensor(t.name));
    more(w, r);
    w.write(out);
  };
  const std::string mtp = ::testing::TempDir() + "/toy_q35_mtp.gguf";
  rewrite(mtp, [](gguf::Writer& w, const gguf::Reader&) {
    w.set("qwen35.block_count", gguf::Value::u32(3));
    w.set("qwen35.nextn_predict_layers", gguf::Value::u32(1));
    w.set("qwen35.attention.recurrent_layers", gguf::Value::bool_array({true, false, false}));
    Generator g(1);
    w.add_tensor("blk.2.nextn.eh_proj.weight", randn(Shape{256, 512}, g));
    w.add_tensor("blk.2.attn_norm.weight", randn(Shape{256}, g));
  }, "qwen35.block_count");
  LoadedModel a = load_model(base), b = load_model(mtp);
  EXPECT_EQ(b.model->config().layers, 2);
  NoGradGuard ng;
  const Tensor x = from_vector(std::vector<int32_t>{5, 9, 2, 7}, Shape{1, 4});
  EXPECT_TRUE(close(b.model->logits(x), a.model->logits(x), 0.0, 0.0));
  const std::string bad = ::testing::TempDir() + "/toy_q35_bad_inner.gguf";
  rewrite(bad, [](gguf::Writer& w, const gguf::Reader&) { w.set("qwen35.ssm.inner_size", gguf::Value::u32(100)); },
          "qwen35.ssm.inner_size");
  try {
    load_model(bad);
    FAIL() << "an inner size that is not V heads x state size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ssm.inner_size 100"), std::string::npos) << e.what();
  }
}

namespace {
// The MoE block of layer l as a standalone module, its experts cast to `dt` (grouped path).
nn::Moe moe_of(DecoderLM& m, int64_t l, DType dt) {
  nn::Moe moe;
  auto p = [&](const char* n) { return m.params().get(fmt::format("blk.{}.{}", l, n)); };
  moe.router = nn::Linear{p("ffn_gate_inp.weight"), Tensor()};
  moe.gate = cast(p("ffn_gate_exps.weight").detach(), dt);
  moe.up = cast(p("ffn_up_exps.weight").detach(), dt);
  moe.down = cast(p("ffn_down_exps.weight").detach(), dt);
  moe.used = m.config().moe.used;
  moe.norm_weights = m.config().moe.norm_weights;
  return moe;
}
}  // namespace

// Stored experts run grouped by expert (one linear each, the results scattered back); F32 ones
// through mul_mat_id. Both compute the same function, and the grouped one passes the gradient
// to its input and the router (what QLoRA trains through).
TEST(Moe, GroupedExpertsEqualMulMatIdForwardAndBackward) {
  DecoderLM m = random_published("qwen3moe", 12, 9);
  Tensor x = param(randn(Shape{3, 7, 32}, default_generator(), 0.0f, 1.0f));
  const nn::Moe f32 = moe_of(m, 0, DType::F32);
  nn::Moe grouped = moe_of(m, 0, DType::F32);
  // F16 experts widened back: the same values, but the grouped path (stored dtype) runs.
  {
    NoGradGuard ng;
    grouped.gate = cast(f32.gate, DType::F16), grouped.up = cast(f32.up, DType::F16),
    grouped.down = cast(f32.down, DType::F16);
  }
  nn::Moe wide = f32;
  {
    NoGradGuard ng;
    wide.gate = cast(grouped.gate, DType::F32), wide.up = cast(grouped.up, DType::F32),
    wide.down = cast(grouped.down, DType::F32);
  }
  Tensor g = randn(Shape{3, 7, 32}, default_generator(), 0.0f, 1.0f);
  auto a = grad(sum(mul(wide(x), g)), {x, wide.router.weight});
  auto b = grad(sum(mul(grouped(x), g)), {x, grouped.router.weight});
  // (F16 experts see F16-rounded activations, as llama.cpp's F16 products do: ~5e-4 each, and
  // the router's gradient sums them over every token: 1e-2.)
  EXPECT_TRUE(close(wide(x), grouped(x), 2e-3, 2e-3));
  EXPECT_TRUE(close(a[0], b[0], 2e-3, 2e-3));
  EXPECT_TRUE(close(a[1], b[1], 1e-2, 1e-2));
}

// The load-balancing loss: E * sum_e f_e P_e over every layer's routing at once (checked
// against a plain loop), its gradient reaching the router, and in the model's loss with its
// coefficient while training only.
TEST(Moe, LoadBalancingLossIsSwitchTransformersOverAllLayers) {
  DecoderLM m = random_published("olmoe", 12, 3);
  const int64_t E = 4, k = 2, D = 32;
  const nn::Moe l0 = moe_of(m, 0, DType::F32), l1 = moe_of(m, 1, DType::F32);
  Generator gen(4, 1);
  const Tensor x0 = randn(Shape{2, 5, D}, gen, 0.0f, 1.0f), x1 = randn(Shape{2, 5, D}, gen, 0.0f, 1.0f);
  nn::MoeBalance bal;
  l0(x0, &bal);
  l1(x1, &bal);
  std::vector<double> count(E, 0.0), psum(E, 0.0);
  int64_t rows = 0;
  for (const auto& [moe, x] : {std::pair{&l0, x0}, std::pair{&l1, x1}}) {
    const std::vector<float> z = linear(reshape(x, Shape{10, D}), moe->router.weight).to_f32_vector();
    for (int64_t r = 0; r < 10; ++r, ++rows) {
      std::vector<double> p(E);
      double mx = -1e30, tot = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(z[size_t(r * E + e)]));
      for (int64_t e = 0; e < E; ++e) tot += p[size_t(e)] = std::exp(double(z[size_t(r * E + e)]) - mx);
      std::vector<int64_t> order{0, 1, 2, 3};
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
      for (int64_t j = 0; j < k; ++j) count[size_t(order[size_t(j)])] += 1;
      for (int64_t e = 0; e < E; ++e) psum[size_t(e)] += p[size_t(e)] / tot;
    }
  }
  double want = 0;
  // (Hugging Face's load_balancing_loss_func: the one-hot choices [rows, k, E] averaged over
  // rows, so balanced routing gives k.)
  for (int64_t e = 0; e < E; ++e) want += count[size_t(e)] / double(rows) * psum[size_t(e)] / double(rows);
  want *= double(E);
  const Tensor aux = bal.loss();
  EXPECT_NEAR(aux.item(), want, 1e-5);
  EXPECT_GT(want, 0.5 * double(k));
  auto g = grad(aux, {l0.router.weight, l1.router.weight});
  EXPECT_TRUE(g[0].defined() && g[1].defined());
  // In the model: training adds coef x aux; evaluation does not.
  const auto [x, y] = next_token_batch(m.config().vocab);
  NoGradGuard ng;
  const double plain = m.loss(x, y, true).item();
  m.set_moe_aux_loss(0.5f);
  const double half = m.loss(x, y, true).item();
  m.set_moe_aux_loss(1.0f);
  const double one = m.loss(x, y, true).item();
  EXPECT_DOUBLE_EQ(m.loss(x, y, false).item(), plain);
  EXPECT_NEAR(half - plain, 0.5 * (one - plain), 1e-5);
  EXPECT_GT(one - plain, 0.5 * double(k));
  EXPECT_LE(one - plain, double(E * k));
  // Recomputation would drop the routing graph: refused, not silently constant.
  m.set_recompute(true);
  {
    GradModeGuard on(true);
    EXPECT_THROW(m.loss(x, y, true), Error);
  }
  m.set_recompute(false);
  // A dense model has no routing to balance.
  EXPECT_THROW(random_published("smollm3", 12).set_moe_aux_loss(0.1f), Error);
}

// The real shapes `toy init` writes are the published models': their parameter counts (from
// each model's card / config: tied embeddings counted once) within 1%, counted from the
// declared shapes without allocating anything.
TEST(Decoder, InitShapesHaveThePublishedParameterCounts) {
  const struct {
    const char *arch, *shape;
    double params;
  } published[] = {{"llama", "smollm2-135m", 134.5e6},   {"qwen2", "qwen2.5-0.5b", 494.0e6},
                   {"qwen3", "qwen3-0.6b", 596.0e6},     {"gpt2", "gpt2-124m", 124.4e6},
                   {"smollm3", "smollm3-3b", 3.075e9},   {"phi3", "phi-3.5-mini", 3.821e9},
                   {"gemma3", "gemma3-270m", 268.1e6},   {"gemma3", "gemma3-1b", 999.9e6},
                   {"qwen3moe", "qwen3-30b-a3b", 30.53e9}, {"olmoe", "olmoe-1b-7b", 6.919e9},
                   {"granitemoe", "granite-3.1-1b-a400m", 1.335e9}, {"lfm2", "lfm2-350m", 354.5e6}};
  for (const auto& p : published) {
    SCOPED_TRACE(p.shape);
    double n = 0;
    for (const auto& [name, shape] : DecoderLM::parameter_shapes(shape_config(p.arch, p.shape)))
      n += double(shape.numel());
    std::printf("%-22s %.4g parameters (published %.4g)\n", p.shape, n, p.params);
    EXPECT_NEAR(n / p.params, 1.0, 0.01);
  }
}

// LoRA on the experts themselves (one adapter per expert, llama.cpp's build_lora_mm_id): the
// adapted model computes what the merged one does (W_e + scale B_e A_e per expert), on F32
// experts (mul_mat_id) and stored ones (grouped), and the adapters' gradients match central
// differences.
TEST(Moe, ExpertLoraIsTheMergedModelAndTrains) {
  for (const char* arch : {"qwen3moe", "olmoe"}) {
    SCOPED_TRACE(arch);
    DecoderLM m = random_published(arch, 12, 4);
    LoraOptions o;
    o.rank = 2, o.alpha = 3, o.seed = 6, o.targets = parse_lora_targets("ffn_gate_exps,ffn_up_exps,ffn_down_exps");
    add_lora(m, o);
    EXPECT_EQ(m.params().get("blk.1.ffn_down_exps.weight.lora_a").shape(), (Shape{4, 2, 24}));
    EXPECT_EQ(m.params().get("blk.1.ffn_down_exps.weight.lora_b").shape(), (Shape{4, 32, 2}));
    EXPECT_FALSE(m.params().has("blk.0.attn_q.weight.lora_a")) << "only the named kinds";
    {
      NoGradGuard ng;
      for (Tensor& p : m.params().values())  // B starts at zero: give it values to carry
        if (p.name().ends_with(".lora_b")) copy_(p, randn(p.shape(), default_generator(), 0.0f, 0.3f));
    }
    const auto [x, y] = next_token_batch(m.config().vocab);
    backward(m.loss(x, y));
    for (const char* name : {"blk.0.ffn_gate_exps.weight.lora_a", "blk.1.ffn_up_exps.weight.lora_b",
                             "blk.0.ffn_down_exps.weight.lora_a", "blk.1.ffn_down_exps.weight.lora_b"})
      expect_central_differences(m, x, y, name, 2e-3f, m.params().get(name).numel() / 2 + 1);
    NoGradGuard ng;
    const Tensor ids = from_vector(token_ids(12, m.config().vocab), Shape{1, 12});
    const Tensor adapted = m.logits(ids);
    // Stored (F16) experts take the grouped path: the adapter is applied there too.
    DecoderLM stored(m.config(), [&](const std::string& n, const Shape&) {
      const Tensor& p = m.params().get(n);
      return n.ends_with("_exps.weight") ? cast(p, DType::F16) : p.detach();
    });
    o.targets = parse_lora_targets("ffn_gate_exps,ffn_up_exps,ffn_down_exps");
    add_lora(stored, o);
    for (const auto& [name, lora] : lora_adapters(m)) {
      copy_(stored.params().get(name + ".lora_a"), lora->a);
      copy_(stored.params().get(name + ".lora_b"), lora->b);
    }
    EXPECT_TRUE(close(stored.logits(ids), adapted, 2e-2, 2e-2)) << "grouped (F16 experts) vs mul_mat_id";
    merge_lora(m);
    EXPECT_TRUE(lora_adapters(m).empty());
    EXPECT_FALSE(m.params().has("blk.0.ffn_up_exps.weight.lora_a"));
    EXPECT_TRUE(close(m.logits(ids), adapted, 1e-4, 1e-4)) << "merged vs adapted";
  }
}

// set_mixed_precision(BF16) rounds the output head's product too, in the one-pass loss and in
// the chunked one (past 4M logits): each loss moves when the head joins the projections, and
// the gradient still reaches the F32 table.
TEST(DecoderLM, MixedPrecisionCoversTheOutputHead) {
  ModelConfig c = ModelConfig::from_preset("gpt");
  c.vocab = 512, c.dim = 16, c.layers = 1, c.heads = 2, c.kv_heads = 2, c.ctx = 1024;
  DecoderLM m(c);
  m.init(9);
  for (int64_t rows : {int64_t(64), int64_t(9216)}) {  // 64 x 512 logits: one pass; 9216 x 512: chunks
    SCOPED_TRACE(rows);
    const int64_t B = rows / 64 > 0 ? rows / 64 : 1;
    std::vector<int32_t> ids = token_ids(B * 64, c.vocab), next = token_ids(B * 64 + 1, c.vocab);
    next.erase(next.begin());
    const Tensor x = from_vector(ids, Shape{B, 64}), t = from_vector(next, Shape{B, 64});
    auto loss_with = [&](bool head) {
      m.set_mixed_precision(head ? DType::BF16 : DType::F32);
      for (auto& [name, lin] : m.projections()) lin->compute = DType::BF16;
      NoGradGuard ng;
      return double(m.loss(x, t).item());
    };
    const double projections_only = loss_with(false), with_head = loss_with(true);
    EXPECT_NE(with_head, projections_only) << "the head's product was not rounded";
    EXPECT_NEAR(with_head, projections_only, 1e-2 * std::fabs(projections_only));
  }
  // The gradient of the tied table (rounded for the head only) reaches the F32 master.
  m.set_mixed_precision(DType::BF16);
  const std::vector<int32_t> ids = token_ids(64, c.vocab);
  backward(m.loss(from_vector(ids, Shape{1, 64}), from_vector(ids, Shape{1, 64})));
  const Tensor& table = m.head_weight();
  ASSERT_TRUE(table.requires_grad());
  ASSERT_TRUE(table.grad().defined());
  EXPECT_EQ(table.grad().dtype(), DType::F32);
  m.set_mixed_precision(DType::F32);
}
