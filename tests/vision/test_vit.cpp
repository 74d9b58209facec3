// The ViT against a PyTorch reference of the same model (tests/fixtures/make_vit_fixture.py):
// logits, the label-smoothed loss and every parameter gradient within 1e-4 of the largest
// reference value; the init rule; the GGUF round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixture_reader.h"
#include "toy/autograd/backward.h"
#include "toy/io/vit_file.h"
#include "toy/models/vit.h"
#include "toy/ops/ops.h"

using namespace toy;

namespace {

// max |a - b| / max |b| over the tensor.
double rel_err(const Tensor& a, const std::vector<double>& b) {
  const std::vector<float> av = a.to_f32_vector();
  double md = 0, mb = 0;
  for (size_t i = 0; i < b.size(); ++i) md = std::max(md, std::fabs(double(av[i]) - b[i])), mb = std::max(mb, std::fabs(b[i]));
  return md / std::max(mb, 1e-30);
}

struct Case {
  const char* name;
  VitConfig cfg;
};

std::vector<Case> cases() {
  VitConfig a;
  a.image = 8, a.channels = 1, a.patch = 2, a.dim = 16, a.layers = 2, a.heads = 2, a.mlp = 24, a.classes = 5;
  a.pool = "cls";
  VitConfig b;
  b.image = 12, b.channels = 3, b.patch = 4, b.dim = 24, b.layers = 2, b.heads = 3, b.mlp = 40, b.classes = 7;
  b.pool = "mean";
  return {{"cls_gray", a}, {"mean_rgb", b}};
}

}  // namespace

TEST(Vit, MatchesPyTorchForwardAndEveryGradient) {
  test::Fixture fx(std::string(TOY_FIXTURE_DIR) + "/vit_torch.bin");
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const std::string pre = std::string(c.name) + "/";
    Vit m(c.cfg);
    for (Param& p : m.params().all()) {
      ASSERT_TRUE(fx.has(pre + p.name)) << p.name;
      ASSERT_EQ(fx.shape(pre + p.name), p.value.shape()) << p.name;
      NoGradGuard ng;
      copy_(p.value, fx.f32(pre + p.name));
    }
    const float smoothing = std::string(c.name) == "cls_gray" ? 0.1f : 0.0f;
    Tensor logits = m.logits(fx.f32(pre + "x"));
    EXPECT_LE(rel_err(logits, fx.f64(pre + "logits")), 1e-4);
    Tensor loss = classification_loss(logits, fx.i32(pre + "y"), smoothing);
    EXPECT_NEAR(loss.item(), fx.f64(pre + "loss")[0], 1e-4 * std::fabs(fx.f64(pre + "loss")[0]));
    backward(loss);
    for (const Param& p : m.params().all()) {
      ASSERT_TRUE(p.value.grad().defined()) << p.name;
      EXPECT_LE(rel_err(p.value.grad(), fx.f64(pre + "grad/" + p.name)), 1e-4) << p.name;
    }
  }
}

TEST(Vit, InitIsDeiTsTruncatedNormalWithAZeroHead) {
  VitConfig c = VitConfig::from_preset("vit-digits");
  Vit m(c);
  m.init(7);
  for (const Param& p : m.params().all()) {
    const std::vector<float> v = p.value.to_f32_vector();
    if (p.name.ends_with(".bias") || p.name.starts_with("cls_head.")) {
      for (float x : v) ASSERT_EQ(x, 0.0f) << p.name;
    } else if (p.name.find("norm.") != std::string::npos) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << p.name;
    } else {
      double s2 = 0;
      for (float x : v) {
        ASSERT_LE(std::fabs(x), 0.04f) << p.name;
        s2 += double(x) * x;
      }
      // A normal cut at 2 std has std 0.88 * 0.02.
      if (v.size() > 2000) {
        EXPECT_NEAR(std::sqrt(s2 / double(v.size())), 0.0176, 0.0015) << p.name;
      }
    }
  }
  Vit again(c);
  again.init(7);
  EXPECT_EQ(again.params().get("blk.1.attn_qkv.weight").to_f32_vector(),
            m.params().get("blk.1.attn_qkv.weight").to_f32_vector());
}

TEST(Vit, GgufRoundTripKeepsWeightsNamesAndNormalisation) {
  VitConfig c = VitConfig::from_preset("vit-digits");
  c.class_names = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  c.mean = {0.25f};
  c.std = {0.4f};
  Vit m(c);
  m.init(3);
  const std::string path = (std::filesystem::temp_directory_path() / "toy_vit_roundtrip.gguf").string();
  save_vit(path, m);
  auto back = load_vit(path);
  EXPECT_EQ(back->config().class_names, c.class_names);
  EXPECT_EQ(back->config().mean, c.mean);
  EXPECT_EQ(back->config().std, c.std);
  EXPECT_EQ(back->config().pool, "cls");
  for (const Param& p : m.params().all())
    EXPECT_EQ(back->params().get(p.name).to_f32_vector(), p.value.to_f32_vector()) << p.name;
  std::filesystem::remove(path);
}

TEST(Vit, RefusesImagesOfAnotherShape) {
  Vit m(VitConfig::from_preset("vit-digits"));
  try {
    m.logits(zeros(Shape{2, 3, 8, 8}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected images [N, 1, 8, 8]"), std::string::npos) << e.what();
  }
}
