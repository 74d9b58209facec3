// Model files: a DecoderLM's weights under llama.cpp's tensor names, its hyper-parameters as
// the standard GGUF keys of its architecture (gpt2 / llama / qwen2 / qwen3; "toy" for models
// llama.cpp cannot express), the tokenizer, and — for models toy trains — toy.config (the
// full ModelConfig as JSON) so toy rebuilds exactly what it trained. Files from elsewhere
// load from the standard keys alone.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "toy/io/gguf.h"
#include "toy/io/quantize.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {

struct LoadedModel {
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string arch;
};

struct ModelWriteOptions {
  // false: the standard keys alone, as llama.cpp's converter writes a file (toy init); a
  // model only toy can express ("toy" architecture) always carries toy.config.
  bool toy_config = true;
  std::string chat_template;         // tokenizer.chat_template, when not empty
  const QuantKind* quant = nullptr;  // weights converted as llama-quantize would
  // A depth-scaled model (ModelConfig::depth_scale) written with the scale folded into its
  // pre-block norms (a plain file llama.cpp runs); checkpoints keep it unfolded (they train on).
  bool fold_depth_scale = true;
};

// The keys of a model file for config c (architecture, hyper-parameters, tokenizer, chat
// template), as add_model_to_gguf writes them; `all_f32` says every weight is F32 (file_type 0
// when not quantized). For writers that add the tensors themselves (toy init, one at a time).
void add_model_keys(gguf::Writer& w, const ModelConfig& c, const Tokenizer& tok, const std::string& name,
                    const ModelWriteOptions& options, bool all_f32);
// Adds the model's metadata, tokenizer and weights to w (checkpoints add more on top).
void add_model_to_gguf(gguf::Writer& w, const DecoderLM& m, const Tokenizer& tok, const std::string& name,
                       const ModelWriteOptions& options = {});
// Writes path atomically.
void save_model(const std::string& path, const DecoderLM& m, const Tokenizer& tok, const std::string& name = "toy");
// Infer: the weights stay as the file stores them (views of the mapping, any dtype, frozen;
// loading takes milliseconds and memory only for the pages touched). Train: f32 copies that
// train (a checkpoint continuing).
enum class LoadMode { Infer, Train };

// The model's configuration from its keys (toy.config when toy wrote it); throws naming the
// file and key for anything missing or out of range, or an unsupported architecture.
ModelConfig config_from_gguf(const gguf::Reader& r);
// Builds the model and its tokenizer; every tensor is checked against the configuration
// before anything is allocated.
LoadedModel load_model(const gguf::Reader& r, LoadMode mode = LoadMode::Infer);
LoadedModel load_model(const std::string& path, LoadMode mode = LoadMode::Infer);

}  // namespace toy
