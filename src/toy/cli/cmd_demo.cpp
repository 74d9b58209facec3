// `toy demo`: trains a tiny one-block transformer on a short built-in text, entirely
// through the engine (embedding, attention, norms, MLP, cross-entropy, AdamW), and prints
// the falling loss. A smoke test of the whole stack on a fresh machine.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "toy/autograd/backward.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/rng.h"
#include "toy/ops/ops.h"

namespace toy::cli {

namespace {

const char* kText =
    "the quick brown fox jumps over the lazy dog. "
    "a tiny model learns the shape of a tiny text. "
    "the quick brown fox jumps over the lazy dog again and again. ";

struct DemoOptions {
  int steps = 300;
  uint64_t seed = 1;
};

int run_demo(const DemoOptions& o) {
  // Character vocabulary.
  std::string text;
  for (int i = 0; i < 8; ++i) text += kText;
  std::map<char, int32_t> vocab;
  for (char c : text) vocab.emplace(c, 0);
  int32_t next = 0;
  for (auto& [c, id] : vocab) id = next++;
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(vocab[c]);
  const int64_t V = next, D = 32, T = 24, B = 8, H = 2, F = 64;

  Generator g(o.seed);
  auto P = [&](const Shape& s, float std) {
    Tensor t = randn(s, g, 0.0f, std);
    t.requires_grad_();
    return t;
  };
  Tensor wte = P({V, D}, 0.02f), wpe = P({T, D}, 0.02f);
  Tensor wqkv = P({3 * D, D}, 0.18f), wo = P({D, D}, 0.18f), w1 = P({F, D}, 0.18f), w2 = P({D, F}, 0.12f);
  Tensor n1 = ones(Shape{D}), n2 = ones(Shape{D}), nf = ones(Shape{D});
  n1.requires_grad_();
  n2.requires_grad_();
  nf.requires_grad_();
  std::vector<Tensor> params = {wte, wpe, wqkv, wo, w1, w2, n1, n2, nf};
  std::vector<Tensor> m, v;
  for (auto& p : params) m.push_back(zeros(p.shape())), v.push_back(zeros(p.shape()));
  Tensor positions = arange(T, DType::I32);

  std::printf("toy demo: %lld-char vocabulary, one transformer block (dim %lld), %d AdamW steps\n", (long long)V,
              (long long)D, o.steps);
  for (int step = 1; step <= o.steps; ++step) {
    // A batch of random windows.
    std::vector<int32_t> x, y;
    for (int64_t b = 0; b < B; ++b) {
      auto u = g.block(g.reserve(1));
      size_t start = u[0] % (ids.size() - size_t(T) - 1);
      for (int64_t t = 0; t < T; ++t) {
        x.push_back(ids[start + size_t(t)]);
        y.push_back(ids[start + size_t(t) + 1]);
      }
    }
    Tensor xt = from_vector(x, Shape{B, T}), yt = from_vector(y, Shape{B, T});
    Tensor h = add(get_rows(wte, xt), get_rows(wpe, positions));
    Tensor qkv = reshape(linear(rms_norm(h, n1), wqkv), Shape{B, T, 3, H, D / H});
    Tensor q = squeeze(slice(qkv, 2, 0, 1), 2), k = squeeze(slice(qkv, 2, 1, 2), 2), vv = squeeze(slice(qkv, 2, 2, 3), 2);
    h = add(h, linear(reshape(attention(q, k, vv), Shape{B, T, D}), wo));
    h = add(h, linear(gelu(linear(rms_norm(h, n2), w1)), w2));
    Tensor loss = cross_entropy(linear(rms_norm(h, nf), wte), yt);
    loss.backward();
    Tensor lr = scalar(3e-3), st = scalar(step);
    for (size_t i = 0; i < params.size(); ++i) {
      adamw_step(params[i], params[i].grad(), m[i], v[i], lr, st, {.weight_decay = 0.01f});
      params[i].zero_grad();
    }
    if (step == 1 || step % 25 == 0) std::printf("step %4d  loss %.4f\n", step, loss.item());
  }
  return 0;
}

}  // namespace

Run add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Train a tiny transformer on a built-in text and print its falling loss");
  auto o = std::make_shared<DemoOptions>();
  add_int(cmd, "--steps", o->steps, 1, 100000, "Training steps");
  add_u64(cmd, "--seed", o->seed, "Random seed");
  return [o]() { return run_demo(*o); };
}

}  // namespace toy::cli
