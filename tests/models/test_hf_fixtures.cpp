// Models written in Hugging Face's conventions by an independent PyTorch reference
// (tests/fixtures/make_hf_fixtures.py: HF weight layouts, rotate_half RoPE, GPT-2's Conv1D,
// float64) and converted to GGUF as llama.cpp's converter does (llama's q/k rows permuted,
// Conv1D transposed; Qwen3.5's zero-centred norms + 1, ssm_a = -exp(A_log), the Gated DeltaNet
// V heads reordered from grouped to tiled), so toy's loader and the reference cannot share one
// misreading.
//   - F32 files: toy's logits equal the reference's, max |d| <= 1e-4 x max |logit|.
//   - Q8_0 / Q4_0 files: the reference ran on the weights the file holds (its dequantized
//     blocks). A prompt (20 tokens) widens the blocks exactly into the GEMM, so the same
//     1e-4 bound holds (measured ~1e-6). Decoding one token at a time (the block dot-product
//     path) rounds the activations to 8-bit blocks first, as llama.cpp does: each activation
//     moves by at most half a step (max|x| / 254 of its block; the per-product bound is
//     tested in Forward.LinearDecodePathReadsBlocksDirectly). These fixtures are deliberately
//     rough (weights N(0, 0.2), logits up to ~17), which amplifies that rounding through the
//     layers: measured 0.02-0.085 x max |logit|; the bound is 0.1 x max |logit|.
//   - Cached decoding equals the full forward at every position: 1e-5 x max |logit| (F32).
//     With block weights the two paths take different products once a forward has more than
//     kGemvMaxRows rows: the prompt's SGEMM over the widened blocks rounds each f32 product,
//     the block dot product sums the 8-bit integers exactly. The activations they round to
//     8 bits then differ in their last bits, and one that sits at a rounding boundary lands
//     one step (max|x| / 127 of its block) apart; a recurrent state (Qwen3.5's Gated DeltaNet)
//     carries that step to every later position. Measured on an AMD Zen 5 host: qwen35.q8_0
//     agrees to 1e-7 up to position 9, then one flip moves the logits by 1.4e-2 x max |logit|
//     (with the block products on both sides, forced for all 20 rows, the two agree exactly).
//     So: the first kGemvMaxRows positions, where both sides take the block products, agree to
//     1e-5 x max |logit|; every position agrees within the 8-bit rounding bound the reference
//     comparison uses (0.1 x max |logit|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "proc.h"
#include "toy/autograd/grad_mode.h"
#include "toy/backend/cpu/gemv_blocks.h"
#include "toy/io/model_file.h"
#include "toy/nn/kv_cache.h"
#include "toy/ops/ops.h"

using namespace toy;

namespace {

struct Reference {
  std::vector<int32_t> ids;
  int64_t V = 0;
  std::vector<double> logits[3];  // f32, q8_0, q4_0: [T, V]
};

Reference read_reference(const std::string& arch) {
  std::ifstream in(std::string(TOY_FIXTURE_DIR) + "/hf/" + arch + ".ref.bin", std::ios::binary);
  EXPECT_TRUE(in.good()) << arch;
  char magic[8];
  uint32_t T = 0, V = 0;
  in.read(magic, 8).read(reinterpret_cast<char*>(&T), 4).read(reinterpret_cast<char*>(&V), 4);
  EXPECT_EQ(std::string(magic, 8), "TOYHFREF");
  Reference r;
  r.V = V;
  r.ids.resize(T);
  in.read(reinterpret_cast<char*>(r.ids.data()), std::streamsize(T * 4));
  for (auto& l : r.logits) {
    l.resize(size_t(T) * V);
    in.read(reinterpret_cast<char*>(l.data()), std::streamsize(l.size() * 8));
  }
  EXPECT_TRUE(in.good());
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// max |a - b| over row t of [T, V] logits.
double row_diff(const std::vector<float>& a, const std::vector<double>& b, int64_t t, int64_t V) {
  double d = 0;
  for (int64_t v = 0; v < V; ++v) d = std::max(d, std::fabs(double(a[size_t(t * V + v)]) - b[size_t(t * V + v)]));
  return d;
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(HfFixture, ToyMatchesTheReferenceForEveryWeightType) {
  const std::string arch = GetParam();
  const Reference ref = read_reference(arch);
  const int64_t T = int64_t(ref.ids.size()), V = ref.V;
  const char* kinds[3] = {"", ".q8_0", ".q4_0"};
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(arch + kinds[k]);
    LoadedModel lm = load_model(std::string(TOY_FIXTURE_DIR) + "/hf/" + arch + kinds[k] + ".gguf");
    EXPECT_EQ(lm.arch, arch);
    NoGradGuard ng;
    const std::vector<float> full = lm.model->logits(from_vector(ref.ids, Shape{1, T})).to_f32_vector();
    const double scale = max_abs(ref.logits[k]);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) worst = std::max(worst, row_diff(full, ref.logits[k], t, V));
    // Block weights: toy rounds the activations to 8 bits as llama.cpp does (the reference
    // keeps them in f32), in the prompt and the decode path alike.
    EXPECT_LE(worst, (k == 0 ? 1e-4 : 0.1) * scale) << "prompt forward vs the reference";
    // Token by token with the cache.
    nn::KVCache cache = lm.model->new_cache(1, T);
    std::vector<float> step(size_t(T * V));
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> row = lm.model->decode(cache, {ref.ids[size_t(t)]}).to_f32_vector();
      std::memcpy(step.data() + t * V, row.data(), size_t(V) * 4);
    }
    // The first positions again, as one forward short enough for the block products.
    const int64_t S = std::min<int64_t>(T, cpu::kGemvMaxRows);
    const std::vector<int32_t> head(ref.ids.begin(), ref.ids.begin() + S);
    // (Through a cache of the same capacity: Phi-3's LongRoPE picks its factors by the run's
    // context, and this run's is T positions, as the decode's.)
    nn::KVCache short_cache = lm.model->new_cache(1, T);
    const std::vector<float> short_full =
        lm.model->logits(from_vector(head, Shape{1, S}), false, nullptr, &short_cache).to_f32_vector();
    double decode_vs_full = 0, decode_vs_short = 0, decode_vs_ref = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t v = 0; v < V; ++v) {
        const float d = step[size_t(t * V + v)];
        decode_vs_full = std::max(decode_vs_full, double(std::fabs(d - full[size_t(t * V + v)])));
        if (t < S) decode_vs_short = std::max(decode_vs_short, double(std::fabs(d - short_full[size_t(t * V + v)])));
      }
      decode_vs_ref = std::max(decode_vs_ref, row_diff(step, ref.logits[k], t, V));
    }
    // The cached decode computes what the prompt forward computes (see the top of the file
    // for the block weights' two bounds).
    EXPECT_LE(decode_vs_short, 1e-5 * scale) << "cached decode vs a forward of the first " << S << " tokens";
    EXPECT_LE(decode_vs_full, (k == 0 ? 1e-5 : 0.1) * scale) << "cached decode vs the full forward";
    EXPECT_LE(decode_vs_ref, (k == 0 ? 1e-4 : 0.1) * scale) << "decode vs the reference";
    std::printf("%s%s: prompt %.2e, decode vs full %.2e (first %lld: %.2e), decode vs ref %.2e (x max|logit| %.1f)\n",
                arch.c_str(), kinds[k], worst / scale, decode_vs_full / scale, (long long)S, decode_vs_short / scale,
                decode_vs_ref / scale, scale);
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, HfFixture, ::testing::Values("llama", "qwen2", "qwen3", "gpt2", "qwen35", "smollm3", "phi3", "gemma3",
                                                           "qwen3moe", "olmoe", "lfm2"),
                         [](const auto& i) { return i.param; });

// The same through the command a user runs: toy eval --tokens ... --dump-logits.
TEST(HfFixtureCli, EvalDumpsTheReferenceLogits) {
  const Reference ref = read_reference("qwen3");
  std::string ids;
  for (int32_t id : ref.ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const std::string out = ::testing::TempDir() + "/toy_hf_qwen3.logits";
  const auto r = toy::test::run_toy({"eval", "-m", std::string(TOY_FIXTURE_DIR) + "/hf/qwen3.gguf", "--tokens", ids,
                                     "--dump-logits", out});
  ASSERT_EQ(r.status, 0) << toy::test::describe(r);
  std::ifstream in(out, std::ios::binary);
  std::vector<float> got(ref.logits[0].size());
  in.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
  ASSERT_TRUE(in.good());
  EXPECT_EQ(in.peek(), EOF) << "exactly [n_tokens, vocab] floats";
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref.logits[0][i]));
  EXPECT_LE(worst, 1e-4 * max_abs(ref.logits[0]));
}
