// model.gguf: a DecoderLM's weights (llama.cpp tensor names, F32), its hyper-parameters as
// the standard GGUF keys of its architecture (gpt2 / llama; "toy" for models llama.cpp cannot
// express), the tokenizer, and toy.config (the full ModelConfig as JSON) so toy rebuilds
// exactly what it trained.
#pragma once
#include <memory>
#include <string>

#include "toy/io/gguf.h"
#include "toy/models/decoder_lm.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy {

struct LoadedModel {
  std::unique_ptr<DecoderLM> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string arch;
};

// Adds the model's metadata, tokenizer and weights to w (checkpoints add more on top).
void add_model_to_gguf(gguf::Writer& w, const DecoderLM& m, const Tokenizer& tok, const std::string& name);
// Writes path atomically.
void save_model(const std::string& path, const DecoderLM& m, const Tokenizer& tok, const std::string& name = "toy");
// Rebuilds the model from a reader (weights copied out of the mapping).
LoadedModel load_model(const gguf::Reader& r);
LoadedModel load_model(const std::string& path);

}  // namespace toy
