// Parity: DecoderLM (engine, f32) against ref::TransformerLM (plain loops, double) configured
// the same way — RMSNorm, per-head attention, GELU MLP, tied embeddings, learned positions, no
// biases. Same weights in; logits, loss, every gradient, and the parameters after three Adam
// steps must agree per tensor to max|delta| / max|ref| <= 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include <fmt/core.h>

#include "toy/autograd/backward.h"
#include "toy/models/decoder_lm.h"
#include "toy/models/ref/transformer_lm.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"

namespace {

using toy::Shape;
using toy::Tensor;

struct RefTensor {
  Shape shape;
  std::vector<double*> cells;  // pointers into the ref model/gradients, in toy's row-major layout
};

// Visits every parameter of a ref model or gradient set (both have the same members) as toy
// names it and lays it out: Linear weights [out, in] (ref stores [in, out] and applies x·W),
// per-head q/k/v matrices stacked into one [H*d, D] weight.
template <class M>
std::map<std::string, RefTensor> toy_layout(M& m, int64_t H, int64_t D, int64_t F) {
  std::map<std::string, RefTensor> out;
  auto mat = [](toy::ref::Mat& a) {  // same layout
    RefTensor t{Shape{a.nrows, a.ncols}, {}};
    for (double& v : a.flat) t.cells.push_back(&v);
    return t;
  };
  auto mat_t = [](toy::ref::Mat& a) {  // transposed
    RefTensor t{Shape{a.ncols, a.nrows}, {}};
    for (int64_t o = 0; o < a.ncols; ++o)
      for (int64_t i = 0; i < a.nrows; ++i) t.cells.push_back(&a.flat[size_t(i * a.ncols + o)]);
    return t;
  };
  auto vec = [](std::vector<double>& v) {
    RefTensor t{Shape{int64_t(v.size())}, {}};
    for (double& x : v) t.cells.push_back(&x);
    return t;
  };
  auto heads = [&](std::vector<toy::ref::Mat>& w) {  // n_heads x [D, d] -> [H*d, D]
    const int64_t d = D / H;
    RefTensor t{Shape{H * d, D}, {}};
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < d; ++j)
        for (int64_t i = 0; i < D; ++i) t.cells.push_back(&w[size_t(h)].flat[size_t(i * d + j)]);
    return t;
  };
  out["token_embd.weight"] = mat(m.token_embed);
  out["position_embd.weight"] = mat(m.pos_embed);
  out["output_norm.weight"] = vec(m.norm_final_gamma);
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    auto& b = m.blocks[l];
    const std::string p = fmt::format("blk.{}.", l);
    out[p + "attn_norm.weight"] = vec(b.norm1_gamma);
    out[p + "attn_q.weight"] = heads(b.w_q);
    out[p + "attn_k.weight"] = heads(b.w_k);
    out[p + "attn_v.weight"] = heads(b.w_v);
    out[p + "attn_output.weight"] = mat_t(b.w_o);
    out[p + "ffn_norm.weight"] = vec(b.norm2_gamma);
    out[p + "ffn_up.weight"] = mat_t(b.w_ff1);
    out[p + "ffn_down.weight"] = mat_t(b.w_ff2);
  }
  (void)F;
  return out;
}

// max|a - ref| / max|ref| over one tensor.
double rel_err(const Tensor& a, const RefTensor& r) {
  std::vector<float> v = a.to_f32_vector();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    worst = std::max(worst, std::fabs(double(v[i]) - *r.cells[i]));
    scale = std::max(scale, std::fabs(*r.cells[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace

TEST(Parity, DecoderLMMatchesTheReferenceTransformer) {
  const int64_t V = 13, D = 16, H = 2, F = 24, L = 2, T = 8;
  toy::ref::Config rc{.vocab_size = V, .d_model = D, .d_ff = F, .n_heads = H, .n_layers = L, .context_length = T};
  toy::ref::TransformerLM ref(rc, 7);

  toy::ModelConfig mc;
  mc.preset = "parity";
  mc.vocab = V, mc.dim = D, mc.layers = L, mc.heads = H, mc.kv_heads = H, mc.ffn = F, mc.ctx = T;
  mc.norm = toy::NormKind::RMS;
  mc.mlp = toy::MlpKind::GELU;
  mc.pos = toy::PosKind::Learned;
  mc.bias = false;
  mc.tied = true;
  mc.norm_eps = 1e-5f;
  toy::DecoderLM model(mc);

  // Same weights on both sides: the ref's random init rounded to f32.
  auto ref_params = toy_layout(ref, H, D, F);
  ASSERT_EQ(ref_params.size(), model.params().size());
  {
    toy::NoGradGuard ng;
    for (auto& [name, rt] : ref_params) {
      Tensor& p = model.params().get(name, rt.shape);
      float* dst = p.data<float>();
      for (size_t i = 0; i < rt.cells.size(); ++i) {
        dst[i] = float(*rt.cells[i]);
        *rt.cells[i] = double(dst[i]);
      }
    }
  }

  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<int32_t> targets(ids.begin() + 1, ids.end());
  targets.push_back(-100);  // the ref predicts T-1 positions
  const Tensor x = toy::from_vector(ids, Shape{1, T}), y = toy::from_vector(targets, Shape{1, T});

  // Logits.
  toy::ref::Mat ref_logits = ref.forward(ids);
  Tensor logits = model.logits(x);
  {
    double worst = 0, scale = 0;
    std::vector<float> lv = logits.to_f32_vector();
    for (size_t i = 0; i < lv.size(); ++i) {
      worst = std::max(worst, std::fabs(double(lv[i]) - ref_logits.flat[i]));
      scale = std::max(scale, std::fabs(ref_logits.flat[i]));
    }
    EXPECT_LE(worst / scale, 1e-4) << "logits";
  }

  // Loss and every gradient.
  toy::ref::Gradients g(rc);
  g.fill_zero();
  ref.forward(ids);
  const double ref_loss = ref.backward(ids, g);
  Tensor loss = model.loss(x, y);
  EXPECT_LE(std::fabs(loss.item() - ref_loss) / std::fabs(ref_loss), 1e-4) << "loss";
  loss.backward();
  auto ref_grads = toy_layout(g, H, D, F);
  double worst_grad = 0;
  for (auto& [name, rt] : ref_grads) {
    const Tensor& p = model.params().get(name);
    ASSERT_TRUE(p.grad().defined()) << name;
    const double e = rel_err(p.grad(), rt);
    worst_grad = std::max(worst_grad, e);
    EXPECT_LE(e, 1e-4) << "gradient of " << name;
  }
  std::printf("parity: worst gradient max|delta|/max|ref| = %.2e\n", worst_grad);

  // Three Adam steps on both sides (AdamW with no weight decay is Adam).
  toy::AdamW opt(model.params(), {0.9f, 0.999f, 1e-8f, 0.0f});
  toy::ref::AdamState st(rc);
  for (int step = 0; step < 3; ++step) {
    if (step > 0) {
      g.fill_zero();
      ref.forward(ids);
      ref.backward(ids, g);
      model.params().zero_grad();
      model.loss(x, y).backward();
    }
    ref.adam_step(g, st, 1e-2, 0.9, 0.999, 1e-8);
    opt.step(1e-2f);
  }
  double worst_param = 0;
  for (auto& [name, rt] : toy_layout(ref, H, D, F)) {
    const double e = rel_err(model.params().get(name), rt);
    worst_param = std::max(worst_param, e);
    EXPECT_LE(e, 1e-4) << "parameter " << name << " after 3 Adam steps";
  }
  std::printf("parity: worst parameter error after 3 Adam steps = %.2e\n", worst_param);
}
