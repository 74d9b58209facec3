// toy vision train / eval / classify on a small synthetic data set (learnable in seconds):
// bit-exact resume, refusals, the run folder's outputs, the JSON interfaces, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "proc.h"
#include "toy/core/error.h"
#include "toy/ops/ops.h"
#include "toy/autograd/grad_mode.h"
#include "toy/data/images.h"
#include "toy/io/vit_file.h"
#include "toy/train/vision.h"

using namespace toy;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("toy_vision_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// n 8x8 images of 3 classes: a bright bar in the top, middle or bottom rows, plus noise.
void write_bars_csv(const fs::path& p, int n, uint64_t seed) {
  std::ofstream f(p);
  Generator g(seed, 1);
  for (int i = 0; i < n; ++i) {
    const int cls = i % 3;
    for (int k = 0; k < 64; ++k) {
      const int row = k / 8;
      const bool bar = row / 3 == cls || (cls == 2 && row == 7);
      const int noise = int(g.block(uint64_t(i) * 64 + uint64_t(k))[0] % 5);
      f << (bar ? 11 + noise : noise) << ',';
    }
    f << cls << '\n';
  }
}

VisionTrainOptions small_run(const fs::path& data, const fs::path& out) {
  VisionTrainOptions o;
  o.data = data.string();
  o.out = out.string();
  o.model = VitConfig::from_preset("vit-digits");
  o.model.dim = 32, o.model.layers = 2, o.model.heads = 2, o.model.mlp = 64;
  o.model.image = 2, o.model.classes = 3;  // the data's are filled in
  o.epochs = 3;
  o.batch = 16;
  o.warmup = 5;
  o.lr = 3e-3f;
  o.crop_pad = 1;  // exercises augmentation's counters across the resume
  o.flip = true;
  o.threads = 2;
  o.save_minutes = 0;
  o.quiet = true;
  return o;
}

std::string bytes_of(const fs::path& p) { return test::read_all(p.string()); }

}  // namespace

TEST(VisionTrain, StoppedAndResumedRunEqualsAStraightRunBitForBit) {
  const fs::path d = scratch("resume");
  write_bars_csv(d / "bars.csv", 240, 1);
  VisionTrainOptions a = small_run(d / "bars.csv", d / "straight");
  const VisionTrainResult ra = train_vision(a);
  EXPECT_FALSE(ra.stopped);
  EXPECT_GT(ra.test_accuracy, 0.6);  // it learns something in three small epochs
  VisionTrainOptions b = small_run(d / "bars.csv", d / "stopped");
  b.stop_after = 23;  // mid-way through the last epoch (10 steps per epoch)
  const VisionTrainResult rb = train_vision(b);
  EXPECT_TRUE(rb.stopped);
  EXPECT_EQ(rb.steps, 23);
  const VisionTrainResult rc = resume_vision((d / "stopped").string());
  EXPECT_FALSE(rc.stopped);
  EXPECT_EQ(rc.steps, ra.steps);
  EXPECT_EQ(rc.test_accuracy, ra.test_accuracy);
  EXPECT_EQ(rc.train_loss, ra.train_loss);
  EXPECT_EQ(rc.train_accuracy, ra.train_accuracy);
  EXPECT_EQ(rc.best_epoch, ra.best_epoch);
  for (const char* f : {"model.gguf", "last.gguf"})
    EXPECT_EQ(bytes_of(d / "straight" / f), bytes_of(d / "stopped" / f)) << f;
  // The report shows the curves, the confusion matrix and the mistakes.
  const std::string html = bytes_of(d / "stopped" / "report.html");
  EXPECT_NE(html.find("Accuracy by epoch"), std::string::npos);
  EXPECT_NE(html.find("Confusion matrix"), std::string::npos);
  // A finished run refuses to go on without more epochs; with more it continues.
  try {
    resume_vision((d / "stopped").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already finished"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

// --precision bf16: the projections multiply in BF16 over F32 masters (AMX / AVX512-BF16 where
// the CPU has them, else the rounded values' f32 widenings). The run differs from f32 (so the
// rounding is on) and stays within BF16's tolerance of it; a stopped bf16 run resumed gives
// the straight bf16 run bit for bit; a resume may change the precision, which the checkpoint's
// options then hold.
TEST(VisionTrain, Bf16PrecisionStaysWithinBf16ToleranceOfF32AndResumesBitForBit) {
  const fs::path d = scratch("bf16");
  write_bars_csv(d / "bars.csv", 240, 1);
  const VisionTrainResult f32 = train_vision(small_run(d / "bars.csv", d / "f32"));
  VisionTrainOptions o = small_run(d / "bars.csv", d / "bf16");
  o.precision = "bf16";
  const VisionTrainResult bf16 = train_vision(o);
  EXPECT_NE(bf16.train_loss, f32.train_loss) << "no rounding happened";
  EXPECT_NEAR(bf16.train_loss, f32.train_loss, 0.03 * f32.train_loss);
  EXPECT_NEAR(bf16.test_loss, f32.test_loss, 0.03 * f32.test_loss);
  EXPECT_NEAR(bf16.test_accuracy, f32.test_accuracy, 0.03);
  o.out = (d / "stopped").string();
  o.stop_after = 23;
  train_vision(o);
  const VisionTrainResult resumed = resume_vision((d / "stopped").string());
  EXPECT_EQ(resumed.train_loss, bf16.train_loss);
  EXPECT_EQ(resumed.test_accuracy, bf16.test_accuracy);
  EXPECT_EQ(bytes_of(d / "bf16" / "model.gguf"), bytes_of(d / "stopped" / "model.gguf"));
  // Resumed in f32 for its last epoch: the f32 run's last epoch from bf16 weights.
  VisionTrainOptions p = small_run(d / "bars.csv", d / "switched");
  p.precision = "bf16";
  p.stop_after = 20;
  train_vision(p);
  const VisionTrainResult switched =
      resume_vision((d / "switched").string(), [](VisionTrainOptions& saved) { saved.precision = "f32"; });
  EXPECT_NE(switched.train_loss, bf16.train_loss);
  EXPECT_NEAR(switched.train_loss, f32.train_loss, 0.03 * f32.train_loss);
  fs::remove_all(d);
}

TEST(VisionTrain, ResumeRefusesChangedData) {
  const fs::path d = scratch("changed");
  write_bars_csv(d / "bars.csv", 120, 1);
  VisionTrainOptions o = small_run(d / "bars.csv", d / "run");
  o.stop_after = 3;
  train_vision(o);
  write_bars_csv(d / "bars.csv", 120, 2);
  try {
    resume_vision((d / "run").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed since the checkpoint"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(VisionTrain, CliTrainsEvaluatesAndClassifiesWithTheDocumentedJson) {
  const fs::path d = scratch("cli");
  write_bars_csv(d / "bars.csv", 240, 3);
  const std::string out = (d / "run").string();
  test::ProcResult r = test::run_toy({"vision", "train", "--data", (d / "bars.csv").string(), "--preset", "vit-digits",
                                      "--dim", "32", "--layers", "2", "--heads", "2", "--mlp", "64", "--epochs", "3",
                                      "--batch", "16", "--warmup", "5", "--lr", "3e-3", "--out", out, "--json"});
  ASSERT_EQ(r.status, 0) << test::describe(r);
  const std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  const auto j = nlohmann::json::parse(last);
  for (const char* k : {"epochs", "train_loss", "test_accuracy", "images_per_s", "seconds", "out"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["epochs"], 3);
  EXPECT_GE(j["test_accuracy"].get<double>(), 0.0);
  EXPECT_LE(j["test_accuracy"].get<double>(), 1.0);
  for (const char* f : {"model.gguf", "last.gguf", "checkpoint.gguf", "events.jsonl", "report.html"})
    EXPECT_TRUE(fs::exists(d / "run" / f)) << f;
  // eval: the whole CSV (no official test split) -> {"accuracy", "n"}.
  r = test::run_toy({"vision", "eval", "-m", out + "/model.gguf", "--data", (d / "bars.csv").string(), "--json"});
  ASSERT_EQ(r.status, 0) << test::describe(r);
  const auto e = nlohmann::json::parse(r.out);
  EXPECT_EQ(e["n"], 240);
  EXPECT_GT(e["accuracy"].get<double>(), 0.6);
  // classify: PNG files, any size and channel count, resized and converted.
  auto m = load_vit(out + "/model.gguf");
  std::vector<uint8_t> px(16 * 16 * 3, 0);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 16; ++x)
      for (int c = 0; c < 3; ++c) px[size_t(c * 256 + y * 16 + x)] = 220;  // a bar in the top rows
  {
    std::ofstream(d / "top.png", std::ios::binary) << encode_png(px.data(), 3, 16, 16);
  }
  r = test::run_toy({"classify", "-m", out + "/model.gguf", (d / "top.png").string(), (d / "top.png").string(),
                     "--json"});
  ASSERT_EQ(r.status, 0) << test::describe(r);
  size_t lines = 0, pos = 0;
  while ((pos = r.out.find('\n', pos)) != std::string::npos) ++lines, ++pos;
  EXPECT_EQ(lines, 2u);
  const auto c = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(c["file"], (d / "top.png").string());
  ASSERT_EQ(c["top"].size(), 3u);  // top-5 of 3 classes
  double total = 0;
  for (const auto& t : c["top"]) total += t["prob"].get<double>();
  EXPECT_NEAR(total, 1.0, 1e-4);
  EXPECT_TRUE(c["top"][0]["label"].is_string());
  {
    // The ranking: the model's own probabilities for that image, largest first.
    const Image im = read_image_file((d / "top.png").string(), m->config().channels, m->config().image,
                                     m->config().image);
    NoGradGuard ng;
    const std::vector<float> p = softmax(m->logits(m->input(im.pixels.data(), 1))).to_f32_vector();
    std::vector<size_t> order(p.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    ASSERT_GT(p[order[0]], p[order[1]] + 1e-3) << "a clear first class (else the order would prove little)";
    for (size_t k = 0; k < c["top"].size(); ++k) {
      EXPECT_EQ(c["top"][k]["label"], m->config().class_names[order[k]]) << "rank " << k;
      EXPECT_NEAR(c["top"][k]["prob"].get<double>(), p[order[k]], 1e-5) << "rank " << k;
    }
  }
  // eval on class folders matches them to the model's classes by name: a set holding only
  // the folder "2" is all class 2 (the sorted position 0 once made it class "0"), and a folder
  // the model has no class for is refused by name.
  {
    const VitConfig& mc = m->config();
    std::vector<uint8_t> img(size_t(mc.channels * mc.image * mc.image), 40);
    fs::create_directories(d / "only2" / "2");
    for (int i = 0; i < 3; ++i)
      std::ofstream(d / "only2" / "2" / ("i" + std::to_string(i) + ".png"), std::ios::binary)
          << encode_png(img.data(), mc.channels, mc.image, mc.image);
    r = test::run_toy({"vision", "eval", "-m", out + "/model.gguf", "--data", (d / "only2").string(), "--json"});
    ASSERT_EQ(r.status, 0) << test::describe(r);
    const auto ev = nlohmann::json::parse(r.out);
    EXPECT_EQ(ev["n"], 3);
    int64_t row2 = 0;
    for (const auto& v : ev["confusion"][2]) row2 += v.get<int64_t>();
    EXPECT_EQ(row2, 3) << "every image's true class is '2': " << r.out;
    fs::rename(d / "only2" / "2", d / "only2" / "cow");
    r = test::run_toy({"vision", "eval", "-m", out + "/model.gguf", "--data", (d / "only2").string()});
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("'cow' is not one of the model's classes"), std::string::npos) << r.err;
  }
  // Bad input: an unreadable image and a model that is not a ViT, each named. A bad file
  // among good ones (here an empty PGM, which once crashed the whole batch) is reported in its
  // place and the others are still classified; the exit status says one failed.
  std::ofstream(d / "bad.png") << "garbage";
  r = test::run_toy({"classify", "-m", out + "/model.gguf", (d / "bad.png").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("bad.png"), std::string::npos) << r.err;
  std::ofstream(d / "empty.pgm", std::ios::binary) << "P5\n0 0\n255\n";
  r = test::run_toy({"classify", "-m", out + "/model.gguf", (d / "empty.pgm").string(), (d / "top.png").string(),
                     "--json"});
  EXPECT_EQ(r.status, 1) << test::describe(r);
  EXPECT_NE(r.err.find("empty.pgm"), std::string::npos) << r.err;
  {
    std::istringstream lines_of(r.out);
    std::string first, second;
    std::getline(lines_of, first), std::getline(lines_of, second);
    const auto bad = nlohmann::json::parse(first), good = nlohmann::json::parse(second);
    EXPECT_EQ(bad["file"], (d / "empty.pgm").string());
    EXPECT_TRUE(bad.contains("error")) << first;
    EXPECT_EQ(good["file"], (d / "top.png").string());
    ASSERT_EQ(good["top"].size(), c["top"].size());
    for (size_t k = 0; k < c["top"].size(); ++k) {  // (the batch's rows: the same up to the GEMM's rounding)
      EXPECT_EQ(good["top"][k]["label"], c["top"][k]["label"]) << "the good file is classified as when alone";
      EXPECT_NEAR(good["top"][k]["prob"].get<double>(), c["top"][k]["prob"].get<double>(), 1e-5);
    }
  }
  r = test::run_toy({"vision", "eval", "-m", (d / "bars.csv").string(), "--data", (d / "bars.csv").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("bars.csv"), std::string::npos) << r.err;
  // Images of another size than the model's are refused by name.
  {
    std::ofstream f(d / "big.csv");
    for (int i = 0; i < 4; ++i) {
      for (int k = 0; k < 100; ++k) f << 1 << ',';
      f << 0 << '\n';
    }
  }
  r = test::run_toy({"vision", "eval", "-m", out + "/model.gguf", "--data", (d / "big.csv").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("big.csv"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("10x10"), std::string::npos) << r.err;
  // A resume may not change what the run is.
  r = test::run_toy({"vision", "train", "--resume", out, "--lr", "1e-2"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--lr cannot be given with --resume"), std::string::npos) << r.err;
  fs::remove_all(d);
}

TEST(VisionTrain, CtrlCWritesACheckpointAndResumeFinishesTheRun) {
  const fs::path d = scratch("sigint");
  write_bars_csv(d / "bars.csv", 240, 4);
  const std::string out = (d / "run").string();
  size_t seen = 0;
  test::ProcResult r = test::interrupt_toy_after_steps(
      {"vision", "train", "--data", (d / "bars.csv").string(), "--preset", "vit-digits", "--dim", "32", "--layers", "2",
       "--heads", "2", "--mlp", "64", "--epochs", "400", "--batch", "16", "--out", out, "--json"},
      out + "/events.jsonl", 3, &seen);
  ASSERT_EQ(r.status, 128 + SIGINT) << "a run a signal stopped is no success: " << test::describe(r);
  const auto j = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_TRUE(j["stopped"].get<bool>());
  EXPECT_GE(j["steps"].get<int64_t>(), int64_t(seen));
  EXPECT_TRUE(fs::exists(d / "run" / "checkpoint.gguf"));
  EXPECT_TRUE(fs::exists(d / "run" / "model.gguf"));
  // Two epochs (10 steps each) past where it stopped.
  const std::string epochs = std::to_string(j["steps"].get<int64_t>() / 10 + 2);
  r = test::run_toy({"vision", "train", "--resume", out, "--epochs", epochs, "--json"});
  ASSERT_EQ(r.status, 0) << test::describe(r);
  const auto k = nlohmann::json::parse(r.out.substr(r.out.rfind('{')));
  EXPECT_FALSE(k["stopped"].get<bool>());
  EXPECT_EQ(k["epochs"].get<int64_t>(), std::stoll(epochs));
  fs::remove_all(d);
}

namespace {

void put_be32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s.push_back(char((v >> (8 * k)) & 0xff));
}

// A Fashion-MNIST-shaped folder (its four IDX file names, 28x28, labels 0..9) of n training images.
void write_fashion_like(const fs::path& dir, int n_train, int n_test) {
  fs::create_directories(dir);
  auto write = [&](const std::string& name, int n, bool images) {
    std::string s;
    put_be32(s, images ? 0x803 : 0x801), put_be32(s, uint32_t(n));
    if (images) put_be32(s, 28), put_be32(s, 28);
    for (int i = 0; i < n * (images ? 28 * 28 : 1); ++i) s.push_back(char(images ? (i * 7) % 251 : (i % 10)));
    std::ofstream(dir / name, std::ios::binary) << s;
  };
  write("train-images-idx3-ubyte", n_train, true), write("train-labels-idx1-ubyte", n_train, false);
  write("t10k-images-idx3-ubyte", n_test, true), write("t10k-labels-idx1-ubyte", n_test, false);
}

// The options a run saved at its start (events.jsonl's run_start config).
nlohmann::json saved_config(const fs::path& run) {
  std::ifstream f(run / "events.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto e = nlohmann::json::parse(line);
    if (e.value("event", "") == "run_start") return e["config"];
  }
  ADD_FAILURE() << "no run_start event in " << run;
  return {};
}

}  // namespace

TEST(VisionTrain, AugmentationDefaultsToCropAndFlipForFashionMnistOnly) {
  ImageSet s;
  s.channels = 1, s.height = 28, s.width = 28;
  s.classes = fashion_mnist_classes();
  EXPECT_EQ(augmentation_defaults(s).crop_pad, 2);
  EXPECT_TRUE(augmentation_defaults(s).flip);
  s.classes = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};  // MNIST digits: never flipped
  EXPECT_EQ(augmentation_defaults(s).crop_pad, 0);
  EXPECT_FALSE(augmentation_defaults(s).flip);
  s.classes = fashion_mnist_classes();
  s.height = s.width = 8;
  EXPECT_EQ(augmentation_defaults(s).crop_pad, 0);

  // Through the command line: the resolved values are what the run saves (and resumes with).
  const fs::path d = scratch("augdefaults");
  write_fashion_like(d / "fashion-mnist", 120, 20);
  write_bars_csv(d / "bars.csv", 60, 5);
  auto train = [&](const std::string& data, const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"vision", "train", "--data", data, "--preset", "vit-digits", "--dim", "16",
                                     "--layers", "1", "--heads", "1", "--mlp", "16", "--batch", "8",
                                     "--stop-after", "1", "--quiet", "--out", (d / out).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    const test::ProcResult r = test::run_toy(args);
    EXPECT_EQ(r.status, 0) << test::describe(r);
    return saved_config(d / out);
  };
  nlohmann::json c = train((d / "fashion-mnist").string(), "fashion", {"--patch", "7"});
  EXPECT_EQ(c["crop_pad"], 2);
  EXPECT_EQ(c["flip"], true);
  c = train((d / "fashion-mnist").string(), "fashion_told", {"--patch", "7", "--no-flip", "--crop-pad", "1"});
  EXPECT_EQ(c["crop_pad"], 1);
  EXPECT_EQ(c["flip"], false);
  c = train((d / "bars.csv").string(), "bars", {});
  EXPECT_EQ(c["crop_pad"], 0);
  EXPECT_EQ(c["flip"], false);
  c = train((d / "bars.csv").string(), "bars_told", {"--flip"});
  EXPECT_EQ(c["flip"], true);
  const test::ProcResult both = test::run_toy({"vision", "train", "--data", (d / "bars.csv").string(), "--flip",
                                                "--no-flip", "--out", (d / "both").string()});
  EXPECT_NE(both.status, 0);
  fs::remove_all(d);
}
