// LoRA adapters: attach, train, save in llama.cpp's adapter format, load, merge. Oracles: the
// base model itself (an adapter with B = 0 changes nothing), the runtime adapter against the
// merged weights, central differences for the adapter gradients, and the dequantized weight
// for the gradient through a quantized base.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "helpers.h"
#include "proc.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/lora.h"
#include "toy/ops/ops.h"

using namespace toy;
using namespace toy::test;

namespace {

DecoderLM tiny(const std::string& preset, uint64_t seed = 3) {
  ModelConfig c = ModelConfig::from_preset(preset);
  c.vocab = 40, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = preset == "llama" ? 2 : 4, c.ctx = 16,
  c.ffn = 64;
  DecoderLM m(c);
  m.init(seed);
  return m;
}

// The same model with its matrices stored as `dt` (frozen views, as a loaded file's).
DecoderLM stored_as(DecoderLM& m, DType dt) {
  NoGradGuard ng;
  return DecoderLM(m.config(), [&](const std::string& name, const Shape&) -> Tensor {
    Tensor t = m.params().get(name).detach();
    return t.ndim() == 2 && name != "token_embd.weight" ? cast(t, dt) : cast(t, DType::F32);
  });
}

Tensor ids_tensor() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(int32_t((i * 11 + 5) % 40));
  return from_vector(ids, Shape{1, 12});
}

Tensor logits_of(DecoderLM& m) {
  NoGradGuard ng;
  return m.logits(ids_tensor());
}

// Fills every adapter's B (and A) with random values, as training would.
void randomize_adapters(DecoderLM& m, uint64_t seed) {
  NoGradGuard ng;
  uint64_t s = 0;
  for (Param& p : m.params().all()) {
    if (p.name.find(".lora_") == std::string::npos) continue;
    Generator g(seed, ++s);
    fill_normal_(p.value, g, 0.0f, 0.2f);
  }
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_f32_vector()) m = std::max(m, double(std::fabs(v)));
  return m;
}

std::string tmp(const std::string& name) { return ::testing::TempDir() + "toy_lora_" + name; }

}  // namespace

TEST(Lora, TargetsByAliasOrGgufName) {
  EXPECT_EQ(parse_lora_targets("q,k,v,o,gate,up,down"),
            (std::vector<std::string>{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}));
  EXPECT_EQ(parse_lora_targets("attn_q, q ,ffn_down"), (std::vector<std::string>{"attn_q", "ffn_down"}));
  EXPECT_THROW(parse_lora_targets("q,wq"), Error);
  EXPECT_THROW(parse_lora_targets("q,,k"), Error);
  DecoderLM gpt = tiny("gpt");
  EXPECT_EQ(default_lora_targets(gpt), (std::vector<std::string>{"attn_qkv", "attn_output", "ffn_up", "ffn_down"}));
  LoraOptions o;
  o.targets = {"attn_q"};  // GPT-2's layout has one fused attn_qkv
  EXPECT_THROW(add_lora(gpt, o), Error);
  DecoderLM llama = tiny("llama");
  EXPECT_EQ(default_lora_targets(llama).size(), 7u);
  o.rank = 0;
  o.targets = {};
  EXPECT_THROW(add_lora(llama, o), Error);
}

// A hybrid's defaults leave out ssm_alpha/ssm_beta (one output per head: the default rank 8
// did not fit a tiny model's 4 heads, so default LoRA on qwen35 failed); a user may still
// name them, at a rank that fits.
TEST(Lora, DefaultTargetsOfAHybridLeaveOutThePerHeadProjections) {
  const std::string path = tmp("qwen35_tiny.gguf");
  ASSERT_EQ(toy::test::run_toy({"init", "--arch", "qwen35", "--shape", "tiny", "--out", path}).status, 0);
  LoadedModel lm = load_model(path);
  const std::vector<std::string> defaults = default_lora_targets(*lm.model), all = lora_target_kinds(*lm.model);
  for (const char* kind : {"attn_qkv", "attn_gate", "ssm_out"})
    EXPECT_NE(std::find(defaults.begin(), defaults.end(), kind), defaults.end()) << kind;
  for (const char* kind : {"ssm_alpha", "ssm_beta"}) {
    EXPECT_EQ(std::find(defaults.begin(), defaults.end(), kind), defaults.end()) << kind;
    EXPECT_NE(std::find(all.begin(), all.end(), kind), all.end()) << kind;
  }
  LoraOptions o;  // rank 8, every default target
  EXPECT_NO_THROW(add_lora(*lm.model, o));
  EXPECT_FALSE(lm.model->params().has("blk.0.ssm_alpha.weight.lora_a"));
  EXPECT_TRUE(lm.model->params().has("blk.0.attn_gate.weight.lora_a"));
  LoadedModel again = load_model(path);
  o.rank = 2, o.targets = {"ssm_alpha", "ssm_beta"};
  EXPECT_NO_THROW(add_lora(*again.model, o));
  EXPECT_TRUE(again.model->params().has("blk.0.ssm_beta.weight.lora_a"));
}

// Step 0 of LoRA is the base model exactly (B = 0), on an F32 base and on quantized bases;
// only the adapters train, and they decay as matrices.
TEST(Lora, AtStepZeroTheModelIsTheBaseExactly) {
  DecoderLM f32 = tiny("llama");
  for (DType dt : {DType::F32, DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(std::string(name(dt)));
    DecoderLM m = stored_as(f32, dt);
    const std::vector<float> base = logits_of(m).to_f32_vector();
    const int64_t before = m.params().trainable_numel();
    LoraOptions o;
    o.rank = 4, o.alpha = 8, o.seed = 9;
    add_lora(m, o);
    EXPECT_EQ(logits_of(m).to_f32_vector(), base);
    EXPECT_EQ(before, 0);
    // 2 layers x (q, k, v, o, gate, up, down): A [4, in] + B [out, 4]
    const int64_t D = 32, kv = 16, F = 64;
    const int64_t per_layer = 4 * ((D + D) + (D + kv) * 2 + (D + D) + (D + F) * 2 + (F + D));
    EXPECT_EQ(m.params().trainable_numel(), 2 * per_layer);
    EXPECT_TRUE(m.params().record("blk.1.ffn_down.weight.lora_a").trainable);
    EXPECT_FALSE(m.params().record("blk.1.ffn_down.weight").trainable);
  }
}

// The merged F32 weights compute what the base plus the runtime adapter computes.
TEST(Lora, MergedWeightsEqualTheRuntimeAdapter) {
  for (const char* preset : {"llama", "gpt"}) {
    SCOPED_TRACE(preset);
    DecoderLM m = tiny(preset);
    LoraOptions o;
    o.rank = 3, o.alpha = 5;
    add_lora(m, o);
    randomize_adapters(m, 4);
    const Tensor runtime = logits_of(m);
    const std::vector<float> base_w = m.params().get("blk.0.ffn_up.weight").to_f32_vector();
    merge_lora(m);
    EXPECT_FALSE(m.params().has("blk.0.ffn_up.weight.lora_a"));
    EXPECT_TRUE(lora_adapters(m).empty());
    EXPECT_NE(m.params().get("blk.0.ffn_up.weight").to_f32_vector(), base_w);
    EXPECT_TRUE(close(logits_of(m), runtime, 1e-5 * max_abs(runtime), 0));
  }
}

// An adapter file round trip: saved from a trained model, loaded onto the base, it gives the
// trained model's logits; its layout is llama.cpp's.
TEST(Lora, AdapterFilesRoundTrip) {
  DecoderLM m = tiny("llama");
  LoraOptions o;
  o.rank = 4, o.alpha = 16, o.targets = {"attn_q", "attn_v", "ffn_down"};
  add_lora(m, o);
  randomize_adapters(m, 7);
  const Tensor trained = logits_of(m);
  const std::string path = tmp("rt.gguf");
  save_lora_adapter(path, m, "llama", 16);
  {
    gguf::Reader r(path);
    EXPECT_EQ(r.get_str("general.type"), "adapter");
    EXPECT_EQ(r.get_str("adapter.type"), "lora");
    EXPECT_EQ(r.get_str("general.architecture"), "llama");
    EXPECT_EQ(r.get_f32("adapter.lora.alpha"), 16.0f);
    EXPECT_EQ(r.tensors().size(), 2u * 2 * 3);
    EXPECT_EQ(r.find_tensor("blk.1.attn_v.weight.lora_a")->shape, (Shape{4, 32}));
    EXPECT_EQ(r.find_tensor("blk.1.attn_v.weight.lora_b")->shape, (Shape{16, 4}));
  }
  DecoderLM base = tiny("llama");
  const Tensor base_logits = logits_of(base);
  load_lora_adapter(base, "llama", path);
  EXPECT_TRUE(close(logits_of(base), trained, 1e-6 * max_abs(trained), 0));
  // --lora-scale S multiplies the adapter's effect: 0 is the base.
  DecoderLM off = tiny("llama");
  load_lora_adapter(off, "llama", path, 0.0f);
  EXPECT_EQ(logits_of(off).to_f32_vector(), base_logits.to_f32_vector());
  // A quantized base takes the same adapter.
  DecoderLM f32 = tiny("llama");
  DecoderLM q = stored_as(f32, DType::Q8_0);
  EXPECT_NO_THROW(load_lora_adapter(q, "llama", path));
  std::remove(path.c_str());
}

TEST(Lora, BadAdapterFilesAreClearErrors) {
  DecoderLM m = tiny("llama");
  auto write = [&](const std::string& file, auto edit) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    w.set("general.type", gguf::Value::str("adapter"));
    w.set("adapter.type", gguf::Value::str("lora"));
    w.set("adapter.lora.alpha", gguf::Value::f32(8));
    edit(w);
    w.write(tmp(file));
    return tmp(file);
  };
  auto expect_error = [&](const std::string& path, const std::string& says) {
    DecoderLM fresh = tiny("llama");
    try {
      load_lora_adapter(fresh, "llama", path);
      ADD_FAILURE() << path << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    std::remove(path.c_str());
  };
  const Tensor a = zeros(Shape{2, 32}), b = zeros(Shape{32, 2});
  expect_error(write("no_b.gguf", [&](gguf::Writer& w) { w.add_tensor("blk.0.attn_q.weight.lora_a", a); }),
               "no lora_b");
  expect_error(write("shape.gguf",
                     [&](gguf::Writer& w) {
                       w.add_tensor("blk.0.attn_k.weight.lora_a", a);
                       w.add_tensor("blk.0.attn_k.weight.lora_b", b);  // attn_k is [16, 32]
                     }),
               "blk.0.attn_k.weight");
  expect_error(write("suffix.gguf", [&](gguf::Writer& w) { w.add_tensor("blk.0.attn_q.weight", a); }),
               "neither a .lora_a nor a .lora_b");
  expect_error(write("unknown.gguf",
                     [&](gguf::Writer& w) {
                       w.add_tensor("blk.9.attn_q.weight.lora_a", a);
                       w.add_tensor("blk.9.attn_q.weight.lora_b", b);
                     }),
               "not a projection");
  expect_error(write("arch.gguf", [&](gguf::Writer& w) { w.set("general.architecture", gguf::Value::str("qwen2")); }),
               "architecture 'qwen2'");
  expect_error(write("type.gguf", [&](gguf::Writer& w) { w.set("general.type", gguf::Value::str("model")); }),
               "general.type");
  expect_error(write("empty.gguf", [](gguf::Writer&) {}), "no adapter tensors");
}

// The adapter's gradients (A and B, through a frozen F32 or quantized base) against central
// differences; the LoRA input x's gradient through a quantized base is the straight-through
// product with the dequantized weight (the forward rounds x to 8 bits for the base product,
// as llama.cpp does, which finite differences cannot see through).
TEST(Lora, GradientsOfTheAdapterAndThroughAQuantizedBase) {
  for (DType dt : {DType::F32, DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(std::string(name(dt)));
    Tensor w = cast(randn_t(Shape{8, 256}, 21, 0.1f), dt);
    Tensor x = randn_t(Shape{3, 256}, 22);
    auto f = [&](const std::vector<Tensor>& in) {
      nn::Linear lin{w, Tensor()};
      lin.lora = nn::Lora{in[0], in[1], 0.75f, 0};
      return lin(x);
    };
    Tensor a = param(randn_t(Shape{2, 256}, 23, 0.1f)), b = param(randn_t(Shape{8, 2}, 24, 0.5f));
    EXPECT_TRUE(grad_ok(f, {a, b}));
    // x's gradient: the same as with the widened weight (plus the adapter's path).
    Tensor xq = param(randn_t(Shape{3, 256}, 25)), xw = param(randn_t(Shape{3, 256}, 25));
    nn::Linear lq{w, Tensor()}, lw{cast(w, DType::F32), Tensor()};
    lq.lora = lw.lora = nn::Lora{a, b, 0.75f, 0};
    Tensor g = randn_t(Shape{3, 8}, 26);
    backward(sum(mul(lq(xq), g)));
    backward(sum(mul(lw(xw), g)));
    EXPECT_TRUE(close(xq.grad(), xw.grad(), 1e-5, 1e-5));
  }
}

// LoRA dropout acts only in a training forward and draws from the model's generator.
TEST(Lora, DropoutOnlyWhileTraining) {
  DecoderLM m = tiny("llama");
  LoraOptions o;
  o.rank = 2, o.dropout = 0.5f;
  add_lora(m, o);
  randomize_adapters(m, 5);
  const std::vector<float> eval1 = logits_of(m).to_f32_vector(), eval2 = logits_of(m).to_f32_vector();
  EXPECT_EQ(eval1, eval2);
  NoGradGuard ng;
  Generator g1(1, 1), g2(1, 1);
  const std::vector<float> t1 = m.logits(ids_tensor(), true, &g1).to_f32_vector();
  const std::vector<float> t2 = m.logits(ids_tensor(), true, &g2).to_f32_vector();
  EXPECT_EQ(t1, t2);   // same generator position, same masks
  EXPECT_NE(t1, eval1);
}

// An adapter written by llama.cpp's own Python writer (gguf-py; the fuzz target's seed, made
// by fuzz/seeds/lora_adapter/README) loads: two pairs, rank 2 and rank 1, scale alpha / rank.
TEST(Lora, LoadsAnAdapterWrittenByGgufPy) {
  ModelConfig c = ModelConfig::from_preset("llama");
  c.vocab = 16, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ctx = 8, c.ffn = 64;
  DecoderLM m(c);
  load_lora_adapter(m, "llama", std::string(TOY_FIXTURE_DIR) + "/../../fuzz/seeds/lora_adapter/two_pairs.gguf");
  const auto adapters = lora_adapters(m);
  ASSERT_EQ(adapters.size(), 2u);
  EXPECT_EQ(adapters[0].first, "blk.0.attn_q.weight");
  EXPECT_EQ(adapters[0].second->rank(), 2);
  EXPECT_FLOAT_EQ(adapters[0].second->scale, 4.0f / 2);
  EXPECT_EQ(adapters[1].first, "blk.1.ffn_down.weight");
  EXPECT_FLOAT_EQ(adapters[1].second->scale, 4.0f / 1);
}
