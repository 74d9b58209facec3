// `toy finetune` end to end, on a synthetic task (the answer is the prompt reversed): full,
// packed, and LoRA on a quantized base, judged by exact match on held-out prompts. Labelled
// slow (a few seconds here; not repeated in the sanitizer build).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "finetune_helpers.h"
#include "proc.h"
#include "toy/autograd/grad_mode.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/lora.h"
#include "toy/train/finetune.h"
#include "toy/train/trainer.h"

using namespace toy;
namespace fs = std::filesystem;

namespace {
// (Private to this process: ctest runs tests of one binary side by side, and a shared name
// let two of them write the same file.)
std::string temp(const std::string& name) { return toy::test::process_temp("toy_ft_", name); }
}  // namespace

// The proof of the issue: a small model toy trained gets ≤ 5% of held-out reversals right;
// fine-tuned in full, and with LoRA on a Q8_0 copy of it, ≥ 90%.
TEST(Finetune, LearnsToReverseThePromptFullAndWithLoraOnAQuantizedBase) {
  std::mt19937 rng(5);
  auto word = [&] {
    std::string s;
    const int n = 3 + int(rng() % 4);
    for (int i = 0; i < n; ++i) s += char('a' + rng() % 8);
    return s;
  };
  const std::string base_text = temp("rev_base.txt"), data = temp("rev.jsonl");
  {
    std::ofstream t(base_text), d(data);
    for (int i = 0; i < 3000; ++i) t << word() << "= .\n";
    for (int i = 0; i < 2000; ++i) {
      const std::string w = word();
      d << nlohmann::json({{"prompt", w + "="}, {"completion", std::string(w.rbegin(), w.rend()) + "."}}).dump() << "\n";
    }
  }
  TrainOptions t;
  t.data = {base_text};
  t.out = temp("rev_base");
  t.tokenizer = "char";
  t.model = ModelConfig::from_preset("llama");
  t.model.layers = 2, t.model.dim = 64, t.model.heads = 4, t.model.kv_heads = 4, t.model.ctx = 32;
  t.steps = 200, t.batch = 16, t.quiet = true, t.force = true, t.eval_every = 0, t.sample_tokens = 0;
  train(t);
  const std::string base = t.out + "/model.gguf", base_q8 = temp("rev_base_q8.gguf");
  ASSERT_EQ(toy::test::run_toy({"quantize", base, base_q8, "q8_0"}).status, 0);

  std::vector<std::pair<std::string, std::string>> held_out;
  for (int i = 0; i < 60; ++i) {
    const std::string w = word();
    held_out.emplace_back(w + "=", std::string(w.rbegin(), w.rend()) + ".");
  }
  auto exact_match = [&](const std::string& model, const std::string& adapter) {
    LoadedModel lm = load_model(model);
    if (!adapter.empty()) load_lora_adapter(*lm.model, lm.arch, adapter);
    NoGradGuard ng;
    int ok = 0;
    for (const auto& [prompt, want] : held_out) {
      nn::KVCache cache = lm.model->new_cache(1, 32);
      std::vector<int32_t> ids = lm.tokenizer->encode(prompt);
      std::string got;
      for (int i = 0; i < 8 && (got.empty() || got.back() != '.'); ++i) {
        const std::vector<float> l = lm.model->decode(cache, ids).to_f32_vector();
        const int32_t next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
        got += lm.tokenizer->decode(std::vector<int32_t>{next});
        ids = {next};
      }
      ok += got == want;
    }
    const double rate = double(ok) / double(held_out.size());
    std::printf("%s%s%s: exact match %.2f\n", model.c_str(), adapter.empty() ? "" : " + ", adapter.c_str(), rate);
    return rate;
  };
  EXPECT_LE(exact_match(base, ""), 0.05);

  FinetuneOptions o;
  o.data = data, o.batch = 16, o.ctx = 24, o.warmup = 30, o.quiet = true, o.force = true;
  o.model = base, o.method = "full", o.steps = 1500, o.lr = 3e-3f, o.out = temp("rev_full");
  const FinetuneResult full = finetune(o);
  EXPECT_EQ(full.steps, 1500);
  EXPECT_LT(full.val_loss, 1.2);  // (the head stays frozen: it caps confidence)
  EXPECT_GE(exact_match(o.out + "/model.gguf", ""), 0.9);

  o.pack = true, o.steps = 600, o.out = temp("rev_full_packed");  // rows of 24 tokens hold ~3 examples each
  finetune(o);
  EXPECT_GE(exact_match(o.out + "/model.gguf", ""), 0.9);

  // Mixed precision: a 200-step SFT job in F32, BF16 and F16 ends within 1% in loss. (Not the
  // reversal: how far its loss has fallen after 200 steps hangs on when the reversal "clicks",
  // which any rounding moves — lr 3e-3 vs 3.001e-3 in F32 alone moves it 1.2%. This job — the
  // first and last letter of the prompt — learns smoothly, so the comparison measures the
  // precision, not the chaos: here F32 and BF16 agree to 0.05%.)
  const std::string ends = temp("ends.jsonl");
  {
    std::ofstream d(ends);
    for (int i = 0; i < 2000; ++i) {
      const std::string w = word();
      d << nlohmann::json({{"prompt", w + "="}, {"completion", std::string{w.front(), w.back()} + "."}}).dump() << "\n";
    }
  }
  o.data = ends, o.pack = false, o.steps = 200, o.eval_every = 0;
  double loss_of[3];
  const char* precisions[3] = {"f32", "bf16", "f16"};
  for (int k = 0; k < 3; ++k) {
    o.precision = precisions[k], o.out = temp(std::string("rev_") + precisions[k]);
    const FinetuneResult r = finetune(o);
    loss_of[k] = r.train_loss;
    std::printf("precision %s: train loss %.4f, %lld steps skipped\n", precisions[k], r.train_loss,
                (long long)r.skipped_steps);
  }
  EXPECT_LE(std::fabs(loss_of[1] - loss_of[0]), 0.01 * loss_of[0]);
  EXPECT_LE(std::fabs(loss_of[2] - loss_of[0]), 0.01 * loss_of[0]);
  o.precision = "f32", o.data = data;

  // (1500 steps: at 1000 the adapter reached 0.6 in the AVX2 forms — the reversal had not yet
  // "clicked" under their rounding — and 1.0 in the AVX-512 ones; at 1500 both reach 1.0, and
  // still do with lr 2.003e-3 instead: a margin, not a knife edge.)
  o.model = base_q8, o.method = "lora", o.lora_rank = 16, o.lora_alpha = 32, o.steps = 1500, o.lr = 2e-3f;
  o.out = temp("rev_lora_q8");
  const FinetuneResult lora = finetune(o);
  EXPECT_LT(lora.trainable_params, 50000);
  EXPECT_GE(exact_match(base_q8, o.out + "/adapter.gguf"), 0.9);  // the adapter on the quantized base
  EXPECT_GE(exact_match(o.out + "/model.gguf", ""), 0.9);         // the merged model (F16)
  EXPECT_EQ(gguf::Reader(o.out + "/model.gguf").find_tensor("blk.0.attn_q.weight")->dtype, DType::F16);

  // Projection lens: the token table of a narrower model (width 32, same characters) frozen
  // under a trainable projection — a fresh model of width 64 learns the task through it, and so
  // does the base with LoRA (its head kept: the vocabularies are the same).
  TrainOptions d = t;
  d.model.dim = 32, d.model.heads = 2, d.model.kv_heads = 2, d.model.layers = 1, d.steps = 100;
  d.out = temp("rev_donor");
  train(d);
  FinetuneOptions l;
  l.donor_embeddings = d.out + "/model.gguf", l.data = data, l.method = "full", l.shape = t.model;
  l.shape.tied = false, l.ctx = 24, l.batch = 16, l.warmup = 30, l.steps = 500, l.lr = 3e-3f;
  l.quiet = true, l.force = true, l.out = temp("rev_lens_fresh");
  finetune(l);
  EXPECT_GE(exact_match(l.out + "/model.gguf", ""), 0.9);
  l.model = base, l.method = "lora", l.lora_rank = 16, l.lora_alpha = 32, l.out = temp("rev_lens_lora");
  finetune(l);
  EXPECT_GE(exact_match(l.out + "/model.gguf", ""), 0.9);
  const LoadedModel folded = load_model(l.out + "/model.gguf");
  EXPECT_EQ(folded.model->params().get("token_embd.weight").shape(), (Shape{folded.model->config().vocab, 64}));
  EXPECT_FALSE(folded.model->config().tied);
}
