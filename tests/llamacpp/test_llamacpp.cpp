// llama.cpp runs our files: models toy trains and writes as GGUF (architectures llama and
// gpt2, byte and BPE vocabularies) are loaded by llama.cpp itself (node-llama-cpp 3.21.1's
// prebuilt library, tools/llamacpp) and must give the same next-token distribution at every
// position as toy does, and the same tokens for the same text. This pins every layout choice
// llama.cpp makes for these architectures (RoPE pair order, q/k/v packing, norms, the tied
// head) to what toy computes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "gguf_edit.h"
#include "proc.h"
#include "requirements.h"
#include "toy/autograd/grad_mode.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/lora.h"
#include "toy/nn/kv_cache.h"
#include "toy/ops/ops.h"
#include "toy/serve/engine.h"
#include "toy/tokenizer/tokenizer.h"
#include "toy/train/finetune.h"
#include "toy/train/trainer.h"

namespace fs = std::filesystem;
using namespace toy;

namespace {

const char* kGpl3 = "/usr/share/common-licenses/GPL-3";
const std::string kTools = std::string(TOY_SOURCE_DIR) + "/tools/llamacpp";

bool llamacpp_installed() {
  return fs::exists(kTools + "/node_modules/node-llama-cpp") && std::system("node --version >/dev/null 2>&1") == 0;
}

#define REQUIRE_LLAMACPP()                                                                               \
  TOY_REQUIRE(llamacpp_installed(), "node and tools/llamacpp/node_modules (run `npm ci` in tools/llamacpp)"); \
  TOY_REQUIRE_FILE(kGpl3)

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `lora`: an adapter llama.cpp applies to the context (as its --lora does).
nlohmann::json node(const std::vector<std::string>& args, const std::string& lora = "") {
  std::string cmd = lora.empty() ? "" : "TOY_LLAMACPP_LORA=" + shell_quote(lora) + " ";
  cmd += "node " + shell_quote(kTools + "/logprobs.mjs");
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  // (Per process: ctest runs these tests two at a time.)
  const std::string err = (fs::path(::testing::TempDir()) / ("toy_llamacpp_" + std::to_string(getpid()) + ".err")).string();
  cmd += " 2>" + shell_quote(err);
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[65536];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  if (st != 0) ADD_FAILURE() << "llama.cpp failed: " << toy::test::read_all(err);
  return nlohmann::json::parse(out);
}

// A small model trained for a few steps (so its distributions are not flat).
std::string train_model(const std::string& name, const std::string& preset, const std::string& tokenizer) {
  TrainOptions o;
  o.data = {kGpl3};
  o.out = (fs::path(::testing::TempDir()) / ("toy_llamacpp_" + name)).string();
  fs::remove_all(o.out);
  o.tokenizer = tokenizer;
  o.model = ModelConfig::from_preset(preset);
  o.model.layers = 2, o.model.heads = 4, o.model.kv_heads = preset == "llama" ? 2 : 4, o.model.dim = 64;
  o.model.ctx = 64;
  o.batch = 8, o.steps = 60, o.lr = 3e-3f, o.min_lr = 3e-4f, o.warmup = 5;
  o.eval_every = 0, o.eval_batches = 2, o.sample_tokens = 0, o.seed = 3, o.quiet = true;
  train(o);
  return o.out + "/model.gguf";
}

// The largest change an adapter makes to the base's logits on ids.
double adapter_moves_logits(const std::string& base, const std::string& adapter, const std::vector<int32_t>& ids) {
  LoadedModel plain = load_model(base), adapted = load_model(base);
  load_lora_adapter(*adapted.model, adapted.arch, adapter);
  NoGradGuard ng;
  const Tensor x = from_vector(ids, Shape{1, int64_t(ids.size())});
  const std::vector<float> a = plain.model->logits(x).to_f32_vector(), b = adapted.model->logits(x).to_f32_vector();
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, double(std::fabs(a[i] - b[i])));
  return moved;
}

// Compares toy's log-probabilities with llama.cpp's at every position of `ids`; returns the
// largest difference. `tolerance` bounds it; the most likely token must agree wherever
// toy's top two are further apart than `tie` in log-probability.
double expect_same_distributions(const std::string& model_path, const std::vector<int32_t>& ids,
                                 double tolerance = 1e-3, double tie = 0.0, const std::string& lora = "") {
  LoadedModel lm = load_model(model_path);
  if (!lora.empty()) load_lora_adapter(*lm.model, lm.arch, lora);
  NoGradGuard ng;
  const int64_t T = int64_t(ids.size()), V = lm.model->config().vocab;
  const std::vector<float> ours =
      log_softmax(lm.model->logits(from_vector(ids, Shape{1, T}))).to_f32_vector();
  nlohmann::json theirs = node({model_path, nlohmann::json(ids).dump()}, lora);
  EXPECT_EQ(theirs["n_vocab"], V);
  EXPECT_EQ(theirs["logprobs"].size(), size_t(T));
  if (theirs["n_vocab"] != V || theirs["logprobs"].size() != size_t(T)) return INFINITY;
  double worst = 0;
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto& row = theirs["logprobs"][size_t(t)];
    int32_t our_best = 0, their_best = 0;
    double their_max = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      const float o = ours[size_t(t * V + v)];
      if (o > ours[size_t(t * V + our_best)]) our_best = int32_t(v);
      if (row[size_t(v)].is_null()) continue;  // underflowed to 0 in llama.cpp's f32 softmax
      const double l = row[size_t(v)].get<double>();
      if (l > their_max) their_max = l, their_best = int32_t(v);
      if (l < -30) continue;  // a probability below 1e-13: f32 rounding noise on both sides
      worst = std::max(worst, std::fabs(double(o) - l));
      ++compared;
    }
    const double gap = double(ours[size_t(t * V + our_best)]) - double(ours[size_t(t * V + their_best)]);
    if (gap > tie) {
      EXPECT_EQ(our_best, their_best) << "most likely next token at position " << t;
    }
  }
  EXPECT_GT(compared, T * V / 2);
  EXPECT_LT(worst, tolerance) << "max |log p(toy) - log p(llama.cpp)| over " << compared << " entries";
  std::printf("%s: max |delta log p| = %.2e over %lld entries\n", model_path.c_str(), worst, (long long)compared);
  return worst;
}

// A random-weight model of architecture `arch` (every parameter random, norm weights too, so
// a weight the forward forgets changes the numbers), saved with a byte vocabulary.
std::string random_model(const std::string& name, const std::string& arch, int64_t head_dim) {
  ModelConfig c = ModelConfig::for_arch(arch);
  c.vocab = 257, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ctx = 64, c.ffn = 96;
  c.head_dim = head_dim;
  DecoderLM m(c);
  {
    NoGradGuard ng;
    uint64_t stream = 0;
    for (Tensor& p : m.params().values()) {
      Generator g(11, ++stream);
      const bool norm = p.name().find("norm") != std::string::npos;
      fill_normal_(p, g, norm ? 1.0f : 0.0f, norm ? 0.2f : 0.15f);
    }
  }
  const std::string path = (fs::path(::testing::TempDir()) / ("toy_llamacpp_" + name + ".gguf")).string();
  save_model(path, m, *Tokenizer::train("byte", ""), name);
  return path;
}

// Greedy continuation of `prompt` for n tokens in toy (cached decoding) and in llama.cpp: the
// same tokens — except that where toy's own top two are within `tie` in log-probability
// (rounding in either program may then pick the other) the comparison stops there.
void expect_same_greedy_tokens(const std::string& model_path, const std::vector<int32_t>& prompt, int n, double tie,
                               const std::string& lora = "") {
  LoadedModel lm = load_model(model_path);
  if (!lora.empty()) load_lora_adapter(*lm.model, lm.arch, lora);
  NoGradGuard ng;
  nn::KVCache cache = lm.model->new_cache(1, int64_t(prompt.size()) + n);
  std::vector<float> logits = lm.model->decode(cache, prompt).to_f32_vector();
  const std::vector<int32_t> theirs =
      node({model_path, "--generate-ids", nlohmann::json(prompt).dump(), std::to_string(n)}, lora)
          .get<std::vector<int32_t>>();
  ASSERT_EQ(theirs.size(), size_t(n));
  int same = 0;
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& lp = logits;
    const int32_t ours = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
    if (ours != theirs[size_t(i)]) {
      const double gap = double(lp[size_t(ours)]) - double(lp[size_t(theirs[size_t(i)])]);
      EXPECT_LE(gap, tie) << "greedy token " << i << ": toy " << ours << ", llama.cpp " << theirs[size_t(i)];
      break;
    }
    ++same;
    logits = lm.model->decode(cache, ours).to_f32_vector();
  }
  std::printf("%s: %d of %d greedy tokens identical\n", model_path.c_str(), same, n);
  if (tie == 0) {
    EXPECT_EQ(same, n);
  }
}

std::vector<int32_t> encode(const std::string& model_path, const std::string& text) {
  return load_model(model_path).tokenizer->encode(text);
}

}  // namespace

TEST(LlamaCpp, RunsOurLlamaModelWithTheSameDistributions) {
  REQUIRE_LLAMACPP();
  const std::string m = train_model("llama_byte", "llama", "byte");
  EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), "llama");
  expect_same_distributions(m, encode(m, "This License applies to any program or other work which contains"));
  expect_same_greedy_tokens(m, encode(m, "This License applies to "), 24, 0.0);
}

// `toy finetune --method lora` on a model toy trained: llama.cpp applies adapter.gguf to the
// base as toy does (same distributions, same greedy tokens), and runs the merged model.gguf.
TEST(LlamaCpp, AppliesOurLoraAdapterAndRunsTheMergedModel) {
  REQUIRE_LLAMACPP();
  const std::string base = train_model("llama_byte_lora", "llama", "byte");
  const std::string data = (fs::path(::testing::TempDir()) / "toy_llamacpp_lora.jsonl").string();
  {
    std::ofstream f(data);
    const std::string words[] = {"program", "license", "source", "copies", "notice", "terms", "work", "code"};
    for (int i = 0; i < 64; ++i) {
      const std::string w = words[i % 8] + " " + words[(i * 3 + 1) % 8];
      f << nlohmann::json({{"prompt", w + " ="}, {"completion", " " + std::string(w.rbegin(), w.rend())}}).dump() << "\n";
    }
  }
  FinetuneOptions o;
  o.model = base, o.data = data, o.method = "lora";
  o.out = (fs::path(::testing::TempDir()) / "toy_llamacpp_lora").string();
  o.lora_rank = 4, o.lora_alpha = 8, o.steps = 40, o.batch = 8, o.lr = 5e-3f, o.quiet = true, o.force = true;
  finetune(o);
  const std::string adapter = o.out + "/adapter.gguf", merged = o.out + "/model.gguf";
  const std::vector<int32_t> ids = encode(base, "source notice = ecruos eciton and the terms of this License");
  // The adapter changes the distributions (else the comparison would prove nothing) ...
  EXPECT_GT(adapter_moves_logits(base, adapter, ids), 0.1);
  // ... and llama.cpp applies it as toy does.
  expect_same_distributions(base, ids, 1e-3, 0.0, adapter);
  expect_same_greedy_tokens(base, encode(base, "work code ="), 16, 0.0, adapter);
  expect_same_distributions(merged, ids, 1e-3, 0.0);
  expect_same_greedy_tokens(merged, encode(merged, "work code ="), 16, 0.0);
}

// A model trained through a projection lens (a donor's table, frozen, under a trainable
// projection to another width) is saved folded: a plain llama file llama.cpp runs as toy does.
TEST(LlamaCpp, RunsAModelTrainedThroughAProjectionLens) {
  REQUIRE_LLAMACPP();
  const std::string donor = train_model("llama_byte_donor", "llama", "byte");  // width 64
  const std::string data = (fs::path(::testing::TempDir()) / "toy_llamacpp_lens.jsonl").string();
  {
    std::ofstream f(data);
    const std::string words[] = {"program", "license", "source", "copies", "notice", "terms", "work", "code"};
    for (int i = 0; i < 64; ++i) {
      const std::string w = words[i % 8] + " " + words[(i * 5 + 3) % 8];
      f << nlohmann::json({{"prompt", w + " ="}, {"completion", " " + std::string(w.rbegin(), w.rend())}}).dump() << "\n";
    }
  }
  FinetuneOptions o;
  o.donor_embeddings = donor, o.data = data, o.method = "full";
  o.shape = ModelConfig::from_preset("llama");
  o.shape.dim = 48, o.shape.layers = 2, o.shape.heads = 4, o.shape.kv_heads = 2, o.shape.ctx = 64;
  o.shape.tied = false;
  o.out = (fs::path(::testing::TempDir()) / "toy_llamacpp_lens").string();
  o.steps = 40, o.batch = 8, o.lr = 5e-3f, o.quiet = true, o.force = true;
  finetune(o);
  const std::string m = o.out + "/model.gguf";
  EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), "llama");
  EXPECT_EQ(load_model(m).model->config().dim, 48);
  expect_same_distributions(m, encode(m, "source notice = ecruos eciton and the terms of this License"));
  expect_same_greedy_tokens(m, encode(m, "work code ="), 16, 0.0);
}

TEST(LlamaCpp, RunsOurGpt2ModelWithTheSameDistributions) {
  REQUIRE_LLAMACPP();
  const std::string m = train_model("gpt2_byte", "gpt", "byte");
  EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), "gpt2");
  expect_same_distributions(m, encode(m, "You may convey verbatim copies of the Program's source code"));
}

TEST(LlamaCpp, TokenizesLikeToyWithOurBpeVocabulary) {
  REQUIRE_LLAMACPP();
  const std::string m = train_model("llama_bpe", "llama", "bpe:200");
  const std::vector<std::string> texts = {"the GNU General Public License, version 3", "  spaces  and\ttabs\nnewlines",
                                         "caf\xc3\xa9 \xe2\x98\x83 na\xc3\xafve 123 4567", "'s 've 're don't"};
  const nlohmann::json theirs = node({m, "--tokenize-all", nlohmann::json(texts).dump()});
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(theirs[i].get<std::vector<int32_t>>(), encode(m, texts[i])) << texts[i];
  expect_same_distributions(m, encode(m, "the terms and conditions for copying, distribution and modification"));
  expect_same_greedy_tokens(m, encode(m, "the terms and conditions "), 24, 0.0);
}

// The architectures toy loads from files made elsewhere, checked where it matters most: the
// layouts llama.cpp fixes for them (NEOX RoPE for qwen2/qwen3, q/k/v biases, per-head q/k
// RMSNorm before RoPE, an explicit head dim that is not dim / heads).
TEST(LlamaCpp, RunsQwen2AndQwen3ShapedModelsWithTheSameDistributions) {
  REQUIRE_LLAMACPP();
  const std::vector<int32_t> ids = {84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110, 32,
                                    102, 111, 120, 10, 74, 117, 109, 112, 115};
  for (const auto& [arch, head_dim] : std::vector<std::pair<std::string, int64_t>>{
           {"qwen2", 0}, {"qwen3", 0}, {"qwen3", 32}, {"llama", 0}}) {
    SCOPED_TRACE(arch + " head_dim " + std::to_string(head_dim));
    const std::string m = random_model(arch + "_" + std::to_string(head_dim), arch, head_dim);
    EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), arch);
    expect_same_distributions(m, ids);
    // Without toy.config the standard keys alone rebuild the same model.
    const std::string bare = m + ".bare.gguf";
    {
      toy::test::GgufContents c = toy::test::read_gguf(m);
      c.kv.erase(std::remove_if(c.kv.begin(), c.kv.end(), [](auto& kv) { return kv.first == "toy.config"; }),
                 c.kv.end());
      toy::test::write_gguf(bare, c);
    }
    LoadedModel a = load_model(m), b = load_model(bare);
    NoGradGuard ng;
    const Tensor x = from_vector(ids, Shape{1, int64_t(ids.size())});
    EXPECT_EQ(a.model->logits(x).to_f32_vector(), b.model->logits(x).to_f32_vector());
    EXPECT_EQ(a.model->config().to_json()["rope"], b.model->config().to_json()["rope"]);
  }
}

// Every pre-tokenizer toy implements splits text as llama.cpp does: a vocabulary trained with
// it, in a model llama.cpp loads, must give the same ids for texts that exercise digits,
// contractions, case, whitespace runs, newlines, punctuation and non-Latin scripts.
TEST(LlamaCpp, TokenizesLikeToyWithEveryPreTokenizer) {
  REQUIRE_LLAMACPP();
  const std::string corpus = toy::test::read_all(kGpl3);
  const std::vector<std::string> texts = {
      "Hello, World! It's 2026; we've 1234567 reasons.", "  leading and trailing spaces   ",
      "tabs\tand\nnew\r\nlines\n\n\nand more", "DON'T Shout 'em", "caf\xc3\xa9 na\xc3\xafve \xe2\x98\x83 \xf0\x9f\x98\x80!",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c 3.14159 $100 <tag>x</tag>", "a+b=c^2 ~x | y",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80 123 4.5"};
  for (const std::string pre : {"gpt-2", "llama-bpe", "qwen2", "smollm", "default"}) {
    SCOPED_TRACE(pre);
    auto tok = Tokenizer::train("bpe:300:" + pre, corpus);
    ModelConfig c = ModelConfig::for_arch("llama");
    c.vocab = tok->vocab_size(), c.dim = 32, c.layers = 1, c.heads = 2, c.kv_heads = 2, c.ctx = 32, c.ffn = 64;
    DecoderLM m(c);
    m.init(1);
    const std::string path = (fs::path(::testing::TempDir()) / ("toy_llamacpp_pre_" + pre + ".gguf")).string();
    save_model(path, m, *tok, "pre " + pre);
    const nlohmann::json theirs = node({path, "--tokenize-all", nlohmann::json(texts).dump()});
    ASSERT_EQ(theirs.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(theirs[i].get<std::vector<int32_t>>(), tok->encode(texts[i])) << texts[i];
  }
}

// `toy init` files of every architecture and weight type run in llama.cpp: the same token ids
// for a text, the same next-token distributions, and the same greedy continuation, where a
// differing token is allowed only at a near-tie of toy's own top two. toy rounds activations
// to 8 bits for block weights exactly as llama.cpp does, so quantized files often agree to
// ~2e-6 in log-probability; elsewhere a last-bit difference upstream (summation order,
// llama.cpp's GELU table, F16/BF16 activations it rounds and toy does not) can flip one
// rounding to 8 bits, which moves a log-probability by up to ~0.02 (measured 0.0174 at most).
TEST(LlamaCpp, RunsToyInitModelsOfEveryArchitectureAndType) {
  REQUIRE_LLAMACPP();
  const std::string text = "the terms and conditions for copying, distribution and modification follow";
  struct Case {
    std::string arch, type;
  };
  std::vector<Case> cases;
  for (const char* arch : {"llama", "qwen2", "qwen3", "gpt2"})
    for (const char* type : {"f32", "q8_0", "q4_k_m"}) cases.push_back({arch, type});
  for (const char* type : {"f16", "bf16", "q4_0", "q5_0", "q4_k", "q5_k", "q6_k"}) cases.push_back({"llama", type});
  // Published architectures (tiny: width 64, every part present — SmolLM3's no-RoPE layer,
  // Phi-3's fused tensors and LongRoPE, Gemma 3's sliding layers and soft cap, 4 experts with
  // 2 per token, LFM2's short-conv layers between attention ones).
  for (const char* arch : {"smollm3", "phi3", "gemma3", "qwen3moe", "olmoe", "granitemoe", "lfm2"})
    for (const char* type : {"f32", "f16", "q8_0", "q4_k_m"}) cases.push_back({arch, type});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.arch + " " + c.type);
    const std::string path = (fs::path(::testing::TempDir()) / ("toy_init_" + c.arch + "_" + c.type + ".gguf")).string();
    const auto r = toy::test::run_toy({"init", "--arch", c.arch, "--shape", "tiny", "--type", c.type, "--seed", "5",
                                       "--out", path});
    ASSERT_EQ(r.status, 0) << toy::test::describe(r);
    const std::vector<int32_t> ids = encode(path, text);
    EXPECT_EQ(node({path, "--tokenize", text}).get<std::vector<int32_t>>(), ids);
    const bool exact = c.type == "f32";
    const double tolerance = exact ? 1e-3 : 0.04;
    expect_same_distributions(path, ids, tolerance, exact ? 0.0 : 2 * tolerance);
    expect_same_greedy_tokens(path, ids, 16, exact ? 1e-4 : 2 * tolerance);
  }
}

// Phi-3's LongRoPE: within the original context (tiny: 256 positions) the short factors rotate,
// past it the long ones — in llama.cpp by its context's size (padded to 256), in toy by the
// cache's capacity (or the sequence's length without a cache). Both agree either side.
TEST(LlamaCpp, Phi3LongRopeSwitchesFactorsAsLlamaCppDoes) {
  REQUIRE_LLAMACPP();
  const std::string path = (fs::path(::testing::TempDir()) / "toy_init_phi3_longrope.gguf").string();
  const auto r = toy::test::run_toy({"init", "--arch", "phi3", "--shape", "tiny", "--seed", "9", "--out", path});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  std::string text;
  while (text.size() < 1200) text += "the terms and conditions for copying, distribution and modification; ";
  const std::vector<int32_t> ids = encode(path, text);
  ASSERT_GT(ids.size(), 260u);
  ASSERT_LT(ids.size(), 1000u);
  const std::vector<int32_t> short_ids(ids.begin(), ids.begin() + 40);
  const double within = expect_same_distributions(path, short_ids, 1e-3);
  const double past = expect_same_distributions(path, ids, 1e-3);
  // (The factors differ: the first 40 positions under the long ones move the distributions.)
  LoadedModel lm = load_model(path);
  NoGradGuard ng;
  nn::KVCache long_cache = lm.model->new_cache(1, 512);
  const std::vector<float> a = lm.model->logits(from_vector(short_ids, Shape{1, 40})).to_f32_vector();
  const std::vector<float> b =
      lm.model->logits(from_vector(short_ids, Shape{1, 40}), false, nullptr, &long_cache).to_f32_vector();
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, double(std::fabs(a[i] - b[i])));
  EXPECT_GT(moved, 0.05) << "short and long factors give the same logits: the switch is not tested";
  std::printf("phi3 LongRoPE: short %.2e, long %.2e, factors move logits by %.3f\n", within, past, moved);
}

// A mixture of experts toy trains from scratch (`--preset moe-tiny`, with the load-balancing
// loss) is a qwen3moe file llama.cpp runs as toy does.
TEST(LlamaCpp, RunsAMixtureOfExpertsToyTrained) {
  REQUIRE_LLAMACPP();
  const std::string dir = (fs::path(::testing::TempDir()) / "toy_llamacpp_moe_trained").string();
  const auto r = toy::test::run_toy({"train", "--data", kGpl3, "--out", dir, "--force", "--preset", "moe-tiny",
                                     "--tokenizer", "byte", "--layers", "2", "--dim", "64", "--heads", "4",
                                     "--kv-heads", "2", "--experts", "4", "--ctx", "64", "--batch", "8", "--steps",
                                     "60", "--lr", "3e-3", "--moe-aux-loss", "0.01", "--eval-every", "0",
                                     "--sample-tokens", "0", "--quiet"});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const std::string m = dir + "/model.gguf";
  EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), "qwen3moe");
  expect_same_distributions(m, encode(m, "You may convey verbatim copies of the Program's source code"));
  expect_same_greedy_tokens(m, encode(m, "the terms and conditions "), 24, 0.0);
}

// A hybrid toy trains (3:1 Gated DeltaNet : gated attention, byte vocabulary) is a qwen35 file
// llama.cpp runs as toy does.
TEST(LlamaCpp, RunsAHybridToyTrained) {
  REQUIRE_LLAMACPP();
  const std::string dir = (fs::path(::testing::TempDir()) / "toy_llamacpp_qwen35_trained").string();
  const auto r = toy::test::run_toy({"train", "--data", kGpl3, "--out", dir, "--force", "--preset", "qwen35",
                                     "--tokenizer", "byte", "--layers", "4", "--layer-kinds", "ddda", "--dim", "64",
                                     "--heads", "4", "--kv-heads", "2", "--gdn-k-heads", "2", "--gdn-heads", "4",
                                     "--ctx", "64", "--batch", "8", "--steps", "60", "--lr", "3e-3", "--eval-every",
                                     "0", "--sample-tokens", "0", "--quiet"});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const std::string m = dir + "/model.gguf";
  EXPECT_EQ(gguf::Reader(m).get_str("general.architecture"), "qwen35");
  expect_same_distributions(m, encode(m, "You may convey verbatim copies of the Program's source code"));
  expect_same_greedy_tokens(m, encode(m, "the terms and conditions "), 24, 0.0);
}

// LoRA on every projection of a hybrid — the Gated DeltaNet layer's attn_qkv, attn_gate,
// ssm_alpha, ssm_beta, ssm_out too: llama.cpp applies the adapter as toy does, and runs the
// merged model.
TEST(LlamaCpp, AppliesOurLoraAdapterOnAHybrid) {
  REQUIRE_LLAMACPP();
  const std::string base = (fs::path(::testing::TempDir()) / "toy_llamacpp_qwen35_lora_base.gguf").string();
  const auto r = toy::test::run_toy({"init", "--arch", "qwen35", "--shape", "tiny", "--seed", "11", "--out", base});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const std::string data = (fs::path(::testing::TempDir()) / "toy_llamacpp_qwen35_lora.jsonl").string();
  {
    std::ofstream f(data);
    const std::string words[] = {"program", "license", "source", "copies", "notice", "terms", "work", "code"};
    for (int i = 0; i < 48; ++i) {
      const std::string w = words[i % 8] + " " + words[(i * 3 + 1) % 8];
      f << nlohmann::json({{"prompt", w + " ="}, {"completion", " " + std::string(w.rbegin(), w.rend())}}).dump() << "\n";
    }
  }
  FinetuneOptions o;
  o.model = base, o.data = data, o.method = "lora", o.merge_type = "f32";
  o.out = (fs::path(::testing::TempDir()) / "toy_llamacpp_qwen35_lora").string();
  // (Every projection named: the defaults leave out ssm_alpha/ssm_beta.)
  o.lora_targets = "attn_qkv,attn_gate,ssm_alpha,ssm_beta,ssm_out,q,k,v,o,gate,up,down";
  o.lora_rank = 4, o.lora_alpha = 8, o.steps = 30, o.batch = 8, o.lr = 1e-2f, o.quiet = true, o.force = true;
  finetune(o);
  const std::string adapter = o.out + "/adapter.gguf", merged = o.out + "/model.gguf";
  EXPECT_NE(gguf::Reader(adapter).find_tensor("blk.0.ssm_alpha.weight.lora_a"), nullptr);
  const std::vector<int32_t> ids = encode(base, "source notice = ecruos eciton and the terms of this License");
  // The adapter moves the distributions (else agreeing would prove nothing).
  EXPECT_GT(adapter_moves_logits(base, adapter, ids), 0.1);
  expect_same_distributions(base, ids, 1e-3, 0.0, adapter);
  expect_same_greedy_tokens(base, encode(base, "work code ="), 16, 0.0, adapter);
  expect_same_distributions(merged, ids, 1e-3, 0.0);
}

// LoRA on every projection of the published architectures — Phi-3's fused attn_qkv and
// gate/up ffn_up, Gemma 3's and SmolLM3's separate ones, the attention of the mixtures of
// experts and the experts themselves, LFM2's short convs' in and out projections: llama.cpp
// applies the adapter as toy does (a Q8_0 base: QLoRA), and runs the merged model.
TEST(LlamaCpp, AppliesOurLoraAdapterOnPublishedArchitectures) {
  REQUIRE_LLAMACPP();
  const std::string data = (fs::path(::testing::TempDir()) / "toy_llamacpp_arch_lora.jsonl").string();
  {
    std::ofstream f(data);
    const std::string words[] = {"program", "license", "source", "copies", "notice", "terms", "work", "code"};
    for (int i = 0; i < 48; ++i) {
      const std::string w = words[i % 8] + " " + words[(i * 3 + 1) % 8];
      f << nlohmann::json({{"prompt", w + " ="}, {"completion", " " + std::string(w.rbegin(), w.rend())}}).dump() << "\n";
    }
  }
  for (const char* arch : {"smollm3", "phi3", "gemma3", "qwen3moe", "olmoe", "granitemoe", "lfm2"}) {
    SCOPED_TRACE(arch);
    const std::string base = (fs::path(::testing::TempDir()) / (std::string("toy_llamacpp_lora_") + arch + ".gguf")).string();
    // (The mixtures of experts on an F32 base: a Q8_0 base's 8-bit activations put the two
    // sides' hidden states ~1e-3 apart, enough to tip a token whose router sits near a tie to
    // another expert — measured 4.3e-2 on olmoe's; the quantized experts' own agreement is
    // RunsToyInitModels…'s.)
    const bool moe = std::string(arch) == "qwen3moe" || std::string(arch) == "olmoe" || std::string(arch) == "granitemoe";
    const auto r = toy::test::run_toy({"init", "--arch", arch, "--shape", "tiny", "--type", moe ? "f32" : "q8_0",
                                       "--seed", "12", "--out", base});
    ASSERT_EQ(r.status, 0) << toy::test::describe(r);
    FinetuneOptions o;
    o.model = base, o.data = data, o.method = "lora", o.merge_type = "f32";
    o.out = (fs::path(::testing::TempDir()) / (std::string("toy_llamacpp_lora_") + arch)).string();
    o.lora_rank = 4, o.lora_alpha = 8, o.steps = 30, o.batch = 8, o.lr = 1e-2f, o.quiet = true, o.force = true;
    // The mixtures adapt their experts too (one adapter per expert: llama.cpp's
    // build_lora_mm_id), and Granite's shared expert.
    if (moe)
      o.lora_targets = std::string("q,k,v,o,ffn_gate_exps,ffn_up_exps,ffn_down_exps") +
                       (std::string(arch) == "granitemoe" ? ",ffn_gate_shexp,ffn_up_shexp,ffn_down_shexp" : "");
    finetune(o);
    const std::string adapter = o.out + "/adapter.gguf", merged = o.out + "/model.gguf";
    if (moe) EXPECT_NE(gguf::Reader(adapter).find_tensor("blk.1.ffn_down_exps.weight.lora_b"), nullptr);
    const std::vector<int32_t> ids = encode(base, "source notice = ecruos eciton and the terms of this License");
    EXPECT_GT(adapter_moves_logits(base, adapter, ids), 0.1);
    // On the Q8_0 base, the quantized files' tolerance (RunsToyInitModels…): llama.cpp rounds
    // GELU's input and output to f16 (its table), and Gemma's 8-bit activations after the GeGLU
    // can then round a step apart (measured 1.0e-2; smollm3 and phi3 1e-6). Merged F32: 1e-3.
    expect_same_distributions(base, ids, moe ? 1e-3 : 0.04, moe ? 0.0 : 0.08, adapter);
    expect_same_distributions(merged, ids, 1e-3, 0.0);
    if (moe) {
      // The experts' adapters alone: they move the logits, and llama.cpp applies them as toy does.
      const std::string experts_only = o.out + "_experts_only.gguf";  // (beside the run: --force keeps only its own files)
      toy::test::GgufContents c = toy::test::read_gguf(adapter);
      std::erase_if(c.tensors, [](const auto& t) { return t.first.find("_exps.") == std::string::npos; });
      toy::test::write_gguf(experts_only, c);
      EXPECT_GT(adapter_moves_logits(base, experts_only, ids), 0.05);
      expect_same_distributions(base, ids, 1e-3, 0.0, experts_only);
    }
  }
}

// Qwen3.5's hybrid (a Gated DeltaNet layer, a gated-attention layer, fewer K heads than V heads
// in the GDN, a quarter of each head rotated): toy init's files run in llama.cpp's qwen35 graph
// as in toy.
TEST(LlamaCpp, RunsToyInitQwen35Models) {
  REQUIRE_LLAMACPP();
  const std::string text = "the terms and conditions for copying, distribution and modification follow";
  for (const char* type : {"f32", "q8_0", "q4_k_m"}) {
    SCOPED_TRACE(type);
    const std::string path = (fs::path(::testing::TempDir()) / (std::string("toy_init_qwen35_") + type + ".gguf")).string();
    const auto r = toy::test::run_toy({"init", "--arch", "qwen35", "--shape", "tiny", "--type", type, "--seed", "5",
                                       "--out", path});
    ASSERT_EQ(r.status, 0) << toy::test::describe(r);
    const std::vector<int32_t> ids = encode(path, text);
    EXPECT_EQ(node({path, "--tokenize", text}).get<std::vector<int32_t>>(), ids);
    const bool exact = std::string(type) == "f32";
    const double tolerance = exact ? 1e-3 : 0.04;
    expect_same_distributions(path, ids, tolerance, exact ? 0.0 : 2 * tolerance);
    expect_same_greedy_tokens(path, ids, 16, exact ? 1e-4 : 2 * tolerance);
  }
}

namespace {
// (name, type, data bytes) of every tensor, sorted by name (llama.cpp's quantizer writes them
// in its own order).
std::vector<std::tuple<std::string, std::string, std::string>> tensor_listing(const std::string& path) {
  gguf::Reader r(path);
  std::vector<std::tuple<std::string, std::string, std::string>> out;
  for (const gguf::TensorInfo& t : r.tensors()) {
    const Tensor x = r.tensor(t.name);
    out.emplace_back(t.name, std::string(name(t.dtype)), std::string(static_cast<const char*>(x.raw_data()), t.bytes));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `toy quantize` and llama.cpp's llama_model_quantize (tools/llamacpp/quantize.py) on the same
// F32 file: the same type for every tensor and, where the types agree, the same bytes. Returns
// toy's tensor listing for further checks.
std::vector<std::tuple<std::string, std::string, std::string>> expect_quantized_as_llama(
    const std::string& f32, const fs::path& dir, const std::string& kind, int ftype) {
  const std::string ours = (dir / (kind + ".toy.gguf")).string(), theirs = (dir / (kind + ".llama.gguf")).string();
  const auto r = toy::test::run_toy({"quantize", f32, ours, kind});
  EXPECT_EQ(r.status, 0) << toy::test::describe(r);
  const std::string cmd = "python3 " + shell_quote(kTools + "/quantize.py") + " " + shell_quote(f32) + " " +
                          shell_quote(theirs) + " " + std::to_string(ftype) + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto a = tensor_listing(ours), b = tensor_listing(theirs);
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const auto& [name_a, type_a, bytes_a] = a[i];
    const auto& [name_b, type_b, bytes_b] = b[i];
    EXPECT_EQ(name_a, name_b);
    EXPECT_EQ(type_a, type_b) << name_a;
    // Q5_K and Q5_1 are written by toy's own encoders as well; all of them match ggml's.
    if (type_a == type_b) EXPECT_TRUE(bytes_a == bytes_b) << name_a << " (" << type_a << ") bytes differ";
  }
  EXPECT_EQ(gguf::Reader(ours).get_u32("general.file_type"), uint32_t(ftype));
  return a;
}

// A random F32 model of config c, saved for a comparison with llama-quantize: its folder and file.
std::pair<fs::path, std::string> quantize_base(const ModelConfig& c, const std::string& name) {
  DecoderLM m(c);
  m.init(9);
  const fs::path dir = fs::path(::testing::TempDir()) / ("toy_quantize_" + name + "_vs_llama");
  fs::create_directories(dir);
  const std::string f32 = (dir / "f32.gguf").string();
  save_model(f32, m, *Tokenizer::train("byte", ""), "quantize-" + name + "-test");
  return {dir, f32};
}
}  // namespace

// `toy quantize` writes what llama.cpp's own quantizer (llama_model_quantize, called through
// tools/llamacpp/quantize.py) writes: the same type for every tensor — the Q4_K_M and Q5_K_M
// mixes over 16 layers, the output rule, the fallback of 288-wide rows to 32-block types —
// and, since toy's encoders reproduce ggml's, the same bytes.
TEST(LlamaCpp, QuantizesTensorForTensorLikeLlamaQuantize) {
  REQUIRE_LLAMACPP();
  TOY_REQUIRE(std::system("python3 --version >/dev/null 2>&1") == 0, "python3");
  ModelConfig c = ModelConfig::for_arch("llama");
  c.vocab = 257, c.dim = 288, c.layers = 16, c.heads = 4, c.kv_heads = 2, c.ctx = 64, c.ffn = 512;
  const auto [dir, f32] = quantize_base(c, "dense");
  const std::vector<std::pair<std::string, int>> kinds = {{"q4_k_m", 15}, {"q5_k_m", 17}, {"q4_k", 14}, {"q6_k", 18},
                                                          {"q8_0", 7},    {"q4_0", 2},    {"q5_0", 8},  {"f16", 1}};
  for (const auto& [kind, ftype] : kinds) {
    SCOPED_TRACE(kind);
    int q6 = 0, fallback = 0;
    for (const auto& [name, type, bytes] : expect_quantized_as_llama(f32, dir, kind, ftype)) {
      q6 += type == "q6_k";
      fallback += type == "q5_0" || type == "q5_1" || type == "q8_0";
    }
    if (kind == "q4_k_m") {
      EXPECT_GT(q6, 0) << "the mix gave no tensor more bits";
      EXPECT_GT(fallback, 0) << "no 288-wide row fell back";
    }
  }
}

// A mixture of experts quantizes as llama-quantize does too: 8 experts (its attn_k and attn_v
// Q8_0, attn_output Q5_K under the K mixes), 3-D expert tensors, a router that stays F32, and
// a shared expert whose ffn_down_shexp shares its layer with ffn_down_exps (the Q6_K layers of
// the _M mixes come from the name).
TEST(LlamaCpp, QuantizesMixturesOfExpertsLikeLlamaQuantize) {
  REQUIRE_LLAMACPP();
  TOY_REQUIRE(std::system("python3 --version >/dev/null 2>&1") == 0, "python3");
  ModelConfig c = ModelConfig::for_arch("granitemoe");
  c.vocab = 257, c.dim = 256, c.layers = 8, c.heads = 4, c.kv_heads = 2, c.ctx = 64, c.ffn = 256;
  c.moe = MoeConfig{8, 2, 256, true, 256};
  c.logit_scale = 4.0f;
  const auto [dir, f32] = quantize_base(c, "moe");
  ASSERT_EQ(gguf::Reader(f32).get_str("general.architecture"), "granitemoe");
  for (const auto& [kind, ftype] : std::vector<std::pair<std::string, int>>{
           {"q4_k_m", 15}, {"q4_k_s", 14}, {"q5_k_m", 17}, {"q8_0", 7}, {"q4_0", 2}}) {
    SCOPED_TRACE(kind);
    for (const auto& [name, type, bytes] : expect_quantized_as_llama(f32, dir, kind, ftype))
      if (name.find("ffn_gate_inp") != std::string::npos) EXPECT_EQ(type, "f32") << name;
  }
}

// LFM2 quantizes as llama-quantize does: its short convs' taps stay F32, the in and out
// projections quantize, and the Q6_K attn_v layers of the _M mixes count attention layers only.
TEST(LlamaCpp, QuantizesLfm2LikeLlamaQuantize) {
  REQUIRE_LLAMACPP();
  TOY_REQUIRE(std::system("python3 --version >/dev/null 2>&1") == 0, "python3");
  ModelConfig c = ModelConfig::for_arch("lfm2");
  c.vocab = 257, c.dim = 256, c.layers = 12, c.heads = 4, c.kv_heads = 2, c.ctx = 64, c.ffn = 512;
  c.layer_kinds = ModelConfig::parse_layer_kinds("cca", c.layers);
  const auto [dir, f32] = quantize_base(c, "lfm2");
  ASSERT_EQ(gguf::Reader(f32).get_str("general.architecture"), "lfm2");
  for (const auto& [kind, ftype] : std::vector<std::pair<std::string, int>>{
           {"q4_k_m", 15}, {"q4_k_s", 14}, {"q8_0", 7}, {"q4_0", 2}}) {
    SCOPED_TRACE(kind);
    int in_proj = 0;
    for (const auto& [name, type, bytes] : expect_quantized_as_llama(f32, dir, kind, ftype)) {
      if (name.find("shortconv.conv") != std::string::npos) EXPECT_EQ(type, "f32") << name;
      if (name.find("shortconv.in_proj") != std::string::npos) in_proj += type != "f32";
    }
    EXPECT_EQ(in_proj, 8);
  }
}

// `toy perplexity` follows llama-perplexity's method; here the method is applied to llama.cpp's
// own next-token distributions (chunks of N tokens, BOS first when the vocabulary adds one,
// the second half of each chunk scored) and the two perplexities must agree.
TEST(LlamaCpp, PerplexityAgreesWithLlamaCppsDistributions) {
  REQUIRE_LLAMACPP();
  const fs::path dir = fs::path(::testing::TempDir()) / "toy_ppl";
  fs::create_directories(dir);
  const std::string model = (dir / "m.gguf").string(), text_path = (dir / "text.txt").string();
  auto r = toy::test::run_toy({"init", "--arch", "llama", "--shape", "tiny", "--seed", "3", "--out", model});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const std::string text = toy::test::read_all(kGpl3).substr(0, 6000);
  { std::ofstream(text_path, std::ios::binary) << text; }
  const int64_t N = 64, chunks = 3;
  r = toy::test::run_toy({"perplexity", "-m", model, "-f", text_path, "--ctx", std::to_string(N), "--chunks",
                          std::to_string(chunks), "--json"});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  const nlohmann::json ours = nlohmann::json::parse(r.out);
  LoadedModel lm = load_model(model);
  std::vector<int32_t> ids;
  if (lm.tokenizer->adds_bos()) ids.push_back(lm.tokenizer->bos_id());
  const std::vector<int32_t> body = node({model, "--tokenize", text}).get<std::vector<int32_t>>();
  ids.insert(ids.end(), body.begin(), body.end());
  double nll = 0;
  int64_t count = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> chunk(ids.begin() + c * N, ids.begin() + (c + 1) * N);
    if (lm.tokenizer->adds_bos()) chunk[0] = lm.tokenizer->bos_id();
    const nlohmann::json lp = node({model, nlohmann::json(chunk).dump()});
    for (int64_t j = N / 2; j < N - 1; ++j) {
      nll -= lp["logprobs"][size_t(j)][size_t(chunk[size_t(j + 1)])].get<double>();
      ++count;
    }
  }
  EXPECT_EQ(ours["chunks"], chunks);
  EXPECT_EQ(ours["tokens"], count);
  const double theirs = std::exp(nll / double(count));
  EXPECT_NEAR(ours["ppl"].get<double>(), theirs, 1e-3 * theirs) << "toy " << ours["ppl"] << " vs llama.cpp " << theirs;
}

// The Hugging Face-convention fixtures (tests/fixtures/hf, converted as llama.cpp's converter
// does) run in llama.cpp with the distributions toy computes: the layouts toy reads from a
// converted file are the ones llama.cpp reads.
TEST(LlamaCpp, RunsTheHuggingFaceConventionFixturesAsToyDoes) {
  REQUIRE_LLAMACPP();
  const std::vector<int32_t> ids = {84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110, 32};
  for (const char* arch : {"llama", "qwen2", "qwen3", "gpt2"}) {
    SCOPED_TRACE(arch);
    const std::string dir = std::string(TOY_SOURCE_DIR) + "/tests/fixtures/hf/";
    // GPT-2: llama.cpp's GELU reads an f16 table (toy and the reference compute the tanh
    // form), worth a few 1e-3 on these rough fixtures.
    expect_same_distributions(dir + arch + ".gguf", ids, std::string(arch) == "gpt2" ? 1e-2 : 1e-3);
  }
}

// toy serve's log-probabilities (the engine's, as /v1/*completions return them) agree with
// llama.cpp's distribution on the same file within 0.02 (the bound; f32 here agrees far
// closer), and the alternatives are llama.cpp's most likely tokens.
TEST(LlamaCpp, ServedLogprobsAgreeWithLlamaCpp) {
  REQUIRE_LLAMACPP();
  const std::string m = train_model("serve_logprobs", "llama", "byte");
  LoadedModel lm = load_model(m);
  serve::Engine engine(*lm.model, *lm.tokenizer, {.parallel = 1, .ctx = 64});
  serve::GenParams p;
  p.prompt = lm.tokenizer->encode("Everyone is permitted to copy");
  p.max_tokens = 8;
  p.sampling.temperature = 0;
  p.top_logprobs = 5;
  p.ignore_eos = true;
  const std::shared_ptr<serve::Job> job = engine.submit(p);
  ASSERT_TRUE(job);
  job->wait_all();
  const std::vector<serve::TokenLogprob> lps = job->take_logprobs();
  engine.shutdown("done");
  ASSERT_EQ(lps.size(), 8u);
  std::vector<int32_t> ids = p.prompt;
  for (const auto& lp : lps) ids.push_back(lp.id);
  const nlohmann::json theirs = node({m, nlohmann::json(ids).dump()});
  double worst = 0;
  for (size_t i = 0; i < lps.size(); ++i) {
    const nlohmann::json& row = theirs["logprobs"][p.prompt.size() - 1 + i];
    worst = std::max(worst, std::fabs(lps[i].logprob - row[size_t(lps[i].id)].get<double>()));
    ASSERT_EQ(lps[i].top.size(), 5u);
    EXPECT_EQ(lps[i].top[0].first, lps[i].id) << "greedy: the chosen token is the most likely";
    for (const auto& [id, v] : lps[i].top) worst = std::max(worst, std::fabs(v - row[size_t(id)].get<double>()));
  }
  std::printf("served logprobs vs llama.cpp: largest difference %.2e over %zu tokens x 6 values\n", worst, lps.size());
  EXPECT_LT(worst, 0.02);
}

// /v1/embeddings' vectors (the engine's pooled, normalised final hidden states) point where
// llama.cpp's embedding of the same file points: cosine >= 0.999 for mean pooling (the file's
// pooling_type set to mean, as llama.cpp reads it) and for the last token (no pooling_type:
// llama.cpp's embedding context then takes the last token).
TEST(LlamaCpp, EmbeddingsAgreeWithLlamaCpp) {
  REQUIRE_LLAMACPP();
  const std::string m = train_model("embeddings", "llama", "byte");
  const std::string mean_file = (fs::path(::testing::TempDir()) / "toy_llamacpp_embeddings_mean.gguf").string();
  {
    gguf::Reader r(m);
    gguf::Writer w;
    for (const auto& [k, v] : r.metadata()) w.set(k, v);
    w.set(r.get_str("general.architecture") + ".pooling_type", gguf::Value::u32(1));  // LLAMA_POOLING_TYPE_MEAN
    for (const auto& t : r.tensors()) w.add_tensor(t.name, r.tensor(t.name));
    w.write(mean_file);
  }
  LoadedModel lm = load_model(m);
  serve::Engine engine(*lm.model, *lm.tokenizer, {.parallel = 1, .ctx = 64});
  for (const auto& [file, pooling] : {std::pair{mean_file, serve::Pooling::Mean}, std::pair{m, serve::Pooling::Last}}) {
    const nlohmann::json theirs = node({file, "--embed", nlohmann::json(lm.tokenizer->encode("Everyone is permitted")).dump()});
    const std::vector<int32_t> evaluated = theirs["tokens"].get<std::vector<int32_t>>();
    const std::vector<float> ours = engine.embed({evaluated}, pooling).at(0);
    const std::vector<double> v = theirs["embedding"].get<std::vector<double>>();
    ASSERT_EQ(v.size(), ours.size());
    double dot = 0, nv = 0, no = 0;
    for (size_t i = 0; i < v.size(); ++i) dot += v[i] * ours[i], nv += v[i] * v[i], no += double(ours[i]) * ours[i];
    const double cosine = dot / std::sqrt(nv * no);
    std::printf("embedding (%s pooling) vs llama.cpp: cosine %.7f, |ours| %.6f\n",
                pooling == serve::Pooling::Mean ? "mean" : "last", cosine, std::sqrt(no));
    EXPECT_GE(cosine, 0.999);
    EXPECT_NEAR(std::sqrt(no), 1.0, 1e-5) << "unit length, as OpenAI's";
  }
  engine.shutdown("done");
}
