// Training ViT image classifiers: the loop behind `toy vision train`, and the evaluation
// behind `toy vision eval` and the per-epoch test accuracy.
//   data (data/images.h: train, validation held out of train, test) -> a ViT whose input
//   geometry and classes come from the data -> epochs of seeded shuffles (optional random
//   crop with padding and horizontal flip) -> AdamW with warmup + cosine, clipping and
//   accumulation, label smoothing -> after each epoch: validation and test accuracy and loss.
// The best-model rule selects on the validation images (never the test set). The run folder
// (train/run_folder.h) gets model.gguf (best or last weights, --keep) and its companion,
// checkpoint.gguf (weights, AdamW moments, best weights, step, the data's identity), events.jsonl
// and report.html (loss and accuracy curves, the confusion matrix, misclassified test images).
// A stop request (SIGINT/SIGTERM/SIGHUP: request_stop() of train/trainer.h) or stop_after ends
// after the step with a checkpoint; resume() continues bit for bit (for a fixed thread count).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "toy/data/images.h"
#include "toy/models/vit.h"
#include "toy/train/loop.h"

namespace toy {

struct VisionTrainOptions : LoopOptions {
  std::string data = "fashion-mnist";
  std::string out;
  std::string preset = "vit-mnist";
  VitConfig model = VitConfig::from_preset("vit-mnist");  // geometry and classes are the data's
  int64_t epochs = 40;  // vit-mnist on Fashion-MNIST gains until the end of 40 (README "Results")
  float label_smoothing = 0.1f;
  // Light augmentation; unset = the data's default (augmentation_defaults below), resolved when
  // the run starts and saved resolved.
  std::optional<int64_t> crop_pad;  // random crop: shift by up to this many pixels (zero fill); 0 = off
  std::optional<bool> flip;         // random horizontal flip
  int64_t val_count = 5000;  // validation images held out of the training set (at most a tenth)
  int threads = 0;
  std::string keep = "best";  // model.gguf: best (validation accuracy) or last weights
  std::string precision = "f32";  // f32 | bf16: the type the projections' products run in (toy train's)
  int64_t misclassified = 32; // test images shown in the report

  // The core's defaults for a ViT (warmup in steps).
  VisionTrainOptions() {
    batch = 128, accum = 1, lr = 1e-3f, min_lr = 1e-5f, warmup = 500;
    weight_decay = 0.05f, beta1 = 0.9f, beta2 = 0.999f, clip = 1.0f, seed = 1337, log_every = 50;
  }

  void validate() const;
  nlohmann::json to_json() const;
  static VisionTrainOptions from_json(const nlohmann::json& j, const std::string& where);
};

struct VisionTrainResult {
  int64_t epochs = 0, steps = 0;
  double train_loss = NAN;      // mean over the last epoch's steps
  double train_accuracy = NAN;  // on the last epoch's (augmented) training batches
  double val_accuracy = NAN, test_accuracy = NAN, test_loss = NAN;
  double images_per_s = 0, seconds = 0;
  bool stopped = false;
  std::string model = "last";  // which weights model.gguf holds
  int64_t best_epoch = -1;
  std::string out;
};

// The augmentation a run gets unless told: Fashion-MNIST (its ten class names, 28x28x1) a random
// crop of up to 2 pixels and horizontal flips (without them vit-mnist overfits from epoch ~17
// near 88%); anything else none (a flipped digit is another digit or none).
struct Augmentation {
  int64_t crop_pad = 0;
  bool flip = false;
};
Augmentation augmentation_defaults(const ImageSet& train);

VisionTrainResult train_vision(const VisionTrainOptions& opts);
// override_fn may change epochs, threads, stop_after, save cadence, log_every and quiet.
VisionTrainResult resume_vision(const std::string& dir,
                                const std::function<void(VisionTrainOptions&)>& override_fn = {});

struct Evaluation {
  int64_t n = 0;
  double accuracy = 0, loss = 0;  // loss: plain cross-entropy
  std::vector<std::vector<int64_t>> confusion;  // [true class][predicted class]
  std::vector<int32_t> predicted;
  std::vector<float> confidence;  // the predicted class's probability
  std::vector<double> per_class() const;  // accuracy per true class (NaN: none of it)
};
// Throws toy::Error naming the set's source when its images are not the model's size or
// channel count, or a label is outside the model's classes.
void check_images_fit(const Vit& m, const ImageSet& s);
// Makes a set's labels the model's class numbers: named classes (class folders) by name — a
// class the model does not have is an error listing the model's — and numbered classes
// (IDX, CSV: "0", "1", ...) by number. The set then carries the model's class names.
void match_classes_to_model(ImageSet& s, const VitConfig& c);
// Refuses training data whose labels are mostly not classes: when more than half of the
// classes 0..max label have no training image (labels all 255 made a 256-class model that
// scored 100%; 1-based labels leave class 0 empty, which only warns). Returns how many
// classes have no training image.
int64_t check_training_classes(const ImageSet& train, const std::string& source);
Evaluation evaluate(const Vit& m, const ImageSet& s, int64_t batch = 256);

}  // namespace toy
