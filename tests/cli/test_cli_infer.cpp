// The inference commands end to end: toy init (shapes, types, the arch x shape table), toy
// quantize, toy chat (templates), toy perplexity and toy bench run — as a user runs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "requirements.h"
#include "toy/infer/chat.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace toy;
using toy::test::describe;
using toy::test::run_toy;
using toy::test::ProcOptions;
using toy::test::read_all;

namespace {
std::string temp(const std::string& name) { return (fs::path(::testing::TempDir()) / ("toy_infer_" + name)).string(); }

std::string init_tiny(const std::string& arch, const std::string& type = "f32") {
  const std::string path = temp(arch + "_" + type + ".gguf");
  if (!fs::exists(path)) {  // (ctest's parallel processes: each writes its own, then renames it into place)
    const std::string mine = path + "." + std::to_string(getpid());
    const auto r = run_toy({"init", "--arch", arch, "--shape", "tiny", "--type", type, "--out", mine});
    EXPECT_EQ(r.status, 0) << describe(r);
    fs::rename(mine, path);
  }
  return path;
}
}  // namespace

TEST(CliInit, WritesEveryArchitectureWithStandardKeysOnly) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "gpt2"}) {
    SCOPED_TRACE(arch);
    gguf::Reader r(init_tiny(arch));
    EXPECT_EQ(r.get_str("general.architecture"), arch);
    EXPECT_FALSE(r.has("toy.config")) << "toy init writes files as llama.cpp's converter does";
    EXPECT_EQ(r.get_u32(std::string(arch) + ".embedding_length"), 256u);
    EXPECT_TRUE(r.has("tokenizer.chat_template"));
    LoadedModel lm = load_model(r);
    EXPECT_EQ(lm.tokenizer->vocab_size(), 1024);
    const std::vector<int32_t> ends = lm.tokenizer->end_of_generation_ids();
    EXPECT_EQ(lm.tokenizer->token_bytes(lm.tokenizer->eos_id()), "<|im_end|>");
    EXPECT_NE(std::find(ends.begin(), ends.end(), lm.tokenizer->eos_id()), ends.end());
    if (std::string(arch) == "qwen3") {
      EXPECT_EQ(lm.model->config().head_dim, 128);  // not dim / heads
    }
    if (std::string(arch) == "qwen2") {
      EXPECT_TRUE(lm.model->config().qkv_bias);
    }
  }
}

// toy init writes one tensor at a time, each drawn as DecoderLM::init draws that parameter (its
// own stream of the seed), vectors then perturbed: the file holds exactly init's matrices.
TEST(CliInit, FilesAreDrawnAsTheModelsInit) {
  for (const char* arch : {"qwen3moe", "lfm2", "phi3"}) {
    SCOPED_TRACE(arch);
    const std::string path = temp(std::string("drawn_") + arch + ".gguf");
    const auto r = run_toy({"init", "--arch", arch, "--shape", "tiny", "--seed", "7", "--out", path});
    ASSERT_EQ(r.status, 0) << describe(r);
    LoadedModel lm = load_model(path);
    DecoderLM ref(lm.model->config());
    ref.init(7);
    int perturbed = 0;
    for (const Tensor& p : ref.params().values()) {
      const std::vector<float> want = p.to_f32_vector(), got = lm.model->params().get(p.name()).to_f32_vector();
      ASSERT_EQ(want.size(), got.size()) << p.name();
      double diff = 0;
      for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, double(std::fabs(want[i] - got[i])));
      if (p.ndim() >= 2 || p.name().starts_with("rope_")) {
        EXPECT_EQ(diff, 0.0) << p.name();
      } else {
        EXPECT_LT(diff, 0.6) << p.name();  // norms near 1, biases near 0
        perturbed += diff > 0;
      }
    }
    EXPECT_GT(perturbed, 0);
  }
}

TEST(CliInit, RefusesPairsThatDoNotExistAndListsTheValidOnes) {
  auto r = run_toy({"init", "--arch", "qwen2", "--shape", "smollm2-135m", "--out", temp("bad.gguf")});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("--arch llama   --shape smollm2-135m"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(temp("bad.gguf")));
  r = run_toy({"init", "--arch", "llama", "--shape", "tiny", "--type", "q3_k", "--out", temp("bad.gguf")});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("q4_k_m"), std::string::npos) << r.err;
  r = run_toy({"init", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--arch qwen3   --shape qwen3-0.6b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--arch gemma3  --shape gemma3-1b"), std::string::npos) << r.out;
  // A published-only architecture has no preset shape of another's.
  r = run_toy({"init", "--arch", "phi3", "--shape", "gemma3-270m", "--out", temp("bad.gguf")});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("is a gemma3 model, not phi3"), std::string::npos) << r.err;
}

// SmolLM2-135M's exact shape, as llama.cpp would quantize it to Q4_K: 576-wide rows fall back
// to Q5_0, 1536-wide ones (ffn_down) stay Q4_K, the tied embedding is the output (Q8_0: 576
// is not a multiple of 256), 1-D tensors stay F32.
TEST(CliInit, SmolLM2ShapeWithLlamaCppsFallbacks) {
  if (toy::test::under_asan()) GTEST_SKIP() << "a 135M-parameter model: too slow under the sanitizers";
  const std::string path = temp("smollm2_q4_k.gguf");
  const auto r = run_toy({"init", "--arch", "llama", "--shape", "smollm2-135m", "--type", "q4_k", "--out", path});
  ASSERT_EQ(r.status, 0) << describe(r);
  gguf::Reader g(path);
  EXPECT_EQ(g.get_u32("llama.block_count"), 30u);
  EXPECT_EQ(g.get_u32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(g.get_str("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(g.find_tensor("token_embd.weight")->shape, Shape({49152, 576}));
  EXPECT_EQ(g.find_tensor("token_embd.weight")->dtype, DType::Q8_0);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight")->dtype, DType::Q5_0);
  EXPECT_EQ(g.find_tensor("blk.7.ffn_down.weight")->dtype, DType::Q4_K);
  EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->dtype, DType::Q5_K);  // Q4_K_S: the first eighth
  EXPECT_EQ(g.find_tensor("blk.0.attn_norm.weight")->dtype, DType::F32);
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  fs::remove(path);
}

TEST(CliQuantize, ConvertsAndRefusesBadRequests) {
  const std::string in = init_tiny("qwen2");
  const std::string out = temp("qwen2_q8.gguf");
  auto r = run_toy({"quantize", in, out, "Q8_0"});
  ASSERT_EQ(r.status, 0) << describe(r);
  gguf::Reader g(out);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight")->dtype, DType::Q8_0);
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.bias")->dtype, DType::F32);
  EXPECT_EQ(g.get_u32("general.file_type"), 7u);
  // The same metadata otherwise: the tokenizer and template travel along.
  EXPECT_EQ(g.get_str("tokenizer.chat_template"), gguf::Reader(in).get_str("tokenizer.chat_template"));
  r = run_toy({"quantize", in, out, "q9_9"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown type"), std::string::npos) << r.err;
  r = run_toy({"quantize", in, in, "q8_0"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("is the input"), std::string::npos) << r.err;
  r = run_toy({"quantize", temp("missing.gguf"), out, "q8_0"});
  EXPECT_EQ(r.status, 1) << describe(r);
}

TEST(CliChat, OneTurnAndTheTemplateDecision) {
  const std::string m = init_tiny("qwen3");
  auto r = run_toy({"chat", "-m", m, "-p", "Hello", "-n", "5", "--temp", "0"});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err.find("no chat template"), std::string::npos) << r.err;
  // The same file without its template: ChatML, said on stderr. With a template of another
  // family: rendered by it. With one toy cannot parse: an error naming it.
  gguf::Reader g(m);
  for (const std::string variant : {"none", "mistral", "broken"}) {
    gguf::Writer w;
    for (const auto& [k, v] : g.metadata())
      if (k != "tokenizer.chat_template") w.set(k, v);
    if (variant == "mistral")
      w.set("tokenizer.chat_template",
            gguf::Value::str("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"));
    if (variant == "broken") w.set("tokenizer.chat_template", gguf::Value::str("{% for m in %}"));
    for (const auto& t : g.tensors()) w.add_tensor(t.name, g.tensor(t.name));
    const std::string path = temp("chat_" + variant + ".gguf");
    w.write(path);
    r = run_toy({"chat", "-m", path, "-p", "Hello", "-n", "3", "--temp", "0"});
    if (variant == "none") {
      EXPECT_EQ(r.status, 0) << describe(r);
      EXPECT_NE(r.err.find("no chat template; using ChatML"), std::string::npos) << r.err;
    } else if (variant == "mistral") {
      EXPECT_EQ(r.status, 0) << describe(r);
      EXPECT_EQ(r.err.find("ChatML"), std::string::npos) << r.err;
    } else {
      EXPECT_EQ(r.status, 1) << describe(r);
      EXPECT_NE(r.err.find("chat template of"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("line 1"), std::string::npos) << r.err;
      // --chat-template replaces the file's (broken) one.
      const std::string file = temp("chatml.jinja");
      { std::ofstream(file) << kChatMLTemplate; }
      r = run_toy({"chat", "-m", path, "--chat-template", file, "-p", "Hello", "-n", "3", "--temp", "0"});
      EXPECT_EQ(r.status, 0) << describe(r);
      // A template that refuses the conversation: its own message, exit 1.
      const std::string refuses = temp("refuses.jinja");
      { std::ofstream(refuses) << "{{ raise_exception('Conversation roles must alternate') }}"; }
      r = run_toy({"chat", "-m", m, "--chat-template", refuses, "-p", "Hello", "-n", "3"});
      EXPECT_EQ(r.status, 1) << describe(r);
      EXPECT_NE(r.err.find("Conversation roles must alternate"), std::string::npos) << r.err;
    }
  }
  // Interactive: lines from stdin are turns; /exit ends.
  const std::string in = temp("chat_in.txt");
  { std::ofstream(in) << "Hi\nHow are you?\n/exit\nnot read\n"; }
  toy::test::ProcOptions o;
  o.stdin_path = in;
  r = run_toy({"chat", "-m", m, "-n", "4", "--temp", "0"}, o);
  EXPECT_EQ(r.status, 0) << describe(r);
}

// The published architectures chat through their models' real templates (as their files carry
// them; Gemma 2's turn format is Gemma 3's, OLMoE's instruct model uses ChatML-like turns).
TEST(CliChat, PublishedArchitecturesChatThroughTheirRealTemplates) {
  const std::pair<const char*, const char*> pairs[] = {
      {"smollm3", "HuggingFaceTB-SmolLM3-3B.jinja"},       {"phi3", "microsoft-Phi-3.5-mini-instruct.jinja"},
      {"gemma3", "google-gemma-2-2b-it.jinja"},            {"qwen3moe", "Qwen-Qwen3-0.6B.jinja"},
      {"granitemoe", "ibm-granite-granite-3.3-2B-Instruct.jinja"}, {"lfm2", "LFM2.5-Instruct.jinja"},
      {"olmoe", "Qwen-Qwen2.5-7B-Instruct.jinja"}};
  for (const auto& [arch, file] : pairs) {
    SCOPED_TRACE(arch);
    const std::string tmpl = toy::test::shared_path(std::string("chat-templates/") + file);
    TOY_REQUIRE_FILE(tmpl);
    // (Gemma 2's template refuses a system turn; Gemma 3's folds it into the first user turn.)
    std::vector<std::string> args = {"chat", "-m", init_tiny(arch), "--chat-template", tmpl, "-p", "Hello", "-n", "4",
                                      "--temp", "0"};
    if (std::string(arch) != "gemma3") args.insert(args.end(), {"--system", "Be brief."});
    const auto r = run_toy(args);
    EXPECT_EQ(r.status, 0) << describe(r);
    EXPECT_FALSE(r.out.empty()) << describe(r);
  }
}

// A template with reasoning blocks: the thinking streams to stderr, only the answer to stdout
// (the same generated text as a template without the markers prints raw).
TEST(CliChat, ReasoningGoesToStderrTheAnswerToStdout) {
  const std::string m = init_tiny("qwen3");
  const std::string body =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n";
  const std::string thinking = temp("think.jinja"), plain = temp("plain_think.jinja");
  { std::ofstream(thinking) << "{# closes with </think> #}" << body; }
  { std::ofstream(plain) << body; }
  auto r = run_toy({"chat", "-m", m, "--chat-template", thinking, "-p", "Hello", "-n", "6", "--temp", "0"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto raw = run_toy({"chat", "-m", m, "--chat-template", plain, "-p", "Hello", "-n", "6", "--temp", "0"});
  ASSERT_EQ(raw.status, 0) << describe(raw);
  ASSERT_FALSE(raw.out.empty());
  EXPECT_EQ(r.out, "") << "the reasoning never closed: no answer on stdout";
  const size_t at = r.err.find("[thinking] ");
  ASSERT_NE(at, std::string::npos) << r.err;
  std::string reasoning = r.err.substr(at + 11);
  auto trim = [](std::string x) {
    while (!x.empty() && std::isspace(static_cast<unsigned char>(x.back()))) x.pop_back();
    while (!x.empty() && std::isspace(static_cast<unsigned char>(x.front()))) x.erase(0, 1);
    return x;
  };
  EXPECT_EQ(trim(reasoning), trim(raw.out));
}

TEST(CliPerplexity, JsonShapeAndTooShortText) {
  const std::string m = init_tiny("llama");
  const std::string text = temp("ppl.txt");
  { std::ofstream(text) << std::string(4000, 'a'); }
  auto r = run_toy({"perplexity", "-m", m, "-f", text, "--ctx", "32", "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["ppl"].get<double>(), 1.0);
  EXPECT_EQ(j["tokens"].get<int64_t>(), j["chunks"].get<int64_t>() * (32 - 1 - 16));
  r = run_toy({"perplexity", "-m", m, "-f", text, "--ctx", "100000", "--json"});
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("needs at least"), std::string::npos) << r.err;
}

TEST(CliBench, RunReportsTheInterfaceFields) {
  const std::string m = init_tiny("llama", "q8_0");
  const auto r = run_toy({"bench", "run", "-m", m, "--threads", "1", "--reps", "1", "-p", "16", "-n", "4", "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"pp_tokens_per_s", "tg_tokens_per_s", "bandwidth_gbs", "tg_bandwidth_fraction"})
    EXPECT_GT(j.at(k).get<double>(), 0.0) << k;
}

TEST(CliBench, RunTimesGenerationAtTheDepthsAsked) {
  const std::string m = init_tiny("qwen3", "q8_0");
  const auto r = run_toy({"bench", "run", "-m", m, "--threads", "1", "--reps", "1", "-p", "8", "-n", "4", "--depths",
                          "0,40", "--json"});
  ASSERT_EQ(r.status, 0) << describe(r);
  const auto rows = nlohmann::json::parse(r.out).at("tg_by_depth");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].at("depth").get<int64_t>(), 0);
  EXPECT_EQ(rows[1].at("depth").get<int64_t>(), 40);
  EXPECT_GT(rows[1].at("tg_tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(rows[1].at("kv_read_ms_per_token").get<double>(), 0.0);  // 40 positions of cache to read
  EXPECT_EQ(rows[0].at("kv_read_ms_per_token").get<double>(), 0.0);
  EXPECT_NE(run_toy({"bench", "run", "-m", m, "--depths", "-1"}).status, 0);
}

// TOY_CPU picks the CPU kernel variant (issue 27): every benchmark line names it; forcing the
// AVX2 forms gives a quantized model's decoding logits (a few rows: integer products in every
// form) bit for bit as the default variant does (exact integer sums, the same float steps);
// a value toy does not know is refused by name, before anything runs.
TEST(CliBench, KernelVariantIsNamedForcedAndGivesTheSameNumbers) {
  for (const char* type : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    const std::string m = init_tiny("llama", type);
    auto r = run_toy({"bench", "run", "-m", m, "--threads", "1", "--reps", "1", "-p", "16", "-n", "4", "--json"},
                     ProcOptions{{"TOY_CPU=avx2"}});
    ASSERT_EQ(r.status, 0) << describe(r);
    EXPECT_EQ(nlohmann::json::parse(r.out).at("kernel_variant"), "avx2");
    // (The AVX2 forms multiply BF16 operands as their f32 widenings, whatever the CPU has.)
    EXPECT_EQ(nlohmann::json::parse(r.out).at("bf16_products"), "widened to f32 (SGEMM)");
    r = run_toy({"bench", "run", "-m", m, "--threads", "1", "--reps", "1", "-p", "16", "-n", "4", "--json"},
                ProcOptions{{"TOY_CPU=avx512"}});
    if (r.status == 0)
      EXPECT_EQ(nlohmann::json::parse(r.out).at("kernel_variant"), "avx512");
    else
      EXPECT_NE(r.err.find("TOY_CPU=avx512, but this CPU lacks AVX-512"), std::string::npos) << describe(r);
    // 7 tokens: the few-row path (pairs and a lone row on 512 bits), the logits of every
    // position, under each variant.
    std::string ids;
    for (int i = 0; i < 7; ++i) ids += (i ? "," : "") + std::to_string((i * 53 + 11) % 250);
    const std::string want = temp(std::string("variant_default_") + type + ".bin");
    const std::string avx2 = temp(std::string("variant_avx2_") + type + ".bin");
    r = run_toy({"eval", "-m", m, "--tokens", ids, "--dump-logits", want});
    ASSERT_EQ(r.status, 0) << describe(r);
    r = run_toy({"eval", "-m", m, "--tokens", ids, "--dump-logits", avx2}, ProcOptions{{"TOY_CPU=avx2"}});
    ASSERT_EQ(r.status, 0) << describe(r);
    const std::string a = read_all(want), b = read_all(avx2);
    ASSERT_GT(a.size(), 7u * 4);
    EXPECT_TRUE(a == b) << "the forced AVX2 forms give other logits than the default variant";
  }
  const auto bad = run_toy({"eval", "-m", init_tiny("llama", "q8_0"), "--tokens", "1,2"}, ProcOptions{{"TOY_CPU=sse9"}});
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("TOY_CPU='sse9': expected avx2 or avx512"), std::string::npos) << describe(bad);
}
