#include "toy/cli/lora_flags.h"

#include "toy/cli/flags.h"
#include "toy/models/lora.h"

namespace toy::cli {

void add_lora_flags(CLI::App* cmd, LoraFlags& f) {
  cmd->add_option("--lora", f.path, "LoRA adapter (GGUF, llama.cpp's adapter format) applied at load");
  add_real(cmd, "--lora-scale", f.scale, Range{-1e6, 1e6}, "Scale of the adapter (effective: S x alpha / rank)");
}

void apply_lora_flags(const LoraFlags& f, LoadedModel& lm) {
  if (!f.path.empty()) load_lora_adapter(*lm.model, lm.arch, f.path, f.scale);
}

}  // namespace toy::cli
