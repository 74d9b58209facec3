// `--lora A.gguf [--lora-scale S]`: a LoRA adapter applied at load, unmerged, as llama.cpp's
// --lora / --lora-scaled apply one (effective scale S × alpha / rank).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "toy/io/model_file.h"

namespace toy::cli {

struct LoraFlags {
  std::string path;
  float scale = 1.0f;
};

void add_lora_flags(CLI::App* cmd, LoraFlags& f);
// Attaches the adapter to the loaded model when --lora was given.
void apply_lora_flags(const LoraFlags& f, LoadedModel& lm);

}  // namespace toy::cli
