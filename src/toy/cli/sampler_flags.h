// The sampling flags `toy generate` and `toy chat` share (names as llama.cpp spells them).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>

#include "toy/infer/sampler.h"

namespace toy::cli {

struct SamplingFlags {
  SamplerConfig config;
  uint64_t seed = 1;
};

void add_sampling_flags(CLI::App* cmd, SamplingFlags& f);

}  // namespace toy::cli
