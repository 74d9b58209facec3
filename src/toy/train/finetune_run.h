// Internal to `toy finetune`: everything a run holds, and the pieces finetune.cpp drives —
// building the model (finetune_model.cpp), its outputs, and the checkpoint that saves and
// restores the run (finetune_checkpoint.cpp).
#pragma once
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "toy/core/files.h"
#include "toy/core/rng.h"
#include "toy/data/sft.h"
#include "toy/infer/chat.h"
#include "toy/io/gguf.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"
#include "toy/train/finetune.h"
#include "toy/train/optimizer.h"

namespace toy {

// Random streams of a fine-tuning run (counter-based, keyed by the seed).
constexpr uint64_t kFinetuneDropoutStream = 2;
constexpr uint64_t kFinetuneShuffleStream = 100;  // + epoch: each epoch's order
constexpr uint64_t kLensInitStream = 1u << 20;    // + parameter: fresh tensors of a lens model

struct FinetuneRun {
  FinetuneOptions o;  // resolved: ctx, steps and min_lr hold the values the run uses
  // Kept open: frozen weights are views of the mapped files.
  std::unique_ptr<gguf::Reader> base, donor;
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<Tokenizer> tok;
  std::string arch;           // the base's general.architecture (adapter files name it)
  std::string chat_template;  // tokenizer.chat_template for model.gguf ("" when none)
  std::optional<ChatTemplate> chat;  // none: the model's template is one toy cannot read ...
  std::string chat_error;            // ... which says why
  bool toy_config = false;    // model.gguf carries toy.config
  std::string merge_type;
  // The files the run depends on (compared on resume).
  FileIdentity base_id, donor_id, data_id;

  std::vector<SftExample> train, val;
  int64_t truncated = 0, dropped = 0;

  std::unique_ptr<AdamW> opt;
  Generator dropout_gen{0, kFinetuneDropoutStream};
  LoopState loop;  // steps, time, tokens, the F16 loss scale, the best (trainable) weights
  // Where the run is in its data: the epoch and the position in its order; `pending` — the
  // example at cursor - 1 did not fit the last packed row and opens the next one.
  int64_t epoch = -1;
  size_t cursor = 0;
  bool pending = false;
  std::vector<size_t> order;  // this epoch's order (rebuilt from the seed and epoch)
  double window_loss = 0;     // the logging window so far
  int64_t window_steps = 0;
  double train_loss = NAN;    // the last full window's mean
};

// Opens the base / donor and builds r.model, r.tok and what trains, from r.o alone (a resumed
// run rebuilds the same model, then loads the trained tensors): the method's trainable
// parameters (LoRA adapters seeded), the projection lens, mixed precision, recomputation.
void build_finetune_model(FinetuneRun& r);
// Writes adapter.gguf (LoRA) and model.gguf (merged in r.merge_type, a lens folded). The model
// is changed (merged): call last.
void write_finetune_outputs(FinetuneRun& r);

// r.order <- the seeded order of epoch r.epoch (a shuffle of the training examples).
void shuffle_epoch(FinetuneRun& r);

std::string finetune_checkpoint_path(const std::string& dir);
// Writes dir/checkpoint.gguf atomically: options, state, the trainable tensors, their AdamW
// moments and the best weights. Refuses when a trainable weight is not finite.
void save_finetune_checkpoint(FinetuneRun& r);
// The options of the run in `dir` (first step of a resume: the model is built from them).
FinetuneOptions read_finetune_checkpoint_options(const gguf::Reader& rd, const std::string& dir);
// The processes the checkpoint's run was split over (1 for runs saved before data-parallel).
int64_t saved_world_size(const gguf::Reader& rd);
// The identities of the base, donor and data files the run started with.
void read_finetune_checkpoint_files(const gguf::Reader& rd, FileIdentity& base, FileIdentity& donor,
                                    FileIdentity& data);
// Loads the state and tensors into a run built from those options; every value is checked.
void load_finetune_checkpoint(FinetuneRun& r, const gguf::Reader& rd);

}  // namespace toy
