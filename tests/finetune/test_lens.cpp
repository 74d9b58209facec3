// The projection lens (`toy finetune --donor-embeddings`): a donor's token table, frozen,
// through a trainable projection; folded into token_embd for the saved model. (Learning with
// it: test_finetune_e2e; llama.cpp running the folded model: test_llamacpp.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/io/gguf.h"
#include "toy/io/model_file.h"
#include "toy/models/decoder_lm.h"
#include "toy/ops/ops.h"
#include "toy/train/finetune.h"

using namespace toy;
namespace fs = std::filesystem;

namespace {

std::string temp(const std::string& name) {
  return (fs::path(::testing::TempDir()) / ("toy_lens_" + std::to_string(getpid()) + "_" + name)).string();
}

std::string init_model(const std::string& arch) {
  const std::string p = temp(arch + ".gguf");
  const auto r = toy::test::run_toy({"init", "--arch", arch, "--shape", "tiny", "--seed", "7", "--out", p});
  EXPECT_EQ(r.status, 0) << r.err;
  return p;
}

ModelConfig lens_config() {
  ModelConfig c = ModelConfig::from_preset("llama");
  c.vocab = 40, c.dim = 16, c.layers = 1, c.heads = 2, c.kv_heads = 2, c.ctx = 16;
  c.lens_dim = 24, c.tied = false;
  return c;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace

TEST(Lens, DeclaresTheDonorTableAndAProjectionAndNeedsAnUntiedHead) {
  DecoderLM m(lens_config());
  EXPECT_EQ(m.params().get("token_embd.weight").shape(), (Shape{40, 24}));
  EXPECT_EQ(m.params().get("token_embd_proj.weight").shape(), (Shape{16, 24}));
  EXPECT_TRUE(m.params().has("output.weight"));
  EXPECT_EQ(m.config().gguf_arch(true), "toy");  // llama.cpp cannot run it unfolded
  ModelConfig tied = lens_config();
  tied.tied = true;
  EXPECT_THROW(DecoderLM{tied}, Error);
}

TEST(Lens, FoldingIntoTheTokenTableKeepsTheFunction) {
  DecoderLM m(lens_config());
  m.init(3);
  NoGradGuard ng;
  const Tensor ids = from_vector(std::vector<int32_t>{1, 5, 39, 0, 17, 17, 2}, Shape{1, 7});
  const std::vector<float> before = m.logits(ids).to_f32_vector();
  const std::vector<float> table = m.params().get("token_embd.weight").to_f32_vector();
  const std::vector<float> proj = m.params().get("token_embd_proj.weight").to_f32_vector();
  m.fold_lens();
  EXPECT_FALSE(m.params().has("token_embd_proj.weight"));
  EXPECT_EQ(m.config().lens_dim, 0);
  EXPECT_EQ(m.config().gguf_arch(true), "llama");
  ASSERT_EQ(m.params().get("token_embd.weight").shape(), (Shape{40, 16}));
  // Row v of the folded table is P e_v, in double here.
  const std::vector<float> folded = m.params().get("token_embd.weight").to_f32_vector();
  for (int v : {0, 17, 39})
    for (int d = 0; d < 16; ++d) {
      double want = 0;
      for (int e = 0; e < 24; ++e) want += double(proj[size_t(d * 24 + e)]) * table[size_t(v * 24 + e)];
      EXPECT_NEAR(folded[size_t(v * 16 + d)], want, 1e-6) << v << "," << d;
    }
  const std::vector<float> after = m.logits(ids).to_f32_vector();
  double diff = 0;
  for (size_t i = 0; i < before.size(); ++i) diff = std::max(diff, double(std::fabs(before[i] - after[i])));
  EXPECT_LE(diff, 1e-5 * max_abs(before));
}

TEST(Lens, GradientReachesTheProjectionNotTheDonorTable) {
  DecoderLM m(lens_config());
  m.init(4);
  m.params().set_trainable("token_embd.weight", false);
  const Tensor ids = from_vector(std::vector<int32_t>{3, 1, 4, 1, 5}, Shape{1, 5});
  const Tensor targets = from_vector(std::vector<int32_t>{1, 4, 1, 5, 9}, Shape{1, 5});
  backward(m.loss(ids, targets));
  EXPECT_FALSE(m.params().get("token_embd.weight").grad().defined());
  const Tensor g = m.params().get("token_embd_proj.weight").grad();
  ASSERT_TRUE(g.defined());
  // Against a central difference of one element.
  const int64_t at = 7;
  const double analytic = g.to_f32_vector()[at];
  NoGradGuard ng;
  Tensor& p = m.params().get("token_embd_proj.weight");
  float* w = p.data<float>();
  const float keep = w[at], h = 1e-2f;
  w[at] = keep + h;
  const double up = m.loss(ids, targets).item();
  w[at] = keep - h;
  const double down = m.loss(ids, targets).item();
  w[at] = keep;
  EXPECT_NEAR(analytic, (up - down) / (2 * h), 2e-3 + 2e-2 * std::fabs(analytic));
}

// A LoRA run through a lens over another model's table: what trains, what is saved (the base's
// architecture, the donor's tokenizer, token_embd = E P^T with the donor's E and the trained P
// the checkpoint holds, an untied head), and no adapter file.
TEST(Lens, FinetuneSavesTheFoldedTableWithTheDonorsTokenizer) {
  const std::string base = init_model("qwen2"), donor = init_model("llama");
  const std::string data = temp("lens.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 24; ++i) f << R"({"prompt": "the terms", "completion": " and conditions"})" << "\n";
  }
  FinetuneOptions o;
  o.model = base, o.donor_embeddings = donor, o.data = data, o.out = temp("run"), o.method = "lora";
  o.steps = 3, o.batch = 2, o.lora_rank = 2, o.lr = 1e-2f, o.quiet = true, o.force = true, o.merge_type = "f32";
  const FinetuneResult r = finetune(o);
  EXPECT_EQ(r.steps, 3);
  EXPECT_FALSE(fs::exists(o.out + "/adapter.gguf"));
  gguf::Reader ck(o.out + "/checkpoint.gguf");
  for (const char* t : {"param.token_embd_proj.weight", "param.output.weight", "param.output_norm.weight",
                        "param.blk.0.attn_q.weight.lora_a"})
    EXPECT_NE(ck.find_tensor(t), nullptr) << t;
  EXPECT_EQ(ck.find_tensor("param.token_embd.weight"), nullptr);      // the donor's table never trains
  EXPECT_EQ(ck.find_tensor("param.blk.0.attn_q.weight"), nullptr);    // nor (LoRA) the base
  gguf::Reader out(o.out + "/model.gguf"), d(donor);
  EXPECT_EQ(out.get_str("general.architecture"), "qwen2");
  EXPECT_NE(out.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(out.find_tensor("token_embd_proj.weight"), nullptr);
  EXPECT_EQ(out.get_str("tokenizer.ggml.model"), d.get_str("tokenizer.ggml.model"));
  LoadedModel saved = load_model(o.out + "/model.gguf");
  const int64_t V = saved.model->config().vocab, D = saved.model->config().dim;
  ASSERT_EQ(saved.model->params().get("token_embd.weight").shape(), (Shape{V, D}));
  const std::vector<float> E = d.tensor("token_embd.weight").to_f32_vector();
  const std::vector<float> P = ck.tensor("param.token_embd_proj.weight").to_f32_vector();
  const std::vector<float> T = saved.model->params().get("token_embd.weight").to_f32_vector();
  const int64_t De = int64_t(E.size()) / V;
  for (int64_t v : {int64_t(0), V / 2, V - 1})
    for (int64_t j = 0; j < D; j += 37) {
      double want = 0;
      for (int64_t e = 0; e < De; ++e) want += double(P[size_t(j * De + e)]) * E[size_t(v * De + e)];
      EXPECT_NEAR(T[size_t(v * D + j)], want, 1e-5) << v << "," << j;
    }
}

TEST(Lens, BadRequestsAreClearErrors) {
  FinetuneOptions o;
  o.data = temp("none.jsonl"), o.out = temp("bad"), o.method = "lora";
  o.donor_embeddings = temp("no_such_donor.gguf");
  try {
    o.validate();
    FAIL() << "a fresh model trained with LoRA was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--method full"), std::string::npos) << e.what();
  }
  o.method = "full";
  std::ofstream(o.data) << R"({"prompt": "a", "completion": "b"})" << "\n";
  try {
    finetune(o);
    FAIL() << "a missing donor file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_donor.gguf"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.out));  // nothing written
}
