// Vision behaviours the other vision tests leave loose, each against a value computed here:
//   - evaluate(): accuracy, confusion matrix, predictions, confidences and loss of a model
//     whose predictions are computed image by image (logits, argmax) before the labels are
//     chosen, so the expected accuracy and confusion are known exactly;
//   - augmentation: the image a training step actually gets (read back from the step's
//     gradient, below) is the original shifted by at most --crop-pad pixels with zero fill,
//     flipped only when flips are on; shifts and flips both occur over seeds; with both off it
//     is the original;
//   - read_image_file / encode_png: distinct per-channel, per-pixel values keep their channel
//     and position (planar C x H x W), and RGB -> grey is stb's luminance;
//   - label smoothing: classification_loss is (1 - eps) CE + eps mean_k(-log p_k) (PyTorch's:
//     eps / K on every class), and the training step uses the run's --label-smoothing.
//
// Reading a training step's image back. The augmentation (train/vision.cpp: gather) is internal,
// so a run is made to reveal it: one image per step (--batch 1), a one-patch ViT (--patch = the
// image size, --pool mean) and every training image the same random RGB image (in both
// classes). A fresh ViT's head is zero, so at the first step the logits are 0, every gradient
// but the head's is exactly 0, and the head weight's gradient is the outer product of
// (1 - eps)(1/K - onehot(y)) and the image's final features. With --beta1 0 (AdamW's first moment
// is then the gradient itself), --clip 0 and --wd 0 (the other weights stay as initialised),
// checkpoint.gguf's opt.m.cls_head.weight row 0 is +-(1 - eps)/2 times the features of the image
// the step saw, and opt.m.cls_head.bias is (1 - eps)(1/K - onehot(y)). The features of every
// candidate (each shift up to --crop-pad + 2 either way, flipped or not) are computed with the
// run's own weights (model.gguf) and an identity head; exactly one candidate's direction matches
// (to 1e-7 in practice; the others differ by more than 0.2).
#include <gtest/gtest.h>
#include <zlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/data/images.h"
#include "toy/data/labels.h"
#include "toy/io/gguf.h"
#include "toy/io/vit_file.h"
#include "toy/models/vit.h"
#include "toy/ops/ops.h"
#include "toy/train/vision.h"

using namespace toy;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("toy_vision_gaps_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// n seeded bytes in lo..hi.
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, int lo, int hi) {
  Generator g(seed, 5);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(lo + int(g.block(i)[0] % uint32_t(hi - lo + 1)));
  return v;
}

void put_be32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s.push_back(char((v >> (8 * k)) & 0xff));
}

uint32_t be32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t k = 0; k < 4; ++k) v = v << 8 | uint8_t(s[at + k]);
  return v;
}

std::string png_chunk(const std::string& type, const std::string& data) {
  std::string c;
  put_be32(c, uint32_t(data.size()));
  const std::string body = type + data;
  c += body;
  put_be32(c, uint32_t(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))));
  return c;
}

// An 8-bit grey (1 channel) or RGB (3) PNG written by hand from a planar image: rows top to
// bottom, each filter byte 0 then the pixels left to right, a pixel's channels in order.
std::string handmade_png(const std::vector<uint8_t>& planar, int C, int H, int W) {
  std::string raw;
  for (int y = 0; y < H; ++y) {
    raw.push_back('\0');
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < C; ++c) raw.push_back(char(planar[size_t((c * H + y) * W + x)]));
  }
  uLongf n = compressBound(uLong(raw.size()));
  std::string z(n, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(z.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
                      uLong(raw.size()), 9),
            Z_OK);
  z.resize(n);
  std::string ihdr;
  put_be32(ihdr, uint32_t(W)), put_be32(ihdr, uint32_t(H));
  ihdr += std::string{char(8), char(C == 3 ? 2 : 0), '\0', '\0', '\0'};
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr) + png_chunk("IDAT", z) + png_chunk("IEND", "");
}

// The pixels of an 8-bit grey or RGB PNG (no interlace) as stored: interleaved, rows top to
// bottom, the row filters undone (PNG spec: None, Sub, Up, Average, Paeth).
std::vector<uint8_t> decode_png(const std::string& png, int* C, int* H, int* W) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  int ctype = -1;
  for (size_t at = 8; at + 8 <= png.size();) {
    const uint32_t len = be32_at(png, at);
    const std::string type = png.substr(at + 4, 4), data = png.substr(at + 8, len);
    if (type == "IHDR") {
      *W = int(be32_at(data, 0)), *H = int(be32_at(data, 4));
      EXPECT_EQ(int(uint8_t(data[8])), 8) << "bit depth";
      ctype = uint8_t(data[9]);
      EXPECT_EQ(int(uint8_t(data[12])), 0) << "interlace";
    } else if (type == "IDAT") {
      idat += data;
    } else if (type == "IEND") {
      break;
    }
    at += 12 + len;
  }
  EXPECT_TRUE(ctype == 0 || ctype == 2) << "colour type " << ctype;
  *C = ctype == 2 ? 3 : 1;
  const size_t stride = size_t(*W * *C);
  std::string raw(size_t(*H) * (stride + 1), '\0');
  uLongf n = uLongf(raw.size());
  EXPECT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &n, reinterpret_cast<const Bytef*>(idat.data()),
                       uLong(idat.size())),
            Z_OK);
  EXPECT_EQ(size_t(n), raw.size());
  std::vector<uint8_t> out(size_t(*H) * stride, 0);
  const size_t bpp = size_t(*C);
  for (size_t y = 0; y < size_t(*H); ++y) {
    const int filter = uint8_t(raw[y * (stride + 1)]);
    for (size_t i = 0; i < stride; ++i) {
      const int v = uint8_t(raw[y * (stride + 1) + 1 + i]);
      const int a = i >= bpp ? out[y * stride + i - bpp] : 0;
      const int b = y > 0 ? out[(y - 1) * stride + i] : 0;
      const int c = i >= bpp && y > 0 ? out[(y - 1) * stride + i - bpp] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      EXPECT_LE(filter, 4) << "row " << y;
      out[y * stride + i] = uint8_t((v + pred) & 0xff);
    }
  }
  return out;
}

// ---- reading a training step's image back (see the top of the file) --------------------------

constexpr int64_t kAugSide = 8, kAugChannels = 3;

// The one training image: random RGB values 1..255 (no 0, so the zero fill is visible).
std::vector<uint8_t> aug_image() { return random_bytes(size_t(kAugChannels * kAugSide * kAugSide), 31, 1, 255); }

// train/{a,b} with 5 copies each of the image, test/{a,b} with one each.
void write_aug_data(const fs::path& dir, const std::vector<uint8_t>& img) {
  const std::string png = encode_png(img.data(), kAugChannels, kAugSide, kAugSide);
  for (const auto& [part, n] : {std::pair<std::string, int>{"train", 5}, {"test", 1}})
    for (const char* cls : {"a", "b"}) {
      fs::create_directories(dir / part / cls);
      for (int i = 0; i < n; ++i) write_file(dir / part / cls / (std::to_string(i) + ".png"), png);
    }
}

struct Transform {
  int64_t dy = 0, dx = 0;
  bool flip = false;
};

// The documented augmentation: the image (mirrored left-right when flipped) shifted by
// (dy, dx) — output pixel (y, x) is input pixel (y + dy, x + dx) — zero where that falls outside.
std::vector<uint8_t> transformed(const std::vector<uint8_t>& src, const Transform& t) {
  const int64_t C = kAugChannels, H = kAugSide, W = kAugSide;
  std::vector<uint8_t> out(src.size(), 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sy = y + t.dy, sx = x + t.dx;
        if (sy < 0 || sy >= H || sx < 0 || sx >= W) continue;
        out[size_t((c * H + y) * W + x)] = src[size_t((c * H + sy) * W + (t.flip ? W - 1 - sx : sx))];
      }
  return out;
}

struct FirstStep {
  Transform seen;               // the transform whose image the first step trained on
  std::vector<float> bias_grad;  // opt.m.cls_head.bias: that step's head-bias gradient
};

struct AugRun {
  int64_t crop_pad = 0;
  bool flip = false;
  float smoothing = 0.0f;
  uint64_t seed = 1;
};

// Trains one step (see the top of the file) and finds which transform of `img` it saw.
void first_step(const fs::path& data, const fs::path& out, const AugRun& a, const std::vector<uint8_t>& img,
                FirstStep* res) {
  VisionTrainOptions o;
  o.data = data.string();
  o.out = out.string();
  o.model = VitConfig::from_preset("vit-digits");
  o.model.dim = 16, o.model.layers = 1, o.model.heads = 1, o.model.mlp = 16;
  o.model.patch = kAugSide, o.model.pool = "mean";
  o.epochs = 1, o.batch = 1, o.stop_after = 1;
  o.crop_pad = a.crop_pad, o.flip = a.flip, o.label_smoothing = a.smoothing, o.seed = a.seed;
  o.beta1 = 0.0f, o.clip = 0.0f, o.weight_decay = 0.0f;
  o.save_minutes = 0, o.quiet = true;
  const VisionTrainResult r = train_vision(o);
  ASSERT_TRUE(r.stopped);
  ASSERT_EQ(r.steps, 1);
  gguf::Reader ck((out / "checkpoint.gguf").string());
  const std::vector<float> gw = ck.tensor("opt.m.cls_head.weight").to_f32_vector();
  res->bias_grad = ck.tensor("opt.m.cls_head.bias").to_f32_vector();
  auto trained = load_vit((out / "model.gguf").string());
  const int64_t D = trained->config().dim;
  ASSERT_EQ(gw.size(), size_t(2 * D));
  // The same network with an identity head: its logits are the final features.
  VitConfig fc = trained->config();
  fc.classes = D;
  fc.class_names.clear();
  Vit fm(fc);
  {
    NoGradGuard ng;
    for (Param& p : fm.params().all())
      if (!p.name.starts_with("cls_head.")) copy_(p.value, trained->params().get(p.name));
    std::vector<float> eye(size_t(D * D), 0.0f);
    for (int64_t i = 0; i < D; ++i) eye[size_t(i * D + i)] = 1.0f;
    copy_(fm.params().get("cls_head.weight"), from_vector(eye, Shape{D, D}));
  }
  const int64_t R = a.crop_pad + 2;
  std::vector<Transform> cands;
  std::vector<uint8_t> px;
  for (bool flip : {false, true})
    for (int64_t dy = -R; dy <= R; ++dy)
      for (int64_t dx = -R; dx <= R; ++dx) {
        cands.push_back({dy, dx, flip});
        const std::vector<uint8_t> t = transformed(img, cands.back());
        px.insert(px.end(), t.begin(), t.end());
      }
  std::vector<float> feats;
  {
    NoGradGuard ng;
    feats = fm.logits(fm.input(px.data(), int64_t(cands.size()))).to_f32_vector();
  }
  auto unit = [](const float* v, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(v[i]) * v[i];
    std::vector<double> u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) u[size_t(i)] = v[i] / std::sqrt(s);
    return u;
  };
  const std::vector<double> g = unit(gw.data(), D);  // row 0: +-(1 - eps)/2 x the features
  double best = INFINITY, second = INFINITY;
  size_t at = 0;
  for (size_t k = 0; k < cands.size(); ++k) {
    const std::vector<double> f = unit(feats.data() + k * size_t(D), D);
    double same = 0, opposite = 0;
    for (int64_t i = 0; i < D; ++i)
      same = std::max(same, std::fabs(g[size_t(i)] - f[size_t(i)])),
      opposite = std::max(opposite, std::fabs(g[size_t(i)] + f[size_t(i)]));
    const double dist = std::min(same, opposite);
    if (dist < best) {
      second = best, best = dist, at = k;
    } else if (dist < second) {
      second = dist;
    }
  }
  ASSERT_LT(best, 1e-4) << "the first step's image is no shift of up to " << R << " pixels (zero fill), flipped or "
                        << "not, of the training image";
  EXPECT_GT(second, 1e-2) << "two candidates match: the image does not tell them apart";
  res->seen = cands[at];
}

std::string describe(const Transform& t) {
  return "shift (" + std::to_string(t.dy) + ", " + std::to_string(t.dx) + ")" + (t.flip ? ", flipped" : "");
}

}  // namespace

// evaluate() against a hand count: the model's prediction for each image computed alone
// (logits, argmax), then labels chosen so that every third image is wrong (its label the next
// class after the prediction). Accuracy, the confusion matrix ([true][predicted]), predictions,
// confidences (softmax of the prediction), per-class accuracy and the mean cross-entropy must
// be those, whatever the evaluation batch (11 images in batches of 4: a short last batch).
TEST(VisionGaps, EvaluateMatchesAccuracyAndConfusionComputedImageByImage) {
  VitConfig c;
  c.image = 6, c.channels = 3, c.patch = 3, c.dim = 12, c.layers = 1, c.heads = 2, c.mlp = 16, c.classes = 4;
  c.pool = "mean";
  c.mean = {0.4f, 0.5f, 0.6f};
  c.std = {0.3f, 0.25f, 0.2f};
  Vit m(c);
  m.init(21);
  {
    NoGradGuard ng;  // a head that is not zero, so the predictions differ
    Generator gw(22, 1), gb(23, 1);
    copy_(m.params().get("cls_head.weight"), randn(Shape{4, 12}, gw, 0.0f, 2.0f));
    copy_(m.params().get("cls_head.bias"), randn(Shape{4}, gb, 0.0f, 0.5f));
  }
  const int64_t n = 11, K = 4;
  ImageSet s;
  s.channels = 3, s.height = 6, s.width = 6;
  s.classes = {"a", "b", "c", "d"};
  s.source = "hand-made";
  s.pixels = random_bytes(size_t(n * s.image_bytes()), 24, 0, 255);
  std::vector<int32_t> pred(static_cast<size_t>(n));
  std::vector<std::vector<double>> logits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    NoGradGuard ng;
    const std::vector<float> l = m.logits(m.input(s.image(i), 1)).to_f32_vector();
    ASSERT_EQ(l.size(), size_t(K));
    logits[size_t(i)].assign(l.begin(), l.end());
    std::vector<double> sorted = logits[size_t(i)];
    std::sort(sorted.begin(), sorted.end());
    ASSERT_GT(sorted[3] - sorted[2], 1e-3) << "image " << i << ": a clear prediction (else batching could flip it)";
    pred[size_t(i)] = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  }
  std::vector<std::vector<int64_t>> confusion(static_cast<size_t>(K), std::vector<int64_t>(size_t(K), 0));
  int64_t correct = 0;
  double loss = 0;
  std::vector<double> confidence;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = pred[size_t(i)];
    const int32_t label = i % 3 == 0 ? (p + 1) % int32_t(K) : p;
    s.labels.push_back(label);
    confusion[size_t(label)][size_t(p)]++;
    correct += label == p;
    const std::vector<double>& l = logits[size_t(i)];
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (double v : l) z += std::exp(v - mx);
    loss += mx + std::log(z) - l[size_t(label)];
    confidence.push_back(std::exp(l[size_t(p)] - mx) / z);
  }
  loss /= double(n);
  ASSERT_EQ(correct, 7);  // images 0, 3, 6, 9 are wrong
  for (int64_t batch : {int64_t(4), int64_t(256)}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Evaluation e = evaluate(m, s, batch);
    EXPECT_EQ(e.n, n);
    EXPECT_DOUBLE_EQ(e.accuracy, 7.0 / 11.0);
    EXPECT_EQ(e.predicted, pred);
    EXPECT_EQ(e.confusion, confusion);
    ASSERT_EQ(e.confidence.size(), size_t(n));
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(e.confidence[size_t(i)], confidence[size_t(i)], 1e-5) << i;
    EXPECT_NEAR(e.loss, loss, 1e-5 * std::max(1.0, loss));
    const std::vector<double> per_class = e.per_class();
    ASSERT_EQ(per_class.size(), size_t(K));
    for (int64_t k = 0; k < K; ++k) {
      int64_t row = 0;
      for (int64_t v : confusion[size_t(k)]) row += v;
      if (row == 0)
        EXPECT_TRUE(std::isnan(per_class[size_t(k)])) << "class " << k << " has no image";
      else
        EXPECT_DOUBLE_EQ(per_class[size_t(k)], double(confusion[size_t(k)][size_t(k)]) / double(row)) << k;
    }
  }
}

// What a training step sees (read back as the top of the file explains), over six seeds:
//   --crop-pad 2 --flip:    shifts of at most 2 (zero fill), some of exactly 2, some flips, some not;
//   --crop-pad 2 --no-flip: shifts, never a flip;
//   --crop-pad 0 --flip:    flips (some), never a shift;
//   --crop-pad 0 --no-flip: the image itself.
TEST(VisionGaps, TrainingStepsSeeShiftedOrFlippedCopiesOfTheImagesAsConfigured) {
  const fs::path d = scratch("augment");
  const std::vector<uint8_t> img = aug_image();
  write_aug_data(d / "data", img);
  {
    const VisionData v = load_vision_data((d / "data").string(), 1);
    ASSERT_EQ(v.train.channels, kAugChannels);
    ASSERT_EQ(v.train.height, kAugSide);
    ASSERT_EQ(v.train.size(), 9);  // 10, less one held out for validation
    for (int64_t i = 0; i < v.train.size(); ++i)
      ASSERT_TRUE(std::equal(img.begin(), img.end(), v.train.image(i))) << "training image " << i << " as written";
  }
  int runs = 0;
  auto seen_over_seeds = [&](AugRun a, std::vector<uint64_t> seeds) {
    std::vector<Transform> seen;
    for (uint64_t seed : seeds) {
      a.seed = seed;
      SCOPED_TRACE("--crop-pad " + std::to_string(a.crop_pad) + (a.flip ? " --flip" : " --no-flip") + " --seed " +
                   std::to_string(seed));
      FirstStep fs_;
      first_step(d / "data", d / ("run" + std::to_string(runs++)), a, img, &fs_);
      if (::testing::Test::HasFatalFailure()) return seen;
      const Transform& t = fs_.seen;
      EXPECT_LE(std::abs(t.dy), a.crop_pad) << describe(t);
      EXPECT_LE(std::abs(t.dx), a.crop_pad) << describe(t);
      EXPECT_TRUE(a.flip || !t.flip) << describe(t) << " without --flip";
      seen.push_back(t);
    }
    return seen;
  };
  const std::vector<uint64_t> seeds = {1, 2, 3, 4, 5, 6};
  auto count = [](const std::vector<Transform>& v, auto pred) {
    return std::count_if(v.begin(), v.end(), pred);
  };
  auto flipped = [](const Transform& t) { return t.flip; };
  auto shifted = [](const Transform& t) { return t.dy != 0 || t.dx != 0; };
  auto at_the_edge = [](const Transform& t) { return std::max(std::abs(t.dy), std::abs(t.dx)) == 2; };

  std::vector<Transform> both = seen_over_seeds({2, true, 0.1f, 0}, seeds);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(both.size(), seeds.size());
  EXPECT_GE(count(both, flipped), 1) << "no flip in six seeds";
  EXPECT_GE(int64_t(both.size()) - count(both, flipped), 1) << "every image flipped";
  EXPECT_GE(count(both, shifted), 1) << "no shift in six seeds";
  EXPECT_GE(count(both, at_the_edge), 1) << "no shift of the whole --crop-pad in six seeds";

  std::vector<Transform> shifts = seen_over_seeds({2, false, 0.1f, 0}, seeds);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(count(shifts, flipped), 0);
  EXPECT_GE(count(shifts, shifted), 1) << "no shift in six seeds";

  std::vector<Transform> flips = seen_over_seeds({0, true, 0.1f, 0}, seeds);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(count(flips, shifted), 0);
  EXPECT_GE(count(flips, flipped), 1) << "no flip in six seeds";
  EXPECT_GE(int64_t(flips.size()) - count(flips, flipped), 1) << "every image flipped";

  std::vector<Transform> none = seen_over_seeds({0, false, 0.1f, 0}, {1, 3, 5});
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(count(none, flipped), 0);
  EXPECT_EQ(count(none, shifted), 0);
  fs::remove_all(d);
}

// classification_loss with smoothing eps (the training loss of train/vision.h) is PyTorch's
// label-smoothed cross-entropy: mean over rows of (1 - eps) (-log p_y) + eps mean_k(-log p_k) —
// eps / K on every class, the true one included (not eps / (K - 1) on the others) — and its
// gradient to the logits is (p - (1 - eps) onehot(y) - eps / K) / N.
TEST(VisionGaps, LabelSmoothingIsPyTorchsDefinition) {
  const int64_t N = 5, K = 4;
  Generator g(41, 2);
  const std::vector<float> z = randn(Shape{N, K}, g, 0.0f, 2.0f).to_f32_vector();
  const std::vector<int32_t> y = {0, 3, 1, 1, 2};
  for (float eps : {0.0f, 0.1f, 0.35f}) {
    SCOPED_TRACE("eps " + std::to_string(eps));
    Tensor logits = from_vector(z, Shape{N, K});
    logits.requires_grad_();
    Tensor loss = classification_loss(logits, labels::class_ids(y, K), eps);
    double want = 0;
    std::vector<double> want_grad(static_cast<size_t>(N * K));
    for (int64_t i = 0; i < N; ++i) {
      const float* r = z.data() + i * K;
      const double mx = *std::max_element(r, r + K);
      double se = 0;
      for (int64_t k = 0; k < K; ++k) se += std::exp(double(r[k]) - mx);
      const double lse = mx + std::log(se);
      double mean_nll = 0;
      for (int64_t k = 0; k < K; ++k) mean_nll += (lse - r[k]) / double(K);
      want += (1 - double(eps)) * (lse - r[y[size_t(i)]]) + double(eps) * mean_nll;
      for (int64_t k = 0; k < K; ++k)
        want_grad[size_t(i * K + k)] =
            (std::exp(r[k] - lse) - (1 - double(eps)) * (k == y[size_t(i)]) - double(eps) / double(K)) / double(N);
    }
    want /= double(N);
    EXPECT_NEAR(loss.item(), want, 1e-5 * std::max(1.0, std::fabs(want)));
    backward(loss);
    ASSERT_TRUE(logits.grad().defined());
    const std::vector<float> got = logits.grad().to_f32_vector();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want_grad[i], 1e-6) << i;
  }
}

// The training step's loss is smoothed with the run's --label-smoothing: at the first step of a
// fresh ViT (zero head: uniform probabilities 1/K) the head-bias gradient, saved as AdamW's
// first moment with --beta1 0, is (1 - eps)(1/K - onehot(y)) — for eps 0, 0.2 and 0.5 — where
// an unsmoothed loss would give 1/K - onehot(y) whatever eps.
TEST(VisionGaps, TrainingStepUsesTheRunsLabelSmoothing) {
  const fs::path d = scratch("smoothing");
  const std::vector<uint8_t> img = aug_image();
  write_aug_data(d / "data", img);
  int runs = 0;
  for (float eps : {0.0f, 0.2f, 0.5f})
    for (uint64_t seed : {uint64_t(1), uint64_t(2)}) {
      SCOPED_TRACE("eps " + std::to_string(eps) + ", seed " + std::to_string(seed));
      FirstStep f;
      first_step(d / "data", d / ("run" + std::to_string(runs++)), {0, false, eps, seed}, img, &f);
      ASSERT_FALSE(HasFatalFailure());
      ASSERT_EQ(f.bias_grad.size(), 2u);
      const int y = f.bias_grad[0] < 0 ? 0 : 1;  // both classes hold the image: either label
      for (int k = 0; k < 2; ++k)
        EXPECT_NEAR(f.bias_grad[size_t(k)], (1.0 - double(eps)) * (0.5 - (k == y ? 1.0 : 0.0)), 1e-6) << "class " << k;
      EXPECT_EQ(f.seen.dy, 0);
      EXPECT_EQ(f.seen.dx, 0);
      EXPECT_FALSE(f.seen.flip);
    }
  fs::remove_all(d);
}

// read_image_file keeps each channel and each pixel where it was: a PNG written by hand (not by
// toy) with a different value in every channel of every pixel of a 5x3 image reads back as
// the planar image exactly (as stored and asked for 3 channels); asked for 1 channel, each
// pixel is stb's luminance (77 R + 150 G + 29 B) >> 8 (within 1); a grey PNG asked for 3
// channels repeats the grey image in each. encode_png writes the planar image interleaved:
// decoded here independently, and read back by read_image_file.
TEST(VisionGaps, ImagesKeepChannelOrderAndPixelPositions) {
  const fs::path d = scratch("channels");
  const int C = 3, H = 3, W = 5, HW = H * W;
  std::vector<uint8_t> rgb(static_cast<size_t>(C * HW));
  for (int c = 0; c < C; ++c)
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) rgb[size_t((c * H + y) * W + x)] = uint8_t(7 + 80 * c + 20 * y + 3 * x);
  write_file(d / "rgb.png", handmade_png(rgb, C, H, W));
  for (int64_t want : {0, 3}) {
    SCOPED_TRACE("channels " + std::to_string(want));
    const Image im = read_image_file((d / "rgb.png").string(), want);
    EXPECT_EQ(im.channels, 3);
    EXPECT_EQ(im.height, H);
    EXPECT_EQ(im.width, W);
    EXPECT_EQ(im.pixels, rgb);
  }
  const Image grey = read_image_file((d / "rgb.png").string(), 1);
  ASSERT_EQ(grey.channels, 1);
  ASSERT_EQ(grey.height, H);
  ASSERT_EQ(grey.width, W);
  ASSERT_EQ(grey.pixels.size(), size_t(HW));
  for (int i = 0; i < HW; ++i) {
    const int r = rgb[size_t(i)], g = rgb[size_t(HW + i)], b = rgb[size_t(2 * HW + i)];
    EXPECT_NEAR(int(grey.pixels[size_t(i)]), (77 * r + 150 * g + 29 * b) >> 8, 1) << "pixel " << i;
  }
  std::vector<uint8_t> g1(static_cast<size_t>(HW));
  for (int i = 0; i < HW; ++i) g1[size_t(i)] = uint8_t(3 + 16 * i);
  write_file(d / "grey.png", handmade_png(g1, 1, H, W));
  const Image g3 = read_image_file((d / "grey.png").string(), 3);
  ASSERT_EQ(g3.channels, 3);
  ASSERT_EQ(g3.pixels.size(), size_t(3 * HW));
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < HW; ++i) EXPECT_EQ(g3.pixels[size_t(c * HW + i)], g1[size_t(i)]) << c << "," << i;
  const Image g0 = read_image_file((d / "grey.png").string());
  EXPECT_EQ(g0.channels, 1);
  EXPECT_EQ(g0.pixels, g1);

  const std::string enc = encode_png(rgb.data(), C, H, W);
  int dc = 0, dh = 0, dw = 0;
  const std::vector<uint8_t> inter = decode_png(enc, &dc, &dh, &dw);
  ASSERT_EQ(dc, C);
  ASSERT_EQ(dh, H);
  ASSERT_EQ(dw, W);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < C; ++c)
        EXPECT_EQ(inter[size_t((y * W + x) * C + c)], rgb[size_t((c * H + y) * W + x)]) << y << "," << x << "," << c;
  write_file(d / "enc.png", enc);
  EXPECT_EQ(read_image_file((d / "enc.png").string(), 3).pixels, rgb);
  fs::remove_all(d);
}
