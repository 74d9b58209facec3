// `toy vision train` (train a ViT classifier), `toy vision eval` (accuracy, per-class accuracy,
// confusion matrix) and `toy classify` (top-5 classes of image files).
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/cli/stop_signals.h"
#include "toy/core/text.h"
#include "toy/core/runtime.h"
#include "toy/data/images.h"
#include "toy/io/vit_file.h"
#include "toy/ops/ops.h"
#include "toy/train/vision.h"

namespace toy::cli {

namespace {

struct VisionFlags {
  VisionTrainOptions o;
  std::string resume;
  bool json = false;
  bool flip = false, no_flip = false;  // unset both: the data's default
  std::optional<int64_t> dim, layers, heads, mlp, patch;
  std::string pool;
};

// The flags a --resume may give: how the run proceeds, not what it is.
const std::vector<std::string>& resume_flags() {
  static const std::vector<std::string> f = {"--resume",       "--epochs",    "--threads", "--device", "--stop-after",
                                             "--save-every",   "--save-minutes", "--log-every", "--quiet",  "--json",
                                             "--zero", "--dp-bucket-mb", "--dp-overlap", "--dp-timeout", "--precision"};
  return f;
}

void print_train_result(const VisionTrainResult& r, bool json) {
  if (json) {
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    nlohmann::json j = {{"epochs", r.epochs},
                        {"steps", r.steps},
                        {"train_loss", num(r.train_loss)},
                        {"train_accuracy", num(r.train_accuracy)},
                        {"val_accuracy", num(r.val_accuracy)},
                        {"test_accuracy", num(r.test_accuracy)},
                        {"test_loss", num(r.test_loss)},
                        {"images_per_s", r.images_per_s},
                        {"seconds", r.seconds},
                        {"stopped", r.stopped},
                        {"model", r.model},
                        {"best_epoch", r.best_epoch},
                        {"out", r.out}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
}

Run add_train(CLI::App* vision) {
  auto* cmd = vision->add_subcommand("train", "Train a ViT image classifier");
  auto f = std::make_shared<VisionFlags>();
  VisionTrainOptions& o = f->o;
  cmd->add_option("--data", o.data, "fashion-mnist, a folder of IDX files, an IDX images file, a CSV file (pixels "
                  "then label) or a folder of class folders of images")->capture_default_str();
  cmd->add_option("--out", o.out, "Run folder: model.gguf, checkpoint.gguf, events.jsonl, report.html");
  auto* resume_opt = cmd->add_option("--resume", f->resume, "Continue the run in this folder from its checkpoint");
  cmd->add_flag("--force", o.force, "Replace the run already in --out (only toy's own run files are removed)")
      ->excludes(resume_opt);
  cmd->add_option("--preset", o.preset, "vit-mnist, vit-digits or vit-tiny (the image size and channels are the "
                  "data's)")->capture_default_str()->check(CLI::IsMember(VitConfig::preset_names()));
  add_int(cmd, "--dim", f->dim, 1, 16384, "Width (default: the preset's)");
  add_int(cmd, "--layers", f->layers, 1, 256, "Transformer blocks");
  add_int(cmd, "--heads", f->heads, 1, 1024, "Attention heads");
  add_int(cmd, "--mlp", f->mlp, 1, 65536, "MLP hidden width");
  add_int(cmd, "--patch", f->patch, 1, 4096, "Patch size (must divide the image size)");
  cmd->add_option("--pool", f->pool, "cls (class token) or mean (mean of the patches)")
      ->check(CLI::IsMember({"cls", "mean"}));
  add_int(cmd, "--epochs", o.epochs, 1, 100000, "Passes over the training images")->capture_default_str();
  add_int(cmd, "--batch", o.batch, 1, 65536, "Images per micro-batch")->capture_default_str();
  add_int(cmd, "--accum", o.accum, 1, 4096, "Micro-batches per optimizer step");
  add_real(cmd, "--lr", o.lr, {0, 1, true}, "Peak learning rate")->capture_default_str();
  add_real(cmd, "--min-lr", o.min_lr, {0, 1}, "Learning rate at the end of the cosine decay");
  add_int(cmd, "--warmup", o.warmup, 0, int64_t(1) << 40, "Linear warmup steps")->capture_default_str();
  add_real(cmd, "--wd", o.weight_decay, {0, 1, false, true}, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  add_real(cmd, "--beta1", o.beta1, {0, 1, false, true}, "AdamW beta1");
  add_real(cmd, "--beta2", o.beta2, {0, 1, false, true}, "AdamW beta2");
  add_real(cmd, "--clip", o.clip, {0, 1e9}, "Gradient clipping: max global norm (0 = off)");
  add_real(cmd, "--label-smoothing", o.label_smoothing, {0, 1, false, true}, "Label smoothing")
      ->capture_default_str();
  add_int(cmd, "--crop-pad", o.crop_pad, 0, 64, "Random crop: shift each training image by up to N pixels (0 = off; "
          "default: 2 for Fashion-MNIST, else 0)");
  auto* flip_opt = cmd->add_flag("--flip", f->flip, "Random horizontal flips of training images (default for "
                                 "Fashion-MNIST)");
  cmd->add_flag("--no-flip", f->no_flip, "No flips (the default for any other data)")->excludes(flip_opt);
  add_u64(cmd, "--seed", o.seed, "Seed for init, the splits, the order and augmentation");
  add_int(cmd, "--val-count", o.val_count, 1, int64_t(1) << 30,
          "Validation images held out of the training set (at most a tenth of it)");
  add_int(cmd, "--threads", o.threads, 1, kMaxThreads, "Threads (default: all cores, or TOY_THREADS)");
  add_device(cmd, o.device);
  add_int(cmd, "--log-every", o.log_every, 1, int64_t(1) << 40, "Steps between progress lines when not on a terminal");
  add_int(cmd, "--stop-after", o.stop_after, 0, int64_t(1) << 40, "Stop after this step with a checkpoint");
  add_int(cmd, "--save-every", o.save_every, 0, int64_t(1) << 40, "A checkpoint every N steps (0 = off)");
  add_real(cmd, "--save-minutes", o.save_minutes, {0, 1e6}, "A checkpoint at least every M minutes (0 = off)");
  cmd->add_option("--precision", o.precision,
                  "f32, or bf16: the projections multiply in BF16 with f32 accumulation over F32 master weights "
                  "(AMX or AVX512-BF16 on a CPU that has them, the tensor cores on a GPU); may change on resume")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--keep", o.keep, "What model.gguf holds: best (validation accuracy) or last")
      ->capture_default_str()
      ->check(CLI::IsMember({"best", "last"}));
  add_data_parallel_flags(cmd, o);
  cmd->add_flag("--quiet", o.quiet, "No progress output");
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last line of stdout");
  return [cmd, f]() -> int {
    install_stop_signals();
    VisionTrainResult r;
    if (!f->resume.empty()) {
      for (const CLI::Option* opt : cmd->get_options()) {
        if (opt->count() == 0) continue;
        const std::string name = opt->get_name();
        TOY_CHECK(std::find(resume_flags().begin(), resume_flags().end(), name) != resume_flags().end() ||
                      (name == "--out" && same_path(f->o.out, f->resume)),
                  "[vision] {} cannot be given with --resume: the run keeps the options it started with (a resume "
                  "may change --epochs, --threads, --stop-after, --save-every, --save-minutes, --log-every, --quiet, "
                  "--precision)",
                  name);
      }
      r = resume_vision(f->resume, [cmd, f](VisionTrainOptions& saved) {
        if (cmd->count("--epochs")) saved.epochs = f->o.epochs;
        if (cmd->count("--threads")) saved.threads = f->o.threads;
        saved.device = f->o.device;
        if (cmd->count("--stop-after")) saved.stop_after = f->o.stop_after;
        if (cmd->count("--save-every")) saved.save_every = f->o.save_every;
        if (cmd->count("--save-minutes")) saved.save_minutes = f->o.save_minutes;
        if (cmd->count("--log-every")) saved.log_every = f->o.log_every;
        if (cmd->count("--precision")) saved.precision = f->o.precision;
        saved.quiet = f->o.quiet;
        saved.zero = f->o.zero, saved.dp_bucket_mb = f->o.dp_bucket_mb;
        saved.dp_overlap = f->o.dp_overlap, saved.dp_timeout = f->o.dp_timeout;
      });
    } else {
      if (f->flip) f->o.flip = true;
      if (f->no_flip) f->o.flip = false;
      VitConfig m = VitConfig::from_preset(f->o.preset);
      if (f->dim) m.dim = *f->dim;
      if (f->layers) m.layers = *f->layers;
      if (f->heads) m.heads = *f->heads;
      if (f->mlp) m.mlp = *f->mlp;
      if (f->patch) m.patch = *f->patch;
      if (!f->pool.empty()) m.pool = f->pool;
      // The data decides the geometry; validate the rest now with a stand-in that fits.
      f->o.model = m;
      f->o.model.image = m.patch;
      f->o.model.channels = 1;
      f->o.model.mean.clear(), f->o.model.std.clear();
      f->o.model.class_names.clear();
      f->o.model.classes = 10;
      r = train_vision(f->o);
    }
    if (writes_run_files()) print_train_result(r, f->json);
    if (dist::world().size() > 1) return 0;  // (data-parallel: see toy train)
    return r.stopped ? stop_signal_exit_code() : 0;  // (--stop-after is no signal: 0)
  };
}

Run add_eval(CLI::App* vision) {
  auto* cmd = vision->add_subcommand("eval", "Accuracy, per-class accuracy and the confusion matrix of a ViT");
  struct Flags {
    std::string model, data;
    bool json = false;
    int threads = 0;
    int64_t batch = 256;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "A ViT model.gguf (toy vision train)")->required();
  cmd->add_option("--data", f->data, "fashion-mnist (its t10k test set), an IDX images file (labels beside it), a "
                  "folder with a test/ class folder or IDX files (their test set), a CSV file or a class folder")
      ->required();
  add_int(cmd, "--batch", f->batch, 1, 65536, "Images per forward pass");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores)");
  cmd->add_flag("--json", f->json, "One JSON object");
  return [f]() -> int {
    if (f->threads) set_num_threads(f->threads);
    auto m = load_vit(f->model);
    ImageSet s = load_eval_data(f->data);
    match_classes_to_model(s, m->config());
    const Evaluation e = evaluate(*m, s, f->batch);
    const std::vector<double> pc = e.per_class();
    const auto& names = m->config().class_names;
    if (f->json) {
      nlohmann::json per = nlohmann::json::object();
      for (size_t c = 0; c < pc.size(); ++c) per[names[c]] = std::isfinite(pc[c]) ? nlohmann::json(pc[c]) : nullptr;
      std::printf("%s\n", nlohmann::json({{"accuracy", e.accuracy},
                                          {"n", e.n},
                                          {"loss", e.loss},
                                          {"per_class", per},
                                          {"classes", names},
                                          {"confusion", e.confusion}})
                              .dump()
                              .c_str());
      return 0;
    }
    std::printf("accuracy %.2f%% on %lld images (%s), cross-entropy %.4f\n\n", 100 * e.accuracy, (long long)e.n,
                printable(s.source).c_str(), e.loss);
    size_t w = 5;
    for (const auto& n : names) w = std::max(w, n.size());
    std::printf("%-*s  accuracy\n", int(w), "class");
    for (size_t c = 0; c < pc.size(); ++c)
      std::printf("%-*s  %s\n", int(w), names[c].c_str(),
                  std::isfinite(pc[c]) ? fmt::format("{:6.2f}%", 100 * pc[c]).c_str() : "     -");
    std::printf("\nconfusion matrix (rows: true class, columns: predicted, in class order)\n");
    for (size_t c = 0; c < e.confusion.size(); ++c) {
      std::printf("%-*s", int(w), names[c].c_str());
      for (int64_t v : e.confusion[c]) std::printf(" %5lld", (long long)v);
      std::printf("\n");
    }
    return 0;
  };
}

}  // namespace

Run add_vision_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("vision", "Train and evaluate ViT image classifiers");
  cmd->require_subcommand(1);
  Run train = add_train(cmd);
  CLI::App* train_cmd = cmd->get_subcommand("train");
  Run eval = add_eval(cmd);
  return [train, train_cmd, eval]() -> int { return train_cmd->parsed() ? train() : eval(); };
}

Run add_classify_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("classify", "Top-5 classes of image files with a ViT model");
  struct Flags {
    std::string model;
    std::vector<std::string> images;
    int64_t top = 5;
    bool json = false;
    int threads = 0;
  };
  auto f = std::make_shared<Flags>();
  cmd->add_option("-m,--model", f->model, "A ViT model.gguf (toy vision train)")->required();
  cmd->add_option("images", f->images, "Image files (PNG, JPEG, BMP, GIF, TGA, PNM)")->required();
  add_int(cmd, "--top", f->top, 1, 100000, "Classes shown per image");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads (default: all cores)");
  cmd->add_flag("--json", f->json, "One JSON object per image per line");
  return [f]() -> int {
    if (f->threads) set_num_threads(f->threads);
    auto m = load_vit(f->model);
    const VitConfig& c = m->config();
    // A file that cannot be read is reported in its place (on stderr, and with --json as
    // {"file", "error"}) and the others are still classified; the exit status says some failed.
    std::vector<uint8_t> px;
    std::vector<std::string> errors(f->images.size());
    std::vector<int64_t> row(f->images.size(), -1);  // the image's row in the batch
    int64_t n = 0;
    for (size_t i = 0; i < f->images.size(); ++i) {
      try {
        const Image im = read_image_file(f->images[i], c.channels, c.image, c.image);
        px.insert(px.end(), im.pixels.begin(), im.pixels.end());
        row[i] = n++;
      } catch (const Error& e) {
        errors[i] = e.what();
      }
    }
    NoGradGuard ng;
    const int64_t K = c.classes, top = std::min(f->top, K);
    const std::vector<float> probs =
        n > 0 ? softmax(m->logits(m->input(px.data(), n))).to_f32_vector() : std::vector<float>{};
    int failed = 0;
    for (size_t i = 0; i < f->images.size(); ++i) {
      if (row[i] < 0) {
        ++failed;
        std::fprintf(stderr, "toy: %s\n", errors[i].c_str());
        if (f->json)
          std::printf("%s\n", nlohmann::json({{"file", f->images[i]}, {"error", errors[i]}}).dump().c_str());
        else
          std::printf("%s\n  (not classified: see the error above)\n", printable(f->images[i]).c_str());
        std::fflush(stdout);
        continue;
      }
      std::vector<int64_t> order(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) order[size_t(k)] = k;
      const float* p = probs.data() + row[i] * K;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      if (f->json) {
        nlohmann::json tops = nlohmann::json::array();
        for (int64_t k = 0; k < top; ++k)
          tops.push_back({{"label", c.class_names[size_t(order[size_t(k)])]}, {"prob", p[order[size_t(k)]]}});
        std::printf("%s\n", nlohmann::json({{"file", f->images[i]}, {"top", tops}}).dump().c_str());
      } else {
        std::printf("%s\n", printable(f->images[i]).c_str());
        for (int64_t k = 0; k < top; ++k)
          std::printf("  %6.2f%%  %s\n", 100 * p[order[size_t(k)]], c.class_names[size_t(order[size_t(k)])].c_str());
      }
    }
    if (failed > 0) {
      std::fprintf(stderr, "toy: classify: %d of %zu images could not be read\n", failed, f->images.size());
      return kExitRuntime;
    }
    return 0;
  };
}

}  // namespace toy::cli
