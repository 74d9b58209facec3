// DecoderLM beyond the reference oracle's configuration: the llama layout (split q/k/v with
// biases, GQA, RoPE on the packed projection, SwiGLU) and incremental decoding. Oracle: the
// model's own full-sequence forward, which the parity test ties to the reference model.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "helpers.h"
#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/rng.h"
#include "toy/infer/generate.h"
#include "toy/models/decoder_lm.h"

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
