#include "toy/models/shapes.h"

#include <fmt/core.h>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy {

const std::vector<ModelShape>& model_shapes() {
  static const std::vector<ModelShape> shapes = {
      //  name            arch     dim  layers heads kv  head_dim ffn   vocab   ctx    rope base  eps
      {"tiny", "", 256, 2, 4, 2, 0, 768, 1024, 2048, 10000.0f, 1e-6f},
      {"smollm2-135m", "llama", 576, 30, 9, 3, 0, 1536, 49152, 8192, 100000.0f, 1e-5f},
      {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 0, 4864, 151936, 32768, 1000000.0f, 1e-6f},
      {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f},
      {"gpt2-124m", "gpt2", 768, 12, 12, 12, 0, 3072, 50257, 1024, 10000.0f, 1e-5f},
  };
  return shapes;
}

std::string model_shape_pairs() {
  std::string s;
  for (const ModelShape& m : model_shapes())
    for (const char* arch : {"llama", "qwen2", "qwen3", "gpt2"})
      if (m.arch.empty() || m.arch == arch) s += fmt::format("  --arch {:<6} --shape {}\n", arch, m.name);
  return s;
}

ModelConfig shape_config(const std::string& arch, const std::string& shape) {
  for (const ModelShape& m : model_shapes()) {
    if (m.name != shape) continue;
    TOY_CHECK(m.arch.empty() || m.arch == arch, "[init] shape '{}' is a {} model, not {}; valid pairs:\n{}",
              printable(shape), m.arch, printable(arch), model_shape_pairs());
    ModelConfig c = ModelConfig::for_arch(arch);
    c.dim = m.dim;
    c.layers = m.layers;
    c.heads = m.heads;
    c.kv_heads = arch == "gpt2" ? m.heads : m.kv_heads;  // llama.cpp's gpt2 has no GQA
    c.head_dim = m.head_dim;
    if (arch == "qwen3" && shape == "tiny") c.head_dim = 2 * m.dim / m.heads;  // explicit, as Qwen3's
    c.ffn = m.ffn;
    c.vocab = m.vocab;
    c.ctx = m.ctx;
    c.rope.base = m.rope_base;
    c.norm_eps = m.norm_eps;
    c.tied = true;
    c.resolve();
    c.validate();
    return c;
  }
  fail("[init] unknown shape '{}'; valid pairs:\n{}", printable(shape), model_shape_pairs());
}

std::string shape_pretokenizer(const std::string& arch, const std::string& shape) {
  if (shape == "smollm2-135m") return "smollm";
  if (arch == "qwen2" || arch == "qwen3") return "qwen2";
  if (arch == "gpt2") return "gpt-2";
  return "llama-bpe";
}

}  // namespace toy
