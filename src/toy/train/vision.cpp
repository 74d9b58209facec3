#include "toy/train/vision.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/backward.h"
#include "toy/core/files.h"
#include "toy/core/json_fields.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/data/labels.h"
#include "toy/io/gguf.h"
#include "toy/io/vit_file.h"
#include "toy/models/config.h"
#include "toy/obs/events.h"
#include "toy/obs/progress.h"
#include "toy/obs/report.h"
#include "toy/ops/ops.h"
#include "toy/train/optimizer.h"
#include "toy/train/run_folder.h"
#include "toy/train/run_state.h"
#include "toy/train/step.h"
#include "toy/train/trainer.h"

namespace fs = std::filesystem;

namespace toy {

namespace {
constexpr uint64_t kOrderStream = 1u << 24;  // + epoch: that epoch's order
constexpr uint64_t kAugStream = 7;
constexpr uint32_t kVisionCheckpointVersion = 1;
}  // namespace

// ---- options ------------------------------------------------------------------------------------

void VisionTrainOptions::validate() const {
  TOY_CHECK(!out.empty(), "[vision] --out (the run folder) is required");
  TOY_CHECK(!data.empty(), "[vision] --data is required");
  TOY_CHECK(epochs >= 1 && epochs <= 100000, "[vision] --epochs must be in 1..100000, got {}", epochs);
  validate_loop("[vision]");
  // From scratch, a step larger than 1 or a decay of the whole weight each step is a typo.
  TOY_CHECK(lr <= 1, "[vision] --lr must be in (0, 1], got {}", lr);
  TOY_CHECK(weight_decay < 1, "[vision] --wd must be in [0, 1), got {}", weight_decay);
  TOY_CHECK(std::isfinite(min_lr), "[vision] --min-lr must be in [0, lr], got {}", min_lr);
  TOY_CHECK(label_smoothing >= 0 && label_smoothing < 1, "[vision] --label-smoothing must be in [0, 1), got {}",
            label_smoothing);
  TOY_CHECK(!crop_pad || (*crop_pad >= 0 && *crop_pad <= 64), "[vision] --crop-pad must be in 0..64, got {}",
            crop_pad.value_or(0));
  TOY_CHECK(val_count >= 1, "[vision] --val-count must be >= 1, got {}", val_count);
  TOY_CHECK(threads >= 0 && threads <= kMaxThreads, "[vision] --threads must be in 0..{}, got {}", kMaxThreads,
            threads);
  TOY_CHECK(keep == "best" || keep == "last", "[vision] --keep must be best or last, got '{}'", printable(keep));
  TOY_CHECK(precision == "f32" || precision == "bf16", "[vision] --precision must be f32 or bf16, got '{}'",
            printable(precision));
  TOY_CHECK(misclassified >= 0 && misclassified <= 1000, "[vision] misclassified images shown must be in 0..1000");
  VitConfig m = model;
  m.validate();
}

nlohmann::json VisionTrainOptions::to_json() const {
  nlohmann::json j = {{"data", data},
                      {"out", out},
                      {"preset", preset},
                      {"model", model.to_json()},
                      {"epochs", epochs},
                      {"label_smoothing", json_float(label_smoothing)},
                      {"crop_pad", crop_pad ? nlohmann::json(*crop_pad) : nlohmann::json()},  // null: the data's default
                      {"flip", flip ? nlohmann::json(*flip) : nlohmann::json()},
                      {"val_count", val_count},
                      {"threads", threads},
                      {"keep", keep},
                      {"precision", precision},
                      {"misclassified", misclassified}};
  loop_to_json(j);
  return j;
}

VisionTrainOptions VisionTrainOptions::from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  VisionTrainOptions o;
  o.data = get_string(j, "data", where);
  o.out = get_string(j, "out", where);
  o.preset = get_string(j, "preset", where);
  o.model = VitConfig::from_json(get_object(j, "model", where), where + " model");
  o.epochs = get_int(j, "epochs", where);
  o.loop_from_json(j, where);
  o.label_smoothing = get_float(j, "label_smoothing", where);
  o.crop_pad = get_int(j, "crop_pad", where);
  o.flip = get_bool(j, "flip", where);
  o.val_count = get_int(j, "val_count", where);
  const int64_t threads = get_int(j, "threads", where);
  TOY_CHECK(threads >= 0 && threads <= kMaxThreads, "{}: threads {} is outside 0..{}", where, threads, kMaxThreads);
  o.threads = int(threads);
  o.keep = get_string(j, "keep", where);
  // (runs made before mixed precision have no such field: they trained in f32)
  o.precision = j.contains("precision") ? get_string(j, "precision", where) : "f32";
  o.misclassified = get_int(j, "misclassified", where);
  try {
    o.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return o;
}

// ---- evaluation ---------------------------------------------------------------------------------

std::vector<double> Evaluation::per_class() const {
  std::vector<double> r;
  for (size_t c = 0; c < confusion.size(); ++c) {
    int64_t n = 0;
    for (int64_t v : confusion[c]) n += v;
    r.push_back(n ? double(confusion[c][c]) / double(n) : NAN);
  }
  return r;
}

void check_images_fit(const Vit& m, const ImageSet& s) {
  const VitConfig& c = m.config();
  TOY_CHECK(s.channels == c.channels && s.height == c.image && s.width == c.image,
            "[vision] '{}' holds {}x{} images with {} channel(s); the model takes {}x{} with {}", printable(s.source),
            s.width, s.height, s.channels, c.image, c.image, c.channels);
  for (int64_t i = 0; i < s.size(); ++i)
    TOY_CHECK(s.labels[size_t(i)] >= 0 && s.labels[size_t(i)] < c.classes,
              "[vision] '{}': image {} has label {}, outside the model's {} classes", printable(s.source), i,
              s.labels[size_t(i)], c.classes);
}

void match_classes_to_model(ImageSet& s, const VitConfig& c) {
  bool numbered = true;
  for (size_t k = 0; k < s.classes.size(); ++k) numbered = numbered && s.classes[k] == std::to_string(k);
  if (numbered) {  // (IDX, CSV) a label is a class number
    for (int64_t i = 0; i < s.size(); ++i)
      TOY_CHECK(s.labels[size_t(i)] >= 0 && s.labels[size_t(i)] < c.classes,
                "[vision] '{}': image {} has label {}, outside the model's {} classes", printable(s.source), i,
                s.labels[size_t(i)], c.classes);
    s.classes = c.class_names;
    return;
  }
  std::vector<int32_t> to_model(s.classes.size(), -1);
  for (size_t k = 0; k < s.classes.size(); ++k) {
    const auto it = std::find(c.class_names.begin(), c.class_names.end(), s.classes[k]);
    TOY_CHECK(it != c.class_names.end(), "[vision] '{}': class '{}' is not one of the model's classes ({})",
              printable(s.source), printable(s.classes[k]), fmt::format("{}", fmt::join(c.class_names, ", ")));
    to_model[k] = int32_t(it - c.class_names.begin());
  }
  for (int32_t& l : s.labels) l = to_model[size_t(l)];
  s.classes = c.class_names;
}

int64_t check_training_classes(const ImageSet& train, const std::string& source) {
  const int64_t K = int64_t(train.classes.size());
  std::vector<int64_t> count(size_t(K), 0);
  for (int32_t l : train.labels)
    if (l >= 0 && l < K) ++count[size_t(l)];
  const int64_t empty = int64_t(std::count(count.begin(), count.end(), int64_t(0)));
  TOY_CHECK(2 * empty <= K, "[vision] '{}': the labels make {} classes (0..{}), but only {} of them have training "
            "images: labels must be class numbers 0..K-1 (or use class folders)", printable(source), K, K - 1,
            K - empty);
  return empty;
}

Evaluation evaluate(const Vit& m, const ImageSet& s, int64_t batch) {
  check_images_fit(m, s);
  NoGradGuard ng;
  const int64_t K = m.config().classes;
  Evaluation e;
  e.n = s.size();
  e.confusion.assign(size_t(K), std::vector<int64_t>(size_t(K), 0));
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t at = 0; at < s.size(); at += batch) {
    const int64_t n = std::min(batch, s.size() - at);
    Tensor logits = m.logits(m.input(s.image(at), n));
    std::vector<int32_t> ids(s.labels.begin() + at, s.labels.begin() + at + n);
    loss_sum += cross_entropy(logits, to(labels::class_ids(ids, K), logits.device())).item() * double(n);
    Tensor probs = softmax(logits);
    const std::vector<float> p = probs.to_f32_vector();
    for (int64_t i = 0; i < n; ++i) {
      const float* row = p.data() + i * K;
      const int32_t pred = int32_t(std::max_element(row, row + K) - row);
      e.predicted.push_back(pred);
      e.confidence.push_back(row[pred]);
      e.confusion[size_t(ids[size_t(i)])][size_t(pred)]++;
      correct += pred == ids[size_t(i)];
    }
  }
  e.accuracy = e.n ? double(correct) / double(e.n) : 0;
  e.loss = e.n ? loss_sum / double(e.n) : 0;
  return e;
}

// The loss and accuracy of evaluate(), the batches split over a data-parallel run's ranks
// and summed in batch order (the same numbers as one process's).
Evaluation evaluate_split(const Vit& m, const ImageSet& s, double timeout_s, int64_t batch = 256) {
  if (dist::world().size() == 1) return evaluate(m, s, batch);
  check_images_fit(m, s);
  NoGradGuard ng;
  const int64_t K = m.config().classes, batches = (s.size() + batch - 1) / batch;
  std::vector<int64_t> correct(size_t(batches), 0);
  const std::vector<double> losses = dist::share_items(batches, [&](int64_t b) {
    const int64_t at = b * batch, n = std::min(batch, s.size() - at);
    Tensor logits = m.logits(m.input(s.image(at), n));
    std::vector<int32_t> ids(s.labels.begin() + at, s.labels.begin() + at + n);
    const double l = cross_entropy(logits, to(labels::class_ids(ids, K), logits.device())).item();
    const std::vector<float> p = softmax(logits).to_f32_vector();
    for (int64_t i = 0; i < n; ++i) {
      const float* row = p.data() + i * K;
      correct[size_t(b)] += int32_t(std::max_element(row, row + K) - row) == ids[size_t(i)];
    }
    return l;
  }, timeout_s);
  const std::vector<double> rights = dist::share_items(batches, [&](int64_t b) { return double(correct[size_t(b)]); },
                                                       timeout_s);
  Evaluation e;
  e.n = s.size();
  double loss_sum = 0, right = 0;
  for (int64_t b = 0; b < batches; ++b) {
    loss_sum += losses[size_t(b)] * double(std::min(batch, s.size() - b * batch));
    right += rights[size_t(b)];
  }
  e.accuracy = e.n ? right / double(e.n) : 0;
  e.loss = e.n ? loss_sum / double(e.n) : 0;
  return e;
}

// ---- the run ------------------------------------------------------------------------------------

namespace {

struct VisionRun {
  VisionTrainOptions o;
  VisionData data;
  std::unique_ptr<Vit> model;
  std::unique_ptr<AdamW> opt;
  uint64_t data_hash = 0;
  LoopState loop;  // steps, time, images, the best weights (score: -accuracy, then loss)
  int64_t steps_per_epoch = 1, total_steps = 1;
  // The epoch in progress: its steps' loss and training accuracy so far.
  double epoch_loss = 0;
  int64_t epoch_steps = 0, epoch_correct = 0, epoch_seen = 0;
  // The last finished epoch's numbers.
  double train_loss = NAN, train_accuracy = NAN, val_accuracy = NAN, val_loss = NAN, test_accuracy = NAN,
         test_loss = NAN;
  int64_t best_epoch = -1;
  std::vector<int64_t> order;  // this epoch's order
  int64_t order_epoch = -1;
};

void log_line(const VisionRun& r, const std::string& s) { ProgressLine(stdout, r.o.quiet, 1).line(s); }

uint64_t hash_set(const ImageSet& s, uint64_t h) {
  h = XXH3_64bits_withSeed(s.pixels.data(), s.pixels.size(), h);
  h = XXH3_64bits_withSeed(s.labels.data(), s.labels.size() * sizeof(int32_t), h);
  std::string names;
  for (const std::string& c : s.classes) names += c + '\n';
  return XXH3_64bits_withSeed(names.data(), names.size(), h);
}

uint64_t data_hash(const VisionData& d) { return hash_set(d.test, hash_set(d.val, hash_set(d.train, 0))); }

nlohmann::json set_json(const ImageSet& s) {
  return {{"images", s.size()}, {"source", s.source}, {"size", fmt::format("{}x{}x{}", s.channels, s.height, s.width)}};
}

// Mean and standard deviation of each channel over the training images, on the [0, 1] scale.
void measure_normalisation(const ImageSet& s, VitConfig& c) {
  c.mean.clear(), c.std.clear();
  const int64_t hw = s.height * s.width;
  for (int64_t ch = 0; ch < s.channels; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < s.size(); ++i) {
      const uint8_t* p = s.image(i) + ch * hw;
      for (int64_t k = 0; k < hw; ++k) sum += p[k], sq += double(p[k]) * p[k];
    }
    const double n = double(s.size() * hw), mean = sum / n / 255.0;
    const double var = std::max(sq / n / (255.0 * 255.0) - mean * mean, 1e-6);
    c.mean.push_back(float(mean));
    c.std.push_back(float(std::sqrt(var)));
  }
}

const std::vector<int64_t>& epoch_order(VisionRun& r, int64_t epoch) {
  if (r.order_epoch != epoch) {
    r.order = seeded_permutation(r.data.train.size(), r.o.seed, kOrderStream + uint64_t(epoch));
    r.order_epoch = epoch;
  }
  return r.order;
}

// The 8-bit pixels of training images idx, augmented as the options say; each image's shift
// and flip come from the counter of its place in the run (epoch, position), nothing else.
std::vector<uint8_t> gather(const VisionRun& r, std::span<const int64_t> idx, int64_t epoch, int64_t first_pos) {
  const ImageSet& s = r.data.train;
  const int64_t C = s.channels, H = s.height, W = s.width, ib = s.image_bytes();
  const int64_t pad = r.o.crop_pad.value();  // resolved when the run started (load_data)
  const bool may_flip = r.o.flip.value();
  std::vector<uint8_t> out(size_t(ib) * idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const uint8_t* src = s.image(idx[k]);
    uint8_t* dst = out.data() + int64_t(k) * ib;
    if (pad == 0 && !may_flip) {
      std::memcpy(dst, src, size_t(ib));
      continue;
    }
    const auto b = philox4x32(r.o.seed, kAugStream, uint64_t(epoch) * uint64_t(s.size()) + uint64_t(first_pos) + k);
    const int64_t span = 2 * pad + 1;
    const int64_t dy = pad ? int64_t(b[0] % uint32_t(span)) - pad : 0;
    const int64_t dx = pad ? int64_t(b[1] % uint32_t(span)) - pad : 0;
    const bool flip = may_flip && (b[2] & 1);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          const int64_t sy = y + dy, sx0 = x + dx, sx = flip ? W - 1 - sx0 : sx0;
          dst[(c * H + y) * W + x] =
              sy >= 0 && sy < H && sx0 >= 0 && sx0 < W ? src[(c * H + sy) * W + sx] : uint8_t(0);
        }
  }
  return out;
}

void require_finite(const Vit& m, const std::string& consequence) {
  for (const Tensor& p : m.params().values()) {
    const int64_t i = first_non_finite(p);
    TOY_CHECK(i < 0, "[vision] weight '{}' holds a non-finite value (element {}){}", p.name(), i, consequence);
  }
}

// ---- checkpoint ---------------------------------------------------------------------------------
// checkpoint.gguf: the model (as model.gguf has it) plus toy.checkpoint.version,
// toy.vision.options (JSON), toy.vision.state (JSON: step, optimizer steps, time, images, the
// epoch in progress, the last epoch's numbers, the best epoch, the data's hash), opt.m.* /
// opt.v.* (AdamW) and best.* (the best-validation weights).

void save_vision_checkpoint(VisionRun& r) {
  require_finite(*r.model, ": not writing checkpoint.gguf");
  gguf::Writer w;
  w.set("toy.checkpoint.version", gguf::Value::u32(kVisionCheckpointVersion));
  add_vit_to_gguf(w, *r.model, "toy vit checkpoint");
  for (const Param& p : r.model->params().all()) {
    w.add_tensor("opt.m." + p.name, p.m);
    w.add_tensor("opt.v." + p.name, p.v);
  }
  r.loop.best.add_to(w, r.model->params());
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const BestWeights& best = r.loop.best;
  const nlohmann::json state = {{"step", r.loop.step},
                                {"optimizer_steps", r.opt->steps()},
                                {"seconds", r.loop.seconds},
                                {"images", r.loop.units},
                                {"epoch_loss", r.epoch_loss},
                                {"epoch_steps", r.epoch_steps},
                                {"epoch_correct", r.epoch_correct},
                                {"epoch_seen", r.epoch_seen},
                                {"world_size", r.loop.world_size},
                                {"train_loss", num(r.train_loss)},
                                {"train_accuracy", num(r.train_accuracy)},
                                {"val_accuracy", num(r.val_accuracy)},
                                {"val_loss", num(r.val_loss)},
                                {"test_accuracy", num(r.test_accuracy)},
                                {"test_loss", num(r.test_loss)},
                                {"best_epoch", best.has() ? r.best_epoch : int64_t(-1)},
                                {"best_val_accuracy", best.has() ? -best.score : 0.0},
                                {"best_val_loss", best.has() ? best.tiebreak : 0.0},
                                {"data_hash", hex(r.data_hash)}};
  w.set("toy.vision.options", gguf::Value::str(r.o.to_json().dump()));
  w.set("toy.vision.state", gguf::Value::str(state.dump()));
  w.write(checkpoint_path(r.o.out));
}

double opt_num(const nlohmann::json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  TOY_CHECK(it != j.end() && (it->is_null() || it->is_number()), "{}: field '{}' must be a number or null", where, key);
  return it->is_null() ? NAN : it->get<double>();
}

void load_vision_checkpoint(VisionRun& r, const std::string& dir) {
  using namespace json_fields;
  const std::string path = checkpoint_path(dir), shown = printable(path);
  std::error_code ec;
  TOY_CHECK(fs::exists(path, ec), "[vision] '{}' holds no checkpoint.gguf: not a toy vision run folder (or it "
            "stopped before its first checkpoint)", printable(dir));
  gguf::Reader rd(path);
  const auto version = rd.find_u32("toy.checkpoint.version");
  TOY_CHECK(version.has_value() && rd.has("toy.vision.state"),
            "[vision] '{}' is not a toy vision checkpoint", shown);
  TOY_CHECK(*version == kVisionCheckpointVersion, "[vision] '{}' has checkpoint format version {}; this toy reads {}",
            shown, *version, kVisionCheckpointVersion);
  const std::string where = fmt::format("[vision] checkpoint '{}'", shown);
  r.o = VisionTrainOptions::from_json(parse_object(rd.get_str("toy.vision.options"), where + " options"),
                                      where + " options");
  r.o.out = dir;
  const nlohmann::json st = parse_object(rd.get_str("toy.vision.state"), where + " state");
  r.model = std::make_unique<Vit>(vit_config_from_gguf(rd));
  for (Param& p : r.model->params().all()) load_checked(rd, p.name, p.value, false, "[vision]");
  r.opt = std::make_unique<AdamW>(r.model->params(), r.o.adamw());
  for (Param& p : r.model->params().all()) {  // into the moments AdamW made (views of its arena)
    load_checked(rd, "opt.m." + p.name, p.m, false, "[vision]");
    load_checked(rd, "opt.v." + p.name, p.v, true, "[vision]");
  }
  const int64_t step = r.loop.step = get_int(st, "step", where);
  r.opt->set_steps(get_int(st, "optimizer_steps", where));
  TOY_CHECK(step >= 0 && r.opt->steps() == step, "{}: step {} and optimizer steps {} disagree", where, step,
            r.opt->steps());
  r.loop.seconds = get_double(st, "seconds", where);
  r.loop.units = get_int(st, "images", where);
  r.epoch_loss = get_double(st, "epoch_loss", where);
  r.epoch_steps = get_int(st, "epoch_steps", where);
  r.epoch_correct = get_int(st, "epoch_correct", where);
  r.epoch_seen = get_int(st, "epoch_seen", where);
  r.loop.world_size = st.contains("world_size") ? get_int(st, "world_size", where) : 1;
  TOY_CHECK(r.loop.world_size >= 1 && r.loop.world_size <= 1 << 20, "{}: world_size {} is outside 1..1048576", where,
            r.loop.world_size);
  r.train_loss = opt_num(st, "train_loss", where);
  r.train_accuracy = opt_num(st, "train_accuracy", where);
  r.val_accuracy = opt_num(st, "val_accuracy", where);
  r.val_loss = opt_num(st, "val_loss", where);
  r.test_accuracy = opt_num(st, "test_accuracy", where);
  r.test_loss = opt_num(st, "test_loss", where);
  r.best_epoch = get_int(st, "best_epoch", where);
  const double best_accuracy = get_double(st, "best_val_accuracy", where);
  const double best_loss = get_double(st, "best_val_loss", where);
  r.data_hash = parse_hex(st, "data_hash", where);
  // The best weights' step is the end of their epoch (the steps per epoch are known once the
  // data is loaded; only whether there are any matters before).
  r.loop.best.load(rd, r.model->params(), r.best_epoch >= 0 ? r.best_epoch : -1, -best_accuracy, best_loss,
                   "[vision]");
  r.loop.saved_step = step;
}

// ---- the loop -----------------------------------------------------------------------------------

void load_data(VisionRun& r, bool resumed) {
  r.data = load_vision_data(r.o.data, r.o.seed, r.o.val_count);
  const uint64_t h = data_hash(r.data);
  if (resumed)
    TOY_CHECK(h == r.data_hash, "[vision] the data '{}' changed since the checkpoint: resuming would train on other "
              "images than the run started with; restore the data", printable(r.o.data));
  r.data_hash = h;
  if (const int64_t empty = check_training_classes(r.data.train, r.o.data); empty > 0 && !resumed)
    std::fprintf(stderr, "toy vision: warning: %lld of the %zu classes have no training image\n", (long long)empty,
                 r.data.train.classes.size());
  const Augmentation aug = augmentation_defaults(r.data.train);
  if (!r.o.crop_pad) r.o.crop_pad = aug.crop_pad;
  if (!r.o.flip) r.o.flip = aug.flip;
  const int64_t ranks = dist::world().size();  // (data-parallel: a step is every process's micro-batches)
  r.steps_per_epoch = r.data.train.size() / (r.o.batch * r.o.accum * ranks);
  TOY_CHECK(r.steps_per_epoch >= 1, "[vision] {} training images are fewer than one step's --batch {} x --accum {}{}",
            r.data.train.size(), r.o.batch, r.o.accum, ranks > 1 ? fmt::format(" x {} processes", ranks) : "");
  r.total_steps = r.steps_per_epoch * r.o.epochs;
}

// Up to `count` misclassified test images (the most confident mistakes first) as events.
nlohmann::json misclassified_json(const VisionRun& r, const Evaluation& e, int64_t count) {
  const ImageSet& s = r.data.test;
  std::vector<int64_t> wrong;
  for (int64_t i = 0; i < e.n; ++i)
    if (e.predicted[size_t(i)] != s.labels[size_t(i)]) wrong.push_back(i);
  std::stable_sort(wrong.begin(), wrong.end(),
                   [&](int64_t a, int64_t b) { return e.confidence[size_t(a)] > e.confidence[size_t(b)]; });
  if (int64_t(wrong.size()) > count) wrong.resize(size_t(count));
  nlohmann::json items = nlohmann::json::array();
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int64_t i : wrong) {
    const std::string png = encode_png(s.image(i), s.channels, s.height, s.width);
    std::string enc;
    for (size_t k = 0; k < png.size(); k += 3) {
      const uint32_t n = uint32_t(uint8_t(png[k])) << 16 | (k + 1 < png.size() ? uint32_t(uint8_t(png[k + 1])) << 8 : 0) |
                         (k + 2 < png.size() ? uint32_t(uint8_t(png[k + 2])) : 0);
      enc += b64[(n >> 18) & 63];
      enc += b64[(n >> 12) & 63];
      enc += k + 1 < png.size() ? b64[(n >> 6) & 63] : '=';
      enc += k + 2 < png.size() ? b64[n & 63] : '=';
    }
    items.push_back({{"index", i},
                     {"label", s.classes[size_t(s.labels[size_t(i)])]},
                     {"predicted", s.classes[size_t(e.predicted[size_t(i)])]},
                     {"prob", e.confidence[size_t(i)]},
                     {"png", enc}});
  }
  return items;
}

// One micro-batch: `batch` images of this epoch's order (augmented), label-smoothed
// cross-entropy; the training accuracy of the step is counted once the step is done.
class VisionTask : public TrainTask {
 public:
  explicit VisionTask(VisionRun& r) : r_(r) {}
  Tensor micro_loss(const MicroBatch& mb, int64_t& units) override {
    // Micro-batch i of a step (of accum x processes: rank i mod N's, data-parallel).
    const int64_t step = mb.step, micro = mb.index;
    const int64_t epoch = step / r_.steps_per_epoch, in_epoch = step % r_.steps_per_epoch;
    const std::vector<int64_t>& order = epoch_order(r_, epoch);
    const int64_t pos = (in_epoch * mb.count + micro) * r_.o.batch;
    std::span<const int64_t> idx(order.data() + pos, size_t(r_.o.batch));
    const std::vector<uint8_t> px = gather(r_, idx, epoch, pos);
    std::vector<int32_t> labels;
    for (int64_t i : idx) labels.push_back(r_.data.train.labels[size_t(i)]);
    Tensor logits = r_.model->logits(r_.model->input(px.data(), r_.o.batch));
    Tensor loss = classification_loss(logits, labels::class_ids(labels, r_.model->config().classes),
                                      r_.o.label_smoothing);
    // The predictions stay on the device until the step's one read (step_reads).
    predictions_.push_back(argmax(logits.detach(), -1));
    labels_.insert(labels_.end(), labels.begin(), labels.end());
    units += r_.o.batch;
    return loss;
  }
  std::vector<Tensor> step_reads() override { return predictions_; }
  void read_back(const std::vector<std::vector<float>>& values) override {
    size_t i = 0;
    for (const std::vector<float>& micro : values)
      for (float p : micro) correct_ += int32_t(p) == labels_[i++];
    predictions_.clear();
  }
  std::vector<float> step_counts() override { return {float(correct_)}; }
  void set_step_counts(const std::vector<float>& summed) override { correct_ = int64_t(summed.at(0)); }
  void after_step(const StepDone& d, nlohmann::json&) override {
    r_.epoch_correct += correct_;
    correct_ = 0, labels_.clear();
    r_.epoch_seen += d.units;
    r_.epoch_loss += d.loss;
    ++r_.epoch_steps;
  }
  void cadence(const StepDone& d) override {
    if (d.step % r_.steps_per_epoch == 0) end_of_epoch(d.step / r_.steps_per_epoch);
  }
  void save_checkpoint() override { save_vision_checkpoint(r_); }
  void write_outputs(bool stopped) override;
  void set_loop(TrainLoop& loop) { loop_ = &loop; }
  VisionTrainResult& result() { return res_; }

 private:
  void end_of_epoch(int64_t epoch);  // epoch: 1-based, just finished

  VisionRun& r_;
  TrainLoop* loop_ = nullptr;
  VisionTrainResult res_;
  int64_t correct_ = 0;  // the step in progress
  std::vector<Tensor> predictions_;  // its micro-batches' argmax (on the device)
  std::vector<int32_t> labels_;      // and their labels
};

void VisionTask::end_of_epoch(int64_t epoch) {
  VisionRun& r = r_;
  const VisionTrainOptions& o = r.o;
  r.train_loss = r.epoch_loss / double(std::max<int64_t>(r.epoch_steps, 1));
  r.train_accuracy = double(r.epoch_correct) / double(std::max<int64_t>(r.epoch_seen, 1));
  const Evaluation val = evaluate_split(*r.model, r.data.val, r.o.dp_timeout);
  const Evaluation test = evaluate_split(*r.model, r.data.test, r.o.dp_timeout);
  r.val_accuracy = val.accuracy, r.val_loss = val.loss;
  r.test_accuracy = test.accuracy, r.test_loss = test.loss;
  // The best: the highest validation accuracy, then the lowest validation loss.
  const bool best = loop_->offer_best(-val.accuracy, val.loss);
  if (best) r.best_epoch = epoch;
  loop_->events().emit("epoch", {{"epoch", epoch},
                                 {"step", r.loop.step},
                                 {"train_loss", r.train_loss},
                                 {"train_accuracy", r.train_accuracy},
                                 {"val_accuracy", val.accuracy},
                                 {"val_loss", val.loss},
                                 {"test_accuracy", test.accuracy},
                                 {"test_loss", test.loss},
                                 {"best", best},
                                 {"seconds", r.loop.seconds}});
  log_line(r, fmt::format("epoch {:>3}/{}  train loss {:.4f}  acc {:.2f}%  |  val acc {:.2f}%  |  test loss {:.4f}  "
                          "acc {:.2f}%{}",
                          epoch, o.epochs, r.train_loss, 100 * r.train_accuracy, 100 * val.accuracy, test.loss,
                          100 * test.accuracy, best ? "  (best so far)" : ""));
  r.epoch_loss = 0, r.epoch_steps = 0, r.epoch_correct = 0, r.epoch_seen = 0;
}

// model.gguf and its companion (as toy train: best.gguf or last.gguf), then the confusion
// matrix and mistakes of the weights model.gguf holds on the test set.
void VisionTask::write_outputs(bool stopped) {
  VisionRun& r = r_;
  const VisionTrainOptions& o = r.o;
  BestWeights& best = r.loop.best;
  Vit& m = *r.model;
  const fs::path dir(o.out);
  const bool best_first = o.keep == "best" && best.has();
  std::error_code ec;
  if (o.keep == "best") {
    require_finite(m, ": not writing model.gguf");
    save_vit((dir / "last.gguf").string(), m, "toy vit (last step)");
    fs::remove(dir / "best.gguf", ec);
  } else {
    if (best.has()) {
      best.swap_with(m.params());
      save_vit((dir / "best.gguf").string(), m, "toy vit (best validation)");
      best.swap_with(m.params());
    }
    fs::remove(dir / "last.gguf", ec);
  }
  // From here the model holds the weights model.gguf gets (the run ends with it).
  if (best_first) best.swap_with(m.params());
  require_finite(m, ": not writing model.gguf");
  save_vit((dir / "model.gguf").string(), m, "toy vit");
  res_.model = best_first ? "best" : "last";
  if (!stopped) {
    const Evaluation e = evaluate(m, r.data.test);
    std::vector<std::string> names = r.data.test.classes;
    loop_->events().emit("confusion", {{"matrix", e.confusion}, {"classes", names}, {"accuracy", e.accuracy},
                                       {"per_class", e.per_class()}, {"model", res_.model}});
    loop_->events().emit("misclassified", {{"images", misclassified_json(r, e, o.misclassified)},
                                           {"count", int64_t(std::count_if(e.predicted.begin(), e.predicted.end(),
                                                                           [&, i = size_t(0)](int32_t p) mutable {
                                                                             return p != r.data.test.labels[i++];
                                                                           }))}});
    res_.test_accuracy = e.accuracy;
    res_.test_loss = e.loss;
  } else {
    res_.test_accuracy = r.test_accuracy;
    res_.test_loss = r.test_loss;
  }
  loop_->events().emit("models", {{"model_gguf", res_.model},
                                  {"companion", o.keep == "best" ? "last.gguf" : "best.gguf"},
                                  {"last_step", r.loop.step},
                                  {"best_step", best.has() ? r.best_epoch * r.steps_per_epoch : -1},
                                  {"best_epoch", best.has() ? r.best_epoch : -1},
                                  {"best_val_accuracy", best.has() ? -best.score : NAN}});
  res_.stopped = stopped;
  res_.steps = r.loop.step;
  res_.epochs = r.loop.step / r.steps_per_epoch;
  res_.train_loss = r.train_loss;
  res_.train_accuracy = r.train_accuracy;
  res_.val_accuracy = best.has() ? -best.score : r.val_accuracy;
  res_.seconds = r.loop.seconds;
  res_.images_per_s = double(r.loop.units) / std::max(r.loop.seconds, 1e-9);
  res_.best_epoch = best.has() ? r.best_epoch : -1;
  if (stopped)
    log_line(r, fmt::format("stopped at step {}: checkpoint written; continue with toy vision train --resume {}",
                            r.loop.step, o.out));
  else
    log_line(r, fmt::format("test accuracy {:.2f}% ({} weights{}); model in {}", 100 * res_.test_accuracy, res_.model,
                            res_.model == "best" ? fmt::format(", epoch {}", res_.best_epoch) : "",
                            (dir / "model.gguf").string()));
}

// Data-parallel: every rank must be training the same run on the same images.
void agree_on_start(const VisionRun& r) {
  dist::agree_on_start(dist::world(), {{"options", r.o.to_json()}, {"data_hash", hex(r.data_hash)},
                                       {"step", r.loop.step}}, r.o.dp_timeout);
}

VisionTrainResult run_loop(VisionRun& r, bool resumed) {
  const VisionTrainOptions& o = r.o;
  VisionTask task(r);
  LoopSetup setup;
  setup.who = "[vision]";
  setup.dir = o.out;
  setup.resumed = resumed;
  setup.rate_unit = "img/s";
  setup.rate_field = "images_per_s";
  setup.total_steps = r.total_steps;
  setup.resume_command = "toy vision train --resume " + printable(o.out);
  TrainLoop loop(setup, o, r.loop, r.model->params(), *r.opt, task);
  task.set_loop(loop);
  nlohmann::json start = provenance();
  start["command"] = "vision";
  start["resumed"] = resumed;
  start["step"] = r.loop.step;
  start["config"] = o.to_json();
  start["model"] = r.model->config().to_json();
  start["params"] = r.model->params().numel();
  start["data"] = {{"train", set_json(r.data.train)}, {"val", set_json(r.data.val)}, {"test", set_json(r.data.test)},
                   {"classes", r.data.train.classes}, {"split_by_seed", r.data.seed_split}};
  start["steps_per_epoch"] = r.steps_per_epoch;
  loop.add_run_start_fields(start);
  loop.events().emit("run_start", start);
  log_line(r, fmt::format("toy vision: ViT {} params, {} classes, {} training / {} validation / {} test images, "
                          "{} epochs of {} steps, {} threads",
                          r.model->params().numel(), r.model->config().classes, r.data.train.size(), r.data.val.size(),
                          r.data.test.size(), o.epochs, r.steps_per_epoch, num_threads()));
  VisionTrainResult& res = task.result();
  res.out = o.out;
  loop.run([&] {
    return nlohmann::json{{"epochs", r.loop.step / r.steps_per_epoch},
                          {"train_loss", r.train_loss},
                          {"test_accuracy", r.test_accuracy},
                          {"test_loss", r.test_loss},
                          {"model", res.model},
                          {"best_epoch", res.best_epoch}};
  });
  return res;
}

}  // namespace

Augmentation augmentation_defaults(const ImageSet& train) {
  if (train.classes == fashion_mnist_classes() && train.channels == 1 && train.height == 28 && train.width == 28)
    return {2, true};
  return {};
}

VisionTrainResult train_vision(const VisionTrainOptions& opts) {
  opts.validate();
  VisionRun r;
  r.o = opts;
  // A path is saved absolute, so --resume finds the data from any working directory.
  if (r.o.data != "fashion-mnist") {
    std::error_code ec;
    const fs::path abs = fs::absolute(r.o.data, ec);
    if (!ec) r.o.data = abs.lexically_normal().string();
  }
  const bool writer = writes_run_files();  // (data-parallel: rank 0 alone writes the run's files)
  if (!writer) r.o.quiet = true;
  check_data_parallel(opts, "[vision]");
  if (writer) check_new_run_folder(opts.out, opts.force);
  if (opts.threads) set_num_threads(opts.threads);
  load_data(r, false);
  // The model takes the data's images and classes.
  const ImageSet& tr = r.data.train;
  TOY_CHECK(tr.height == tr.width, "[vision] the images of '{}' are {}x{}: a ViT here takes square images",
            printable(r.o.data), tr.width, tr.height);
  VitConfig mc = opts.model;
  mc.image = tr.height;
  mc.channels = tr.channels;
  mc.classes = int64_t(tr.classes.size());
  mc.class_names = tr.classes;
  TOY_CHECK(mc.image % mc.patch == 0, "[vision] the images are {}x{}: --patch {} does not divide {}", mc.image,
            mc.image, mc.patch, mc.image);
  measure_normalisation(tr, mc);
  mc.validate();
  r.o.model = mc;
  agree_on_start(r);
  if (writer) prepare_new_run_folder(opts.out, opts.force);
  r.model = std::make_unique<Vit>(mc);
  r.model->init(opts.seed);                // on the CPU (the same weights for every device),
  r.model->params().move_to(opts.device);  // then moved once
  r.model->set_mixed_precision(precision_type(opts.precision));
  r.opt = std::make_unique<AdamW>(r.model->params(), opts.adamw());
  return run_loop(r, false);
}

VisionTrainResult resume_vision(const std::string& dir,
                                const std::function<void(VisionTrainOptions&)>& override_fn) {
  struct stat st {};
  TOY_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "[vision] --resume '{}' is not a run folder",
            printable(dir));
  VisionRun r;
  load_vision_checkpoint(r, dir);
  for (const std::string& f : run_file_names()) check_output_file((fs::path(dir) / f).string(), "[vision]");
  const bool writer = writes_run_files();
  if (writer) remove_stale_temporaries(dir);
  r.o.stop_after = 0;
  // The global batch (batch x accum x processes) is the run's (see toy train's resume).
  r.o.accum = accum_for_world(r.o.accum, r.loop.world_size, "[vision]", dir, "toy vision train");
  if (override_fn) override_fn(r.o);
  r.o.validate();
  if (!writer) r.o.quiet = true;
  check_data_parallel(r.o, "[vision]");
  if (r.o.threads) set_num_threads(r.o.threads);
  load_data(r, true);
  agree_on_start(r);
  r.model->params().move_to(r.o.device);  // the weights, best and AdamW's moments read on the CPU
  r.loop.best.move_to(r.o.device);
  r.model->set_mixed_precision(precision_type(r.o.precision));  // (a resume may change it)
  TOY_CHECK(r.loop.step < r.total_steps, "[vision] the run in '{}' already finished its {} epochs (pass a larger --epochs "
            "to go on)", printable(dir), r.o.epochs);
  return run_loop(r, true);
}

}  // namespace toy
