// `toy finetune` against numbers computed here, not against another run of itself: an adapter
// at scale 1 in eval/generate is the merged model; packed rows of records exactly ctx + 1
// tokens long; truncation keeps the first tokens and their mask; BF16/F16 really compute in
// their type, and F16 skips an overflowing step and halves the scale; an adapter without
// alpha; --lora-targets; --train-embeddings; steps from --epochs with --accum; the warmup +
// cosine schedule; the "best" checkpoint of the final evaluation; the loss and gradient norm
// of step 1 against the model API (with accumulation and F16 loss scaling).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "finetune/finetune_helpers.h"
#include "proc.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/data/sft.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/lora.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune.h"

using namespace toy;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string temp(const std::string& name) { return toy::test::process_temp("toy_ftg_", name); }

// A tiny qwen2 file from `toy init` (tied head, vocabulary of 1024 byte-level BPE tokens, no
// BOS, EOS <|im_end|>): each digit is one token, so a record of P prompt digits and C
// completion digits is P + C + 1 tokens.
const std::string& tiny_model() { return toy::test::tiny_qwen2_model(); }

// n digits from a 32-bit LCG.
std::string digits(uint32_t& x, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    s += char('0' + (x >> 16) % 10);
  }
  return s;
}

// n prompt/completion records of plen and clen digits.
std::string write_digits(const std::string& name, int n, uint32_t seed, int plen, int clen) {
  const std::string path = temp(name);
  std::ofstream f(path);
  uint32_t x = seed;
  for (int i = 0; i < n; ++i) {
    const std::string p = digits(x, plen), c = digits(x, clen);
    f << json({{"prompt", p}, {"completion", c}}).dump() << "\n";
  }
  return path;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// The events of one kind ("step", "eval", ...) of a run folder, in order; all of them when
// kind is empty.
std::vector<json> events_of(const std::string& dir, const std::string& kind = "") {
  std::vector<json> out;
  for (const std::string& line : lines_of(dir + "/events.jsonl")) {
    json j = json::parse(line);
    if (kind.empty() || j["event"] == kind) out.push_back(j);
  }
  return out;
}

json state_of(const std::string& dir) {
  return json::parse(gguf::Reader(dir + "/checkpoint.gguf").get_str("toy.finetune.state"));
}

FinetuneOptions options(const std::string& data, const std::string& out) {
  FinetuneOptions o;
  o.model = tiny_model(), o.data = data, o.out = temp(out);
  o.quiet = true, o.force = true, o.val_fraction = 0;
  return o;
}

std::vector<float> floats_of(const std::string& path) {
  const std::string bytes = toy::test::read_all(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, double(std::fabs(v)));
  return m;
}

// The mean loss of one example under m (the loss the loop reports for a batch of copies).
double example_loss(DecoderLM& m, const SftExample& e) {
  Tensor ids, targets;
  make_sft_batch({&e}, m.config().vocab, ids, targets);
  NoGradGuard ng;
  return m.loss(ids, targets).item();
}

}  // namespace

// ---- 1. --lora at scale 1 in eval and generate --------------------------------------------------

// The adapter applied at load (scale 1: alpha / rank as trained) computes what the merged F32
// model.gguf of the same run computes — in `toy eval --dump-logits` and in greedy
// `toy generate` — and not what the base computes.
TEST(FinetuneGaps, LoraFlagAtScaleOneIsTheMergedModelInEvalAndGenerate) {
  using toy::test::describe;
  using toy::test::run_toy;
  const std::string data = write_digits("cli.jsonl", 40, 1, 8, 8), out = temp("cli_run");
  const auto ft = run_toy({"finetune", "-m", tiny_model(), "--data", data, "--method", "lora", "--steps", "6",
                           "--batch", "2", "--lora-rank", "2", "--lr", "5e-2", "--merge-type", "f32", "--out", out,
                           "--force", "--quiet"});
  ASSERT_EQ(ft.status, 0) << describe(ft);
  const std::string adapter = out + "/adapter.gguf", merged = out + "/model.gguf";

  auto eval = [&](const std::string& model, const std::vector<std::string>& extra, const std::string& name) {
    const std::string dump = temp(name);
    std::vector<std::string> a = {"eval", "-m", model, "--tokens", "49,50,51,52,32,53,54,55", "--dump-logits", dump};
    a.insert(a.end(), extra.begin(), extra.end());
    const auto r = run_toy(a);
    EXPECT_EQ(r.status, 0) << describe(r);
    return floats_of(dump);
  };
  const std::vector<float> base = eval(tiny_model(), {}, "base.bin");
  const std::vector<float> with = eval(tiny_model(), {"--lora", adapter}, "with.bin");
  const std::vector<float> folded = eval(merged, {}, "merged.bin");
  ASSERT_EQ(base.size(), size_t(8 * 1024));
  ASSERT_EQ(with.size(), base.size());
  ASSERT_EQ(folded.size(), base.size());
  const double magnitude = std::max(1.0, max_abs(folded));
  EXPECT_LE(max_abs_diff(with, folded), 1e-3 * magnitude) << "base + --lora must compute what the merged model computes";
  EXPECT_GT(max_abs_diff(with, base), 0.1) << "the adapter changes the logits (it trained at lr 5e-2)";

  auto generate = [&](const std::string& model, const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"generate", "-m", model, "-p", "1234", "-n", "8", "--temp", "0", "--quiet"};
    a.insert(a.end(), extra.begin(), extra.end());
    const auto r = run_toy(a);
    EXPECT_EQ(r.status, 0) << describe(r);
    return r.out;
  };
  const std::string text_base = generate(tiny_model(), {}), text_with = generate(tiny_model(), {"--lora", adapter}),
                    text_merged = generate(merged, {});
  EXPECT_EQ(text_with, text_merged);
  EXPECT_NE(text_merged, text_base) << "the adapter changes this greedy text";
  EXPECT_FALSE(text_with.empty());
}

// ---- 2. packing and truncation ------------------------------------------------------------------

// Records exactly ctx + 1 tokens long (ctx inputs: a row's worth) each fill one packed row:
// no row is empty (an off-by-one in "does it fit" would leave every row empty) and one
// epoch trains every record once. With a learning rate of 1e-9 the adapters stay at B ≈ 0,
// so each step's loss is the base model's loss of the record in its row, computed here.
TEST(FinetuneGaps, PackedRowsTakeRecordsOfExactlyCtxPlusOneTokens) {
  const std::string data = write_digits("pack.jsonl", 6, 3, 8, 8);
  LoadedModel lm = load_model(tiny_model());
  std::vector<double> want;
  for (const std::string& line : lines_of(data)) {
    const SftExample e = parse_sft_record(line, *lm.tokenizer, nullptr, "x");
    ASSERT_EQ(e.tokens.size(), 17u) << line;  // 8 + 8 digits + EOS
    want.push_back(example_loss(*lm.model, e));
  }
  ASSERT_EQ(want.size(), 6u);
  FinetuneOptions o = options(data, "pack_run");
  o.method = "lora", o.lora_rank = 2, o.pack = true, o.ctx = 16, o.batch = 1, o.lr = 1e-9f;
  const FinetuneResult r = finetune(o);
  EXPECT_EQ(r.steps, 6) << "one epoch: 6 records x 16 inputs in rows of 16";
  std::vector<double> got;
  for (const json& s : events_of(o.out, "step")) got.push_back(s["loss"].is_number() ? s["loss"].get<double>() : NAN);
  ASSERT_EQ(got.size(), 6u);
  for (double l : got) EXPECT_TRUE(std::isfinite(l)) << "a packed row without a counted token";
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << "record " << i;
  EXPECT_EQ(state_of(o.out)["tokens"], 6 * 16) << "every row holds one whole record";
}

// A record longer than ctx + 1 tokens keeps its first ctx + 1 tokens and their mask (the
// same length); one of exactly ctx + 1 is not truncated; one whose cut leaves no counted
// target is dropped; one whose cut leaves a single counted target stays.
TEST(FinetuneGaps, TruncationKeepsTheFirstTokensAndTheirMask) {
  LoadedModel lm = load_model(tiny_model());
  const Tokenizer& tok = *lm.tokenizer;
  uint32_t x = 11;
  struct Rec {
    std::string prompt, completion;
  };
  const std::vector<Rec> recs = {{digits(x, 10), digits(x, 20)},   // 31 tokens: cut inside the completion
                                 {digits(x, 8), digits(x, 8)},     // 17: exactly ctx + 1
                                 {digits(x, 8), digits(x, 9)},     // 18: the EOS cut
                                 {digits(x, 16), digits(x, 3)},    // 20: one completion token left
                                 {digits(x, 17), digits(x, 3)}};   // 21: only prompt left: dropped
  const std::string path = temp("trunc.jsonl");
  {
    std::ofstream f(path);
    for (const Rec& r : recs) f << json({{"prompt", r.prompt}, {"completion", r.completion}}).dump() << "\n";
  }
  const int64_t ctx = 16;
  const SftData d = read_sft_data(path, tok, nullptr, ctx);
  EXPECT_EQ(d.truncated, 4);
  EXPECT_EQ(d.dropped, 1);
  ASSERT_EQ(d.examples.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    // The expectation from the pieces' tokenization: prompt (not counted), completion and
    // EOS (counted), cut to the first ctx + 1.
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    for (int32_t id : tok.encode(recs[i].prompt)) ids.push_back(id), mask.push_back(0);
    for (int32_t id : tok.encode(recs[i].completion)) ids.push_back(id), mask.push_back(1);
    ids.push_back(tok.eos_id()), mask.push_back(1);
    ASSERT_EQ(ids.size(), recs[i].prompt.size() + recs[i].completion.size() + 1) << "one token per digit";
    if (ids.size() > size_t(ctx + 1)) ids.resize(size_t(ctx + 1)), mask.resize(size_t(ctx + 1));
    const SftExample& e = d.examples[i];
    EXPECT_EQ(e.line, int64_t(i + 1));
    EXPECT_EQ(e.tokens.size(), e.trained.size());
    EXPECT_EQ(e.tokens, ids);
    EXPECT_EQ(e.trained, mask);
  }
  EXPECT_EQ(d.examples[1].tokens.back(), tok.eos_id()) << "a record of exactly ctx + 1 tokens keeps its EOS";
  EXPECT_EQ(std::count(d.examples[3].trained.begin(), d.examples[3].trained.end(), uint8_t(1)), 1);
}

// ---- 3. mixed precision -------------------------------------------------------------------------

// BF16 and F16 compute in their type: step 1's loss (the forward of the same weights on the
// same batch) differs from F32's — by more than rounding noise of the F32 result, far less
// than 0.1% — full (the trained projections' products rounded) and LoRA (the frozen F32 base
// stored in that type). A normal run skips no step and leaves the F16 loss scale where it
// started (65536).
TEST(FinetuneGaps, MixedPrecisionComputesInItsTypeAndSkipsNothing) {
  const std::string data = write_digits("mixed.jsonl", 20, 7, 8, 8);
  for (const char* method : {"full", "lora"}) {
    SCOPED_TRACE(method);
    double loss[3] = {0, 0, 0}, norm[3] = {0, 0, 0};
    const char* precisions[3] = {"f32", "bf16", "f16"};
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(precisions[k]);
      FinetuneOptions o = options(data, std::string("mixed_") + method + "_" + precisions[k]);
      o.method = method, o.lora_rank = 4, o.precision = precisions[k], o.steps = 2, o.batch = 2;
      const FinetuneResult r = finetune(o);
      EXPECT_EQ(r.skipped_steps, 0);
      const json st = state_of(o.out);
      EXPECT_EQ(st["skipped_steps"], 0);
      if (k == 2) {
        EXPECT_EQ(st["loss_scale"].get<double>(), 65536.0) << "no overflow: the scale is not halved";
      }
      const std::vector<json> steps = events_of(o.out, "step");
      ASSERT_EQ(steps.size(), 2u);
      loss[k] = steps[0]["loss"].get<double>();
      norm[k] = steps[0]["grad_norm"].get<double>();
      for (const json& e : events_of(o.out, "run_end")) EXPECT_EQ(e["skipped_steps"], 0);
      EXPECT_TRUE(events_of(o.out, "skipped_step").empty());
    }
    for (int k = 1; k < 3; ++k) {
      const double d = std::fabs(loss[k] - loss[0]);
      EXPECT_GT(d, 2e-7 * loss[0]) << precisions[k] << " computed step 1's loss in F32 (" << loss[k] << ")";
      EXPECT_LT(d, 1e-3 * loss[0]) << precisions[k];
      EXPECT_LT(std::fabs(norm[k] - norm[0]), 1e-2 * norm[0]) << precisions[k];
      if (std::string(method) == "full") {
        EXPECT_GT(std::fabs(norm[k] - norm[0]), 1e-6 * norm[0]) << precisions[k] << ": the same gradient as F32";
      }
    }
    std::printf("%s step 1: loss f32 %.9g bf16 %.9g f16 %.9g; grad norm %.9g %.9g %.9g\n", method, loss[0], loss[1],
                loss[2], norm[0], norm[1], norm[2]);
  }
}

// F16's skip-and-halve: an initial loss scale of 2^126 makes the scaled gradients overflow
// F32 (the base's final norm is scaled by 1e4, so its gradients reach ~1e2), so each step is
// skipped — nothing applied — and the scale halves: 2^126, 2^125, 2^124, ending at 2^123.
TEST(FinetuneGaps, F16OverflowSkipsTheStepAndHalvesTheScale) {
  const std::string base = temp("big_norm.gguf");
  {
    gguf::Reader r(tiny_model());
    gguf::Writer w;
    for (const auto& [key, value] : r.metadata()) w.set(key, value);
    NoGradGuard ng;
    for (const gguf::TensorInfo& t : r.tensors()) {
      const Tensor v = r.tensor(t.name);
      w.add_tensor(t.name, t.name == "output_norm.weight" ? scale(v, 1e4f) : v);
    }
    w.write(base);
  }
  FinetuneOptions o = options(write_digits("overflow.jsonl", 20, 5, 8, 8), "overflow_run");
  o.model = base, o.method = "full", o.precision = "f16", o.loss_scale = std::ldexp(1.0f, 126);
  o.steps = 3, o.batch = 2, o.lr = 1e-3f, o.merge_type = "f32";
  const FinetuneResult r = finetune(o);
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.skipped_steps, 3);
  const std::vector<json> skipped = events_of(o.out, "skipped_step");
  ASSERT_EQ(skipped.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(skipped[i]["step"], int(i + 1));
    EXPECT_EQ(skipped[i]["loss_scale"].get<double>(), std::ldexp(1.0, 126 - int(i))) << "step " << i + 1;
  }
  const json st = state_of(o.out);
  EXPECT_EQ(st["loss_scale"].get<double>(), std::ldexp(1.0, 123));
  EXPECT_EQ(st["skipped_steps"], 3);
  EXPECT_EQ(st["optimizer_steps"], 0) << "a skipped step applies nothing";
  const std::vector<json> end = events_of(o.out, "run_end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["skipped_steps"], 3);
  gguf::Reader b(base), m(o.out + "/model.gguf");
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.0.attn_norm.weight"})
    EXPECT_EQ(m.tensor(name).to_f32_vector(), b.tensor(name).to_f32_vector()) << name << ": no step was applied";
}

// ---- 4. LoRA details, schedule, accumulation ---------------------------------------------------

// An adapter file without adapter.lora.alpha is applied at the user's scale S alone (whatever
// its rank: "alpha 0 means S alone", as llama.cpp); with alpha, at S x alpha / rank. Checked
// on the scale and against a model whose weights are W + s B A, computed here.
TEST(FinetuneGaps, AnAdapterWithoutAlphaIsAppliedAtTheUserScaleAlone) {
  ModelConfig c = ModelConfig::from_preset("llama");
  c.vocab = 40, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ctx = 16, c.ffn = 64;
  auto fresh = [&] {
    auto m = std::make_unique<DecoderLM>(c);
    m->init(3);
    return m;
  };
  Generator g1(5, 1), g2(5, 2), g3(5, 3), g4(5, 4);
  // Rank 2 on blk.0.attn_q [32, 32], rank 3 on blk.1.ffn_down [32, 64].
  const Tensor qa = randn(Shape{2, 32}, g1, 0.0f, 0.3f), qb = randn(Shape{32, 2}, g2, 0.0f, 0.3f);
  const Tensor da = randn(Shape{3, 64}, g3, 0.0f, 0.3f), db = randn(Shape{32, 3}, g4, 0.0f, 0.3f);
  auto write_adapter = [&](const std::string& path, std::optional<float> alpha) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    w.set("general.type", gguf::Value::str("adapter"));
    w.set("adapter.type", gguf::Value::str("lora"));
    if (alpha) w.set("adapter.lora.alpha", gguf::Value::f32(*alpha));
    w.add_tensor("blk.0.attn_q.weight.lora_a", qa);
    w.add_tensor("blk.0.attn_q.weight.lora_b", qb);
    w.add_tensor("blk.1.ffn_down.weight.lora_a", da);
    w.add_tensor("blk.1.ffn_down.weight.lora_b", db);
    w.write(path);
    return path;
  };
  std::vector<int32_t> id_values;
  for (int i = 0; i < 12; ++i) id_values.push_back(int32_t((i * 11 + 5) % 40));
  const Tensor ids = from_vector(id_values, Shape{1, 12});
  const auto base = fresh();
  // The model with W <- W + s B A for both adapted weights.
  auto expected_logits = [&](float q_scale, float d_scale) {
    NoGradGuard ng;
    DecoderLM m(c, [&](const std::string& name, const Shape&) -> Tensor {
      const Tensor w = base->params().get(name).detach();
      if (name == "blk.0.attn_q.weight") return add(w, scale(matmul(qb, qa), q_scale));
      if (name == "blk.1.ffn_down.weight") return add(w, scale(matmul(db, da), d_scale));
      return w;
    });
    return m.logits(ids).to_f32_vector();
  };
  struct Case {
    std::optional<float> alpha;
    float user, q_scale, d_scale;
  };
  for (const Case& k : std::vector<Case>{{std::nullopt, 1.0f, 1.0f, 1.0f},
                                         {std::nullopt, 0.5f, 0.5f, 0.5f},
                                         {6.0f, 1.0f, 3.0f, 2.0f}}) {
    SCOPED_TRACE(testing::Message() << "alpha " << (k.alpha ? std::to_string(*k.alpha) : "(none)") << ", scale "
                                    << k.user);
    const std::string path = write_adapter(temp("adapter.gguf"), k.alpha);
    auto m = fresh();
    load_lora_adapter(*m, "llama", path, k.user);
    const auto adapters = lora_adapters(*m);
    ASSERT_EQ(adapters.size(), 2u);
    EXPECT_EQ(adapters[0].first, "blk.0.attn_q.weight");
    EXPECT_FLOAT_EQ(adapters[0].second->scale, k.q_scale);
    EXPECT_EQ(adapters[1].first, "blk.1.ffn_down.weight");
    EXPECT_FLOAT_EQ(adapters[1].second->scale, k.d_scale);
    NoGradGuard ng;
    const std::vector<float> got = m->logits(ids).to_f32_vector(), want = expected_logits(k.q_scale, k.d_scale);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(max_abs_diff(got, want), 1e-5 * std::max(1.0, max_abs(want)));
    const std::vector<float> plain = base->logits(ids).to_f32_vector();
    EXPECT_GT(max_abs_diff(got, plain), 1e-3) << "the adapter is applied";
  }
}

// --lora-targets q,down: adapters on attn_q and ffn_down alone — in adapter.gguf, in the
// count of trained parameters (rank x (in + out) per adapted weight), and in the merged
// model (the other projections are the base's bit for bit).
TEST(FinetuneGaps, LoraTargetsRestrictTheAdapters) {
  FinetuneOptions o = options(write_digits("targets.jsonl", 20, 9, 8, 8), "targets_run");
  o.method = "lora", o.lora_rank = 2, o.lora_targets = "q,down", o.steps = 3, o.batch = 2, o.lr = 1e-2f;
  o.merge_type = "f32";
  const FinetuneResult r = finetune(o);
  gguf::Reader base(tiny_model()), adapter(o.out + "/adapter.gguf"), merged(o.out + "/model.gguf");
  std::set<std::string> got, want;
  for (const gguf::TensorInfo& t : adapter.tensors()) got.insert(t.name);
  int64_t params = 0;
  for (const char* layer : {"blk.0.", "blk.1."})
    for (const char* kind : {"attn_q", "ffn_down"}) {
      const std::string w = std::string(layer) + kind + ".weight";
      want.insert(w + ".lora_a"), want.insert(w + ".lora_b");
      const Shape s = base.find_tensor(w)->shape;
      params += 2 * (s[0] + s[1]);
      EXPECT_EQ(adapter.find_tensor(w + ".lora_a")->shape, (Shape{2, s[1]})) << w;
    }
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.trainable_params, params);
  for (const char* name : {"blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                           "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight"})
    EXPECT_EQ(merged.tensor(name).to_f32_vector(), base.tensor(name).to_f32_vector()) << name;
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"})
    EXPECT_NE(merged.tensor(name).to_f32_vector(), base.tensor(name).to_f32_vector()) << name;
}

// --train-embeddings (full): the token table and the final norm train too (the tied head with
// them); without it they are the base's bit for bit. The trained parameters: every tensor of
// the base file, or the blocks' alone.
TEST(FinetuneGaps, TrainEmbeddingsTrainsTheTokenTableOnlyWhenAsked) {
  const std::string data = write_digits("embd.jsonl", 20, 13, 8, 8);
  gguf::Reader base(tiny_model());
  int64_t all = 0, blocks = 0;
  for (const gguf::TensorInfo& t : base.tensors()) {
    all += t.shape.numel();
    if (t.name.rfind("blk.", 0) == 0) blocks += t.shape.numel();
  }
  for (bool embeddings : {false, true}) {
    SCOPED_TRACE(embeddings ? "--train-embeddings" : "blocks only");
    FinetuneOptions o = options(data, embeddings ? "embd_on" : "embd_off");
    o.method = "full", o.train_embeddings = embeddings, o.steps = 2, o.batch = 2, o.lr = 1e-2f;
    const FinetuneResult r = finetune(o);
    EXPECT_EQ(r.trainable_params, embeddings ? all : blocks);
    gguf::Reader m(o.out + "/model.gguf");
    for (const char* name : {"token_embd.weight", "output_norm.weight"}) {
      const bool same = m.tensor(name).to_f32_vector() == base.tensor(name).to_f32_vector();
      EXPECT_EQ(same, !embeddings) << name << (embeddings ? " did not train" : " trained without --train-embeddings");
    }
    EXPECT_NE(m.tensor("blk.0.ffn_up.weight").to_f32_vector(), base.tensor("blk.0.ffn_up.weight").to_f32_vector());
  }
}

// Steps from --epochs: ceil(epochs x examples / (batch x accum)) — 20 examples, batch 3,
// accum 2, 2.5 epochs: ceil(8.33) = 9 — and each step draws batch x accum examples: the epoch
// each step ends in, and the tokens trained (16 inputs per record), follow.
TEST(FinetuneGaps, EpochsWithAccumulationGiveCeilSteps) {
  FinetuneOptions o = options(write_digits("epochs.jsonl", 20, 17, 8, 8), "epochs_run");
  o.method = "lora", o.lora_rank = 2, o.batch = 3, o.accum = 2, o.epochs = 2.5, o.lr = 1e-3f;
  const FinetuneResult r = finetune(o);
  const int64_t per_step = 3 * 2;
  const int64_t want_steps = (50 + per_step - 1) / per_step;  // ceil(2.5 x 20 / 6)
  ASSERT_EQ(want_steps, 9);
  EXPECT_EQ(r.steps, want_steps);
  const std::vector<json> steps = events_of(o.out, "step");
  ASSERT_EQ(steps.size(), size_t(want_steps));
  for (int64_t k = 1; k <= want_steps; ++k)
    EXPECT_EQ(steps[size_t(k - 1)]["epoch"], (k * per_step - 1) / 20) << "step " << k;
  EXPECT_EQ(state_of(o.out)["tokens"], want_steps * per_step * 16);
}

// The learning rate of each step in events.jsonl: linear warmup (s + 1) / (warmup + 1) x lr
// for s < warmup, then cosine from lr to min_lr (default lr / 10) over the remaining steps
// (s counting from 0) — computed here.
TEST(FinetuneGaps, WarmupAndCosineScheduleInEvents) {
  FinetuneOptions o = options(write_digits("sched.jsonl", 20, 19, 8, 8), "sched_run");
  o.method = "lora", o.lora_rank = 2, o.steps = 10, o.warmup = 3, o.lr = 1e-3f, o.batch = 1;
  finetune(o);
  const std::vector<json> steps = events_of(o.out, "step");
  ASSERT_EQ(steps.size(), 10u);
  const double lr = 1e-3, min_lr = lr / 10, pi = std::acos(-1.0);
  for (int s = 0; s < 10; ++s) {
    const double want = s < 3 ? lr * (s + 1) / 4.0 : min_lr + 0.5 * (1 + std::cos(pi * (s - 3) / 7.0)) * (lr - min_lr);
    EXPECT_NEAR(steps[size_t(s)]["lr"].get<double>(), want, 1e-6 * want) << "step " << s + 1;
    EXPECT_EQ(steps[size_t(s)]["step"], s + 1);
  }
  EXPECT_NEAR(steps[3]["lr"].get<double>(), lr, 1e-9) << "the peak right after the warmup";
}

// With validation only at the end, the final evaluation is the best: a "best" checkpoint
// follows it, and checkpoint.gguf records that step as the best with the weights it holds.
TEST(FinetuneGaps, FinalEvaluationBestIsCheckpointed) {
  FinetuneOptions o = options(write_digits("best.jsonl", 20, 23, 8, 8), "best_run");
  o.method = "lora", o.lora_rank = 2, o.steps = 3, o.batch = 2, o.lr = 1e-3f, o.val_fraction = 0.2;
  const FinetuneResult r = finetune(o);
  EXPECT_EQ(r.best_step, 3);
  EXPECT_EQ(r.model, "last");
  const std::vector<json> all = events_of(o.out);
  ptrdiff_t eval_at = -1, best_at = -1;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]["event"] == "eval") eval_at = ptrdiff_t(i);
    if (all[i]["event"] == "checkpoint" && all[i]["reason"] == "best") {
      best_at = ptrdiff_t(i);
      EXPECT_EQ(all[i]["step"], 3);
    }
  }
  ASSERT_GE(eval_at, 0);
  EXPECT_GT(best_at, eval_at) << "no checkpoint after the final evaluation found the best weights";
  const json st = state_of(o.out);
  EXPECT_EQ(st["best_step"], 3);
  EXPECT_NEAR(st["best_val_loss"].get<double>(), r.val_loss, 1e-12);
  gguf::Reader ck(o.out + "/checkpoint.gguf");
  int params = 0;
  for (const gguf::TensorInfo& t : ck.tensors()) {
    if (t.name.rfind("param.", 0) != 0) continue;
    ++params;
    const std::string best = "best." + t.name.substr(6);
    ASSERT_NE(ck.find_tensor(best), nullptr) << best;
    EXPECT_EQ(ck.tensor(best).to_f32_vector(), ck.tensor(t.name).to_f32_vector()) << best;
  }
  EXPECT_EQ(params, 2 * 7 * 2) << "A and B of 7 projections in 2 layers";
}

// ---- 5. against the model API -------------------------------------------------------------------

// Step 1 of a LoRA run on copies of one record — batch 2, 3 micro-batches accumulated —
// reports the loss of that record and the norm of the gradient of that loss with respect to
// the adapters (A as add_lora draws it from the run's seed, B = 0), both computed here with
// the model API. In F16 (loss scaled by 65536, then unscaled) the same, to F16's rounding.
TEST(FinetuneGaps, StepOneLossAndGradientNormMatchTheModelApi) {
  const std::string data = temp("same.jsonl");
  const std::string record = R"({"prompt": "12345678", "completion": "87654321"})";
  {
    std::ofstream f(data);
    for (int i = 0; i < 12; ++i) f << record << "\n";
  }
  LoadedModel lm = load_model(tiny_model());
  const SftExample e = parse_sft_record(record, *lm.tokenizer, nullptr, "x");
  ASSERT_EQ(e.tokens.size(), 17u);
  LoraOptions lo;
  lo.rank = 4, lo.alpha = 8, lo.seed = 1337;
  add_lora(*lm.model, lo);
  Tensor ids, targets;
  make_sft_batch({&e}, lm.model->config().vocab, ids, targets);
  Tensor loss = lm.model->loss(ids, targets);
  const double want_loss = loss.item();
  backward(loss);
  double sq = 0;
  int with_grad = 0;
  for (Param& p : lm.model->params().all()) {
    if (!p.value.grad().defined()) continue;
    ++with_grad;
    for (float v : p.value.grad().to_f32_vector()) sq += double(v) * double(v);
  }
  ASSERT_GT(with_grad, 0);
  const double want_norm = std::sqrt(sq);
  ASSERT_GT(want_norm, 0);
  for (const char* precision : {"f32", "f16"}) {
    SCOPED_TRACE(precision);
    FinetuneOptions o = options(data, std::string("api_") + precision);
    o.method = "lora", o.lora_rank = 4, o.lora_alpha = 8, o.seed = 1337, o.batch = 2, o.accum = 3, o.steps = 1;
    o.precision = precision, o.lr = 1e-3f;
    finetune(o);
    const std::vector<json> steps = events_of(o.out, "step");
    ASSERT_EQ(steps.size(), 1u);
    const double tol = std::string(precision) == "f32" ? 1e-5 : 1e-3;
    EXPECT_NEAR(steps[0]["loss"].get<double>(), want_loss, tol * want_loss);
    EXPECT_NEAR(steps[0]["grad_norm"].get<double>(), want_norm, 10 * tol * want_norm)
        << "the accumulated (and unscaled) gradient is the gradient of the mean loss";
  }
}
