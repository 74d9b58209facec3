// `toy finetune`'s data: SFT records and their loss masks, the errors a bad record gets,
// truncation, and packed rows against the unpacked batch. (The whole loop: test_finetune_e2e.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "finetune_helpers.h"
#include "helpers.h"
#include "proc.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/data/sft.h"
#include "toy/infer/chat.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/lora.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune.h"
#include "toy/train/optimizer.h"
#include "toy/train/trainer.h"

using namespace toy;
using toy::test::error_of;
namespace fs = std::filesystem;

namespace {

// (Private to this process: ctest runs tests of one binary side by side, and a shared name
// let two of them write the same file.)
std::string temp(const std::string& name) { return toy::test::process_temp("toy_ft_", name); }

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A tiny qwen2 file from `toy init`: byte-level BPE with <|im_start|>/<|im_end|>, ChatML.
const std::string& chatml_model() {
  static const std::string path = [] {
    // (one file per test process: ctest runs the tests of this file in parallel processes)
    const std::string p = temp("chatml_" + std::to_string(getpid()) + ".gguf");
    const auto r = toy::test::run_toy({"init", "--arch", "qwen2", "--shape", "tiny", "--out", p});
    EXPECT_EQ(r.status, 0) << r.err;
    return p;
  }();
  return path;
}

// The tokens the mask counts, as text.
std::string trained_text(const SftExample& e, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < e.tokens.size(); ++i)
    if (e.trained[i]) ids.push_back(e.tokens[i]);
  return tok.decode(ids);
}

}  // namespace

TEST(Sft, PromptCompletionCountsTheCompletionAndEos) {
  gguf::Reader r(chatml_model());
  LoadedModel lm = load_model(r);
  const Tokenizer& tok = *lm.tokenizer;
  SftExample e = parse_sft_record(R"({"prompt": "the terms", "completion": " and conditions"})", tok, nullptr, "x");
  EXPECT_EQ(tok.decode(e.tokens), "the terms and conditions<|im_end|>");  // EOS is <|im_end|> in toy init files
  EXPECT_EQ(trained_text(e, tok), " and conditions<|im_end|>");
  ASSERT_EQ(e.tokens.back(), tok.eos_id());
}

TEST(Sft, MessagesCountEachAssistantTurnThroughItsEndMarker) {
  gguf::Reader r(chatml_model());
  LoadedModel lm = load_model(r);
  const ChatTemplate chat = ChatTemplate::from_model(r, *lm.tokenizer);
  const std::string rec = R"({"messages": [{"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye."}]})";
  std::string line = rec;
  std::replace(line.begin(), line.end(), '\n', ' ');
  SftExample e = parse_sft_record(line, *lm.tokenizer, &chat, "x");
  EXPECT_EQ(lm.tokenizer->decode(e.tokens),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nGoodbye.<|im_end|>\n");
  EXPECT_EQ(trained_text(e, *lm.tokenizer), "Hello.<|im_end|>\nGoodbye.<|im_end|>\n");
}

TEST(Sft, BadRecordsNameTheirLine) {
  gguf::Reader r(chatml_model());
  LoadedModel lm = load_model(r);
  const ChatTemplate chat = ChatTemplate::from_model(r, *lm.tokenizer);
  const std::string good = R"({"prompt": "a", "completion": "b"})";
  auto error_for = [&](const std::string& bad) {
    const std::string path = temp("bad.jsonl");
    write_file(path, good + "\n\n" + bad + "\n" + good + "\n");
    return error_of([&] { read_sft_data(path, *lm.tokenizer, &chat, 64); });
  };
  for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "a", "completion": "b")", "not valid JSON"},
           {R"({"prompt": "a", "completion": ""})", "an empty completion"},
           {R"({"prompt": "a"})", "no \"completion\""},
           {R"({"prompt": 3, "completion": "b"})", "must be a string"},
           {R"([1, 2])", "must be a JSON object"},
           {R"({})", "needs \"prompt\" and \"completion\", or \"messages\""},
           {R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]})", "no \"content\" string"},
           {R"({"messages": [{"role": 7, "content": "x"}]})", "a string \"role\""},
           {R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant message"},
           {R"({"messages": []})", "non-empty array"}}) {
    const std::string e = error_for(bad);
    EXPECT_NE(e.find("line 3"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find(says), std::string::npos) << bad << ": " << e;
  }
  // A template that refuses the conversation: its message, with the line.
  const ChatTemplate refuses = ChatTemplate::from_text(
      "{% for m in messages %}{% if m.role == 'robot' %}{{ raise_exception('no robots here') }}{% endif %}"
      "{{ m.content }}{% endfor %}", "refuses", *lm.tokenizer);
  const std::string path = temp("robot.jsonl");
  write_file(path, R"({"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]})"
                   "\n");
  const std::string e = error_of([&] { read_sft_data(path, *lm.tokenizer, &refuses, 64); });
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_NE(e.find("no robots here"), std::string::npos) << e;
  // A template toy does not render: messages records say so; prompt/completion ones work.
  EXPECT_NE(error_of([&] { parse_sft_record(R"({"messages": [{"role": "assistant", "content": "x"}]})",
                                            *lm.tokenizer, nullptr, "y"); })
                .find("chat template"),
            std::string::npos);
}

TEST(Sft, LongRecordsAreTruncatedAndCounted) {
  gguf::Reader r(chatml_model());
  LoadedModel lm = load_model(r);
  const std::string path = temp("long.jsonl");
  std::string long_prompt(400, 'x');
  write_file(path, nlohmann::json({{"prompt", "short"}, {"completion", " answer"}}).dump() + "\n" +
                       nlohmann::json({{"prompt", "abc"}, {"completion", long_prompt}}).dump() + "\n" +
                       nlohmann::json({{"prompt", long_prompt}, {"completion", "z"}}).dump() + "\n");
  SftData d = read_sft_data(path, *lm.tokenizer, nullptr, 16);
  EXPECT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.truncated, 2);
  EXPECT_EQ(d.dropped, 1);  // the completion fell past the cut: nothing left to learn
  for (const SftExample& e : d.examples) EXPECT_LE(e.tokens.size(), 17u);
}

// A packed row (block-causal, positions restarting per example) computes what the same
// examples compute padded in separate rows: the same loss and the same gradient of every
// parameter — with RoPE (llama) and with learned positions (gpt).
TEST(Sft, PackedRowsEqualTheUnpackedBatch) {
  for (const char* preset : {"llama", "gpt"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = ModelConfig::from_preset(preset);
    c.vocab = 30, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ctx = 24, c.ffn = 64;
    if (std::string(preset) == "gpt") c.kv_heads = 4;
    DecoderLM m(c);
    m.init(4);
    std::vector<SftExample> ex(3);
    const int lens[3] = {7, 5, 9};
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < lens[i]; ++j) {
        ex[size_t(i)].tokens.push_back(int32_t((i * 7 + j * 3 + 1) % 30));
        ex[size_t(i)].trained.push_back(uint8_t(j >= 2));
      }
    auto grads_of = [&](const Tensor& loss) {
      backward(loss);
      std::vector<std::vector<float>> g;
      for (Param& p : m.params().all())
        g.push_back(p.value.grad().defined() ? p.value.grad().to_f32_vector() : std::vector<float>());
      m.params().zero_grad();
      return g;
    };
    Tensor ids, targets;
    make_sft_batch({&ex[0], &ex[1], &ex[2]}, 30, ids, targets);
    Tensor padded = m.loss(ids, targets);
    const double padded_loss = padded.item();
    const auto padded_grads = grads_of(padded);
    Packing pk;
    Tensor pids, ptargets;
    // Two rows of 20: the first holds examples 0 and 1 (6 + 4 inputs), the second example 2.
    make_packed_sft_batch({{&ex[0], &ex[1]}, {&ex[2]}}, 20, 30, pids, ptargets, pk.positions, pk.segments);
    EXPECT_EQ(pk.positions.to_f32_vector()[6], 0.0f);  // example 1 starts again at position 0
    Tensor packed = m.loss(pids, ptargets, false, nullptr, &pk);
    EXPECT_NEAR(packed.item(), padded_loss, 1e-5 * std::fabs(padded_loss));
    const auto packed_grads = grads_of(packed);
    ASSERT_EQ(packed_grads.size(), padded_grads.size());
    for (size_t i = 0; i < packed_grads.size(); ++i) {
      ASSERT_EQ(packed_grads[i].size(), padded_grads[i].size());
      double scale = 0, worst = 0;
      for (size_t k = 0; k < packed_grads[i].size(); ++k) {
        scale = std::max(scale, double(std::fabs(padded_grads[i][k])));
        worst = std::max(worst, double(std::fabs(packed_grads[i][k] - padded_grads[i][k])));
      }
      EXPECT_LE(worst, 1e-5 * scale + 1e-7) << m.params().all()[i].name;
    }
  }
}

// --recompute: each block recomputed during backward gives the same loss and gradients —
// with dropout and LoRA dropout drawing the same masks — and leaves the dropout generator
// where the plain run leaves it. The re-run does not use the caller's generator object: a
// training step's generator is a local of its loss function, gone by the time backward runs
// (here: overwritten before backward; the re-run once drew from whatever was there).
TEST(Recompute, SameLossGradientsAndDropoutMasks) {
  ModelConfig c = ModelConfig::from_preset("llama");
  c.vocab = 30, c.dim = 32, c.layers = 3, c.heads = 4, c.kv_heads = 2, c.ctx = 16, c.ffn = 64, c.dropout = 0.2f;
  auto run = [&](bool recompute, uint64_t& gen_after) {
    DecoderLM m(c);
    m.init(4);
    LoraOptions lo;
    lo.rank = 2, lo.dropout = 0.3f, lo.targets = {"attn_q", "ffn_down"};
    add_lora(m, lo);
    m.params().set_trainable("blk.1.attn_output.weight", true);  // a base weight trains too
    m.set_recompute(recompute);
    std::vector<int32_t> ids, tg;
    for (int i = 0; i < 2 * 12; ++i) ids.push_back((i * 7 + 3) % 30), tg.push_back((i * 5 + 1) % 30);
    Generator gen(9, 2);
    Tensor loss = m.loss(from_vector(ids, Shape{2, 12}), from_vector(tg, Shape{2, 12}), true, &gen);
    gen_after = gen.offset();
    gen = Generator(1234, 99);
    backward(loss);
    EXPECT_EQ(gen.seed(), 1234u) << "backward wrote into the caller's generator";
    EXPECT_EQ(gen.offset(), 0u) << "backward drew from the caller's generator";
    std::vector<std::vector<float>> out = {{float(loss.item())}};
    for (Param& p : m.params().all())
      if (p.value.grad().defined()) out.push_back(p.value.grad().to_f32_vector());
    return out;
  };
  uint64_t g_plain = 0, g_re = 0;
  const auto plain = run(false, g_plain), re = run(true, g_re);
  EXPECT_EQ(g_plain, g_re);
  ASSERT_EQ(plain.size(), re.size());
  ASSERT_GT(plain.size(), 5u);
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i].size(), re[i].size());
    for (size_t k = 0; k < plain[i].size(); ++k) ASSERT_NEAR(plain[i][k], re[i][k], 1e-6 + 1e-5 * std::fabs(plain[i][k])) << i << "," << k;
  }
}

// Mixed precision: a projection computing in BF16/F16 multiplies the rounded weight by the
// rounded activations, the backward's two products take the rounded output gradient (as
// PyTorch's autocast rounds), and the gradient reaches the F32 master in F32.
TEST(MixedPrecision, GradientReachesTheF32Master) {
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(name(dt)));
    Tensor w = randn(Shape{6, 64}, *std::make_unique<Generator>(3, 1), 0.0f, 0.3f);
    w.requires_grad_();
    Tensor x = randn(Shape{5, 64}, *std::make_unique<Generator>(3, 2));
    x.requires_grad_();
    nn::Linear lin{w, Tensor()};
    lin.compute = dt;
    Tensor y = lin(x);
    Tensor g = randn(Shape{5, 6}, *std::make_unique<Generator>(3, 3));
    backward(sum(mul(y, g)));
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().dtype(), DType::F32);
    NoGradGuard ng;
    auto round = [&](const Tensor& t) { return cast(cast(t, dt), DType::F32); };
    const std::vector<float> want_y = matmul(round(x), round(w), false, true).to_f32_vector();
    const std::vector<float> got_y = y.to_f32_vector();
    for (size_t i = 0; i < want_y.size(); ++i) EXPECT_NEAR(got_y[i], want_y[i], 1e-4) << i;
    const std::vector<float> want_g = matmul(round(g), round(x), true, false).to_f32_vector();
    const std::vector<float> got_g = w.grad().to_f32_vector();
    for (size_t i = 0; i < want_g.size(); ++i) EXPECT_NEAR(got_g[i], want_g[i], 1e-4) << i;
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().dtype(), DType::F32);
    const std::vector<float> want_dx = matmul(round(g), round(w)).to_f32_vector();
    const std::vector<float> got_dx = x.grad().to_f32_vector();
    for (size_t i = 0; i < want_dx.size(); ++i) EXPECT_NEAR(got_dx[i], want_dx[i], 1e-4) << i;
  }
}

// F16's dynamic loss scale: an overflowing step is refused and halves the scale (not below
// 1); 200 good steps in a row double it (at most 2^24).
TEST(MixedPrecision, DynamicLossScaleHalvesOnOverflowAndGrowsBack) {
  DynamicLossScale s(1024.0f, 3);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));  // an overflow resets the run of good steps
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512.0f);
  DynamicLossScale low(2.0f);
  low.update(false), low.update(false), low.update(false);
  EXPECT_EQ(low.scale(), 1.0f);
  DynamicLossScale high(16777216.0f, 1);
  high.update(true);
  EXPECT_EQ(high.scale(), 16777216.0f);
}

// The best-model rule: with a learning rate that makes the validation loss go up and down,
// the outputs hold the weights of the best evaluation. Every record is the same, so the
// validation loss of the saved model can be computed here and must be the best one.
// (lr 10 without clipping is chaotic: where the best evaluation falls depends on the CPU's
// rounding, so the first of a few seeds whose best is not the last step is the case tested;
// on a Zen 4 the default seed's last evaluation was its best.)
TEST(FinetuneBest, OutputsHoldTheBestValidationWeights) {
  const std::string data = temp("same.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i) f << R"({"prompt": "the terms and", "completion": " conditions"})" << "\n";
  }
  FinetuneOptions o;
  o.model = chatml_model(), o.data = data, o.method = "lora", o.merge_type = "f32";
  o.out = temp("best_run"), o.force = true, o.quiet = true;
  o.steps = 8, o.batch = 2, o.eval_every = 1, o.lr = 10.0f, o.clip = 0, o.warmup = 0, o.lora_rank = 2;
  FinetuneResult r;
  for (uint64_t seed : {1337, 1, 2, 3, 4, 5}) {
    o.seed = seed;
    r = finetune(o);
    ASSERT_GE(r.best_step, 1);
    EXPECT_LE(r.best_val_loss, r.val_loss);
    EXPECT_EQ(r.model, r.best_step < r.steps ? "best" : "last");
    if (r.best_step < r.steps) break;
  }
  ASSERT_LT(r.best_step, r.steps) << "no seed's validation loss rose after its best";
  LoadedModel lm = load_model(o.out + "/model.gguf");
  SftExample e = parse_sft_record(R"({"prompt": "the terms and", "completion": " conditions"})", *lm.tokenizer,
                                  nullptr, "x");
  Tensor ids, targets;
  make_sft_batch({&e}, lm.model->config().vocab, ids, targets);
  NoGradGuard ng;
  EXPECT_NEAR(lm.model->loss(ids, targets).item(), r.best_val_loss, 1e-3 * std::max(1.0, r.best_val_loss));
  std::printf("best step %lld of %lld: val %.4f (last %.4f)\n", (long long)r.best_step, (long long)r.steps,
              r.best_val_loss, r.val_loss);
}

// A LoRA run on a base toy did not write — an untied head, add_bos_token and add_eos_token
// set to false, a byte-level BPE vocabulary — hands back model.gguf = base + scale B A: the
// head and every other weight no adapter covers are the base's bit for bit, the merged model
// computes what the base with adapter.gguf computes, and it tokenizes as the base does (the
// merge once drew a fresh random head for an untied base and dropped the BOS keys).
TEST(FinetuneMerge, LoraOnAnUntiedBaseToyDidNotWriteIsBasePlusTheAdapter) {
  const std::string corpus = "the cat sat on the mat. the dog ate the bone. a bird sang in the tree.\n";
  const std::unique_ptr<Tokenizer> tok = Tokenizer::train_fixed_size(corpus, "llama-bpe", 272);
  ModelConfig c = ModelConfig::for_arch("llama");
  c.vocab = 272, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 64, c.ctx = 64;
  c.tied = false;
  DecoderLM base_model(c);
  base_model.init(11);
  const std::string base = temp("foreign_base.gguf"), data = temp("foreign.jsonl");
  {
    gguf::Writer w;
    ModelWriteOptions wo;
    wo.toy_config = false;  // the standard keys alone, as llama.cpp's converter writes them
    add_model_to_gguf(w, base_model, *tok, "foreign", wo);
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(false));
    w.set("tokenizer.ggml.add_eos_token", gguf::Value::boolean(false));
    w.write(base);
    std::ofstream d(data);
    for (int i = 0; i < 24; ++i) d << R"({"prompt": "the cat", "completion": " sat on the mat."})" << "\n";
  }
  FinetuneOptions o;
  o.model = base, o.data = data, o.method = "lora", o.lora_rank = 8, o.lora_alpha = 16, o.merge_type = "f32";
  o.out = temp("foreign_run"), o.force = true, o.quiet = true;
  o.steps = 6, o.batch = 2, o.lr = 1e-2f, o.warmup = 0;
  finetune(o);

  gguf::Reader b(base), merged(o.out + "/model.gguf");
  EXPECT_EQ(merged.find("tokenizer.ggml.add_bos_token")->u, 0u);
  ASSERT_NE(merged.find("tokenizer.ggml.add_eos_token"), nullptr) << "the base's add_eos_token is kept";
  EXPECT_EQ(merged.find("tokenizer.ggml.add_eos_token")->u, 0u);
  ASSERT_NE(merged.find_tensor("output.weight"), nullptr) << "an untied base stays untied";
  for (const char* name : {"output.weight", "token_embd.weight", "output_norm.weight", "blk.1.attn_norm.weight"})
    EXPECT_EQ(merged.tensor(name).to_f32_vector(), b.tensor(name).to_f32_vector()) << name << " is the base's";
  EXPECT_NE(merged.tensor("blk.0.attn_q.weight").to_f32_vector(), b.tensor("blk.0.attn_q.weight").to_f32_vector())
      << "the adapters trained";

  LoadedModel with_adapter = load_model(base), merged_model = load_model(o.out + "/model.gguf");
  load_lora_adapter(*with_adapter.model, with_adapter.arch, o.out + "/adapter.gguf");
  EXPECT_EQ(merged_model.tokenizer->encode("the cat"), with_adapter.tokenizer->encode("the cat"));
  EXPECT_FALSE(merged_model.tokenizer->adds_bos());
  const std::vector<int32_t> ids = with_adapter.tokenizer->encode("the cat sat on");
  NoGradGuard ng;
  const Tensor x = from_vector(ids, Shape{1, int64_t(ids.size())});
  const std::vector<float> a = with_adapter.model->logits(x).to_f32_vector();
  const std::vector<float> m = merged_model.model->logits(x).to_f32_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - m[i]))), scale = std::max(scale, double(std::fabs(a[i])));
  EXPECT_LE(worst, 1e-5 * scale) << "model.gguf computes what the base with adapter.gguf computes";
}

// Fine-tuning a mixture of experts: QLoRA on a Q8_0 qwen3moe base trains the attention's
// adapters through the frozen quantized experts (their grouped products pass the gradient to
// the layers below), with the load-balancing loss on; full fine-tuning of an F32 base moves
// the chosen experts' weights and the routers. Both lower the loss on what they learned.
TEST(FinetuneMoe, QloraOnAQuantizedMixtureAndFullFineTuningLearn) {
  const std::string data = temp("moe_same.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 32; ++i) f << R"({"prompt": "the terms and", "completion": " conditions apply"})" << "\n";
  }
  // (QLoRA twice: on the default targets, and on the quantized experts alone, one adapter per expert.)
  for (const char* run : {"q8_0", "q8_0_experts", "f32"}) {
    SCOPED_TRACE(run);
    const std::string type = std::string(run).substr(0, 4) == "q8_0" ? "q8_0" : "f32";
    const std::string base = temp("moe_base_" + type + ".gguf");
    const auto r = toy::test::run_toy({"init", "--arch", "qwen3moe", "--shape", "tiny", "--type", type, "--seed", "4",
                                       "--out", base});
    ASSERT_EQ(r.status, 0) << toy::test::describe(r);
    const bool full = type == "f32";
    FinetuneOptions o;
    o.model = base, o.data = data, o.method = full ? "full" : "lora", o.merge_type = "f32";
    o.out = temp(std::string("moe_run_") + run), o.force = true, o.quiet = true;
    if (std::string(run) == "q8_0_experts") o.lora_targets = "ffn_gate_exps,ffn_up_exps,ffn_down_exps";
    o.steps = 30, o.batch = 4, o.lr = full ? 3e-3f : 1e-2f, o.val_fraction = 0, o.moe_aux_loss = 0.01f;
    const FinetuneResult res = finetune(o);
    EXPECT_EQ(res.steps, 30);
    auto loss_of = [&](const std::string& path) {
      LoadedModel lm = load_model(path);
      SftExample e = parse_sft_record(R"({"prompt": "the terms and", "completion": " conditions apply"})",
                                      *lm.tokenizer, nullptr, "x");
      Tensor ids, targets;
      make_sft_batch({&e}, lm.model->config().vocab, ids, targets);
      NoGradGuard ng;
      return lm.model->loss(ids, targets).item();
    };
    const double before = loss_of(base), after = loss_of(o.out + "/model.gguf");
    EXPECT_LT(after, before - 0.8) << "before " << before << ", after " << after;  // (measured: -1.2, -1.35)
    EXPECT_EQ(gguf::Reader(o.out + "/model.gguf").get_str("general.architecture"), "qwen3moe");
    if (full) {
      // The experts and the routers moved.
      const gguf::Reader a(base), b(o.out + "/model.gguf");
      for (const char* name : {"blk.0.ffn_up_exps.weight", "blk.1.ffn_gate_inp.weight"}) {
        const std::vector<float> wa = a.tensor(name).to_f32_vector(), wb = b.tensor(name).to_f32_vector();
        double moved = 0;
        for (size_t i = 0; i < wa.size(); ++i) moved = std::max(moved, double(std::fabs(wa[i] - wb[i])));
        EXPECT_GT(moved, 1e-4) << name;
      }
    }
    std::printf("qwen3moe %s %s: loss %.3f -> %.3f\n", run, full ? "full" : "QLoRA", before, after);
  }
}
