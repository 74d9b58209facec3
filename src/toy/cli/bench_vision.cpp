// `toy bench vision`: ViT training speed (images/s: forward + label-smoothed cross-entropy +
// backward + clipping + AdamW) of toy against a plain PyTorch peer of the same model
// (bench/peers/vit_peer.py, Debian's python3-torch on OpenBLAS), and inference speed (a
// batched forward, what `toy classify` runs) of both.
//   vit_tiny_224  DeiT-Tiny at 224x224x3, batch 16 (large GEMMs dominate)
//   vit_mnist_28  vit-mnist at 28x28x1, batch 128
// Fairness as in `toy bench train`: toy and the peer are timed in alternation (toy, peer at 1
// thread, peer at 2 threads, toy, ...), medians per side, the peer at its better thread count;
// each peer repetition is a fresh process with its own warm-up steps.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/rng.h"
#include "toy/core/runtime.h"
#include "toy/models/vit.h"
#include "toy/ops/ops.h"
#include "toy/train/loop.h"
#include "toy/train/optimizer.h"

namespace toy::cli {

namespace {

struct VisionBenchOptions {
  bool json = false, no_peer = false;
  int reps = 3, threads = 0;
  std::string only, python = "/usr/bin/python3", peer_script;
  Device device = Device::CPU;
};

struct VisionCase {
  const char* name;
  const char* preset;
  int64_t batch, steps, classes;
  double target;  // toy / peer training images/s the issue asks for
};
constexpr VisionCase kCases[] = {{"vit_tiny_224", "vit-tiny", 16, 2, 1000, 1.2},
                                 {"vit_mnist_28", "vit-mnist", 128, 4, 10, 1.5}};

// The toy side of one case: the model, a fixed random batch and its optimizer; a step is the
// training loop's (train/loop.h take_step) on that batch.
class ToyVit : public TrainTask {
 public:
  ToyVit(const VisionCase& c, Device device) : cfg_(VitConfig::from_preset(c.preset)), batch_(c.batch) {
    cfg_.classes = c.classes;
    model_ = std::make_unique<Vit>(cfg_);
    model_->init(1);
    model_->params().move_to(device);  // the images and labels are uploaded each step, as training does
    Generator g(1, 99);
    std::vector<uint8_t> px(size_t(batch_ * cfg_.channels * cfg_.image * cfg_.image));
    for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(g.block(i)[0]);
    x_ = model_->input(px.data(), batch_);
    std::vector<int32_t> y;
    for (int64_t i = 0; i < batch_; ++i) y.push_back(int32_t(g.block(1u << 30 | uint64_t(i))[0] % c.classes));
    y_ = from_vector(y, Shape{batch_});
    opt_ = std::make_unique<AdamW>(model_->params(), AdamWConfig{0.9f, 0.999f, 1e-8f, 0.05f});
  }
  Tensor micro_loss(const MicroBatch&, int64_t& units) override {
    units += batch_;
    return classification_loss(model_->logits(x_), y_, 0.1f);
  }
  void train_step() {
    StepSettings s;
    s.who = "[bench vision]";
    s.clip = 1.0;
    take_step(*this, model_->params(), *opt_, unscaled_, s, 1e-4f);
  }
  void infer_step() {
    NoGradGuard ng;
    model_->logits(x_);
  }
  const VitConfig& config() const { return cfg_; }

 private:
  VitConfig cfg_;
  int64_t batch_;
  std::unique_ptr<Vit> model_;
  std::unique_ptr<AdamW> opt_;
  DynamicLossScale unscaled_{1.0f};
  Tensor x_, y_;
};

// One peer process; its images/s, or an error.
std::optional<double> run_peer(const VisionBenchOptions& o, const std::string& script, const VisionCase& c,
                               const VitConfig& m, int threads, const char* mode, std::string& error) {
  const std::string cmd = fmt::format(
      "{} {} --image {} --channels {} --patch {} --dim {} --layers {} --heads {} --mlp {} --classes {} --batch {} "
      "--steps {} --warmup 1 --threads {} --mode {} 2>&1",
      shell_quote(o.python), shell_quote(script), m.image, m.channels, m.patch, m.dim, m.layers, m.heads, m.mlp,
      c.classes, c.batch, c.steps, threads, mode);
  const PeerOutput out = run_peer_command(cmd, "images_per_s", o.python);
  if (!out.result) {
    error = out.error;
    return std::nullopt;
  }
  return (*out.result)["images_per_s"].get<double>();
}

int run_vision_bench(const VisionBenchOptions& o) {
  if (o.threads) set_num_threads(o.threads);
  const std::string script =
      o.peer_script.empty() ? std::string(TOY_SOURCE_DIR) + "/bench/peers/vit_peer.py" : o.peer_script;
  std::string unavailable;
  std::error_code ec;
  if (o.no_peer) unavailable = "--no-peer given";
  else if (!std::filesystem::exists(o.python, ec)) unavailable = o.python + " not found (apt-get install python3-torch)";
  else if (!std::filesystem::exists(script, ec)) unavailable = "peer script " + script + " not found";
  if (!o.json)
    std::printf("toy bench vision on %s, %d threads%s\n", cpu_label().c_str(), num_threads(),
                o.device == Device::CPU ? "" : fmt::format(", toy on device {}", name(o.device)).c_str());
  for (const VisionCase& c : kCases) {
    if (!o.only.empty() && o.only != c.name) continue;
    ToyVit toy(c, o.device);
    std::vector<double> toy_train, toy_infer;
    std::vector<std::vector<double>> peer_train(std::size(kPeerThreads)), peer_infer(std::size(kPeerThreads));
    std::string peer_error = unavailable;
    toy.train_step();  // warm-up (allocations, page faults)
    toy.infer_step();
    for (int rep = 0; rep < o.reps; ++rep) {
      toy_train.push_back(double(c.batch * c.steps) / median_seconds([&] {
        for (int64_t s = 0; s < c.steps; ++s) toy.train_step();
      }, 1, 0));
      toy_infer.push_back(double(c.batch * c.steps) / median_seconds([&] {
        for (int64_t s = 0; s < c.steps; ++s) toy.infer_step();
      }, 1, 0));
      for (size_t t = 0; t < std::size(kPeerThreads) && peer_error.empty(); ++t) {
        auto tr = run_peer(o, script, c, toy.config(), kPeerThreads[t], "train", peer_error);
        if (!tr) break;
        peer_train[t].push_back(*tr);
        auto in = run_peer(o, script, c, toy.config(), kPeerThreads[t], "infer", peer_error);
        if (!in) break;
        peer_infer[t].push_back(*in);
      }
    }
    nlohmann::json j = {{"case", c.name},
                        {"images_per_s", median(toy_train)},
                        {"infer_images_per_s", median(toy_infer)},
                        {"batch", c.batch},
                        {"threads", num_threads()},
                        {"target", c.target},
                        {"cpu", cpu_name()}};
    if (peer_error.empty()) {
      double best = 0, best_infer = 0;
      int best_threads = 0;
      for (size_t t = 0; t < std::size(kPeerThreads); ++t) {
        if (median(peer_train[t]) > best) best = median(peer_train[t]), best_threads = kPeerThreads[t];
        best_infer = std::max(best_infer, median(peer_infer[t]));
      }
      j["peer_images_per_s"] = best;
      j["peer_threads"] = best_threads;
      j["ratio"] = median(toy_train) / best;
      j["peer_infer_images_per_s"] = best_infer;
      j["infer_ratio"] = median(toy_infer) / best_infer;
    } else {
      j["peer_images_per_s"] = nullptr;
      j["ratio"] = nullptr;
      j["peer_error"] = peer_error;
    }
    if (o.json) {
      std::printf("%s\n", bench_line(j).c_str());
    } else {
      std::printf("%-14s train %8.1f img/s", c.name, median(toy_train));
      if (peer_error.empty())
        std::printf("  PyTorch %8.1f img/s (%d thr)  ratio %.2fx (target %.1fx)", j["peer_images_per_s"].get<double>(),
                    j["peer_threads"].get<int>(), j["ratio"].get<double>(), c.target);
      else
        std::printf("  (no peer: %s)", peer_error.c_str());
      std::printf("\n%-14s infer %8.1f img/s", "", median(toy_infer));
      if (peer_error.empty())
        std::printf("  PyTorch %8.1f img/s          ratio %.2fx", j["peer_infer_images_per_s"].get<double>(),
                    j["infer_ratio"].get<double>());
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Run add_bench_vision_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("vision", "ViT training and inference images/s against a PyTorch peer");
  auto o = std::make_shared<VisionBenchOptions>();
  cmd->add_flag("--json", o->json, "One JSON object per case per line");
  add_int(cmd, "--reps", o->reps, 1, 100, "Alternating repetitions per side (median reported)");
  add_int(cmd, "--threads", o->threads, 1, kMaxThreads, "toy's threads (default: all cores)");
  cmd->add_option("--case", o->only, "vit_tiny_224 or vit_mnist_28 only");
  cmd->add_option("--python", o->python, "The Python with torch for the peer")->capture_default_str();
  cmd->add_option("--peer-script", o->peer_script, "The peer script (default: bench/peers/vit_peer.py)");
  cmd->add_flag("--no-peer", o->no_peer, "toy only");
  add_device(cmd, o->device);
  return [o]() -> int { return run_vision_bench(*o); };
}

}  // namespace toy::cli
