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
      // Qwen3.5-0.8B's text model (its Gated DeltaNet widths: shape_config).
      {"qwen3.5-0.8b", "qwen35", 1024, 24, 8, 2, 256, 3584, 248320, 262144, 10000000.0f, 1e-6f},
  };
  return shapes;
}

std::string model_shape_pairs() {
  std::string s;
  for (const ModelShape& m : model_shapes())
    for (const char* arch : {"llama", "qwen2", "qwen3", "qwen35", "gpt2"})
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
    if (arch == "qwen35") {
      // A quarter of each head rotated; Gated DeltaNet layers with every 4th attention — on
      // tiny's 2 layers one of each, with fewer K heads than V heads (the repeat convention).
      c.rope.n_rot = (c.head_dim ? c.head_dim : c.dim / c.heads) / 4;
      if (shape == "tiny") {
        c.layer_kinds = ModelConfig::parse_layer_kinds("da", c.layers);
        c.gdn = GdnConfig{2, 4, 32, 4};
      } else {
        c.layer_kinds = ModelConfig::interval_layer_kinds(4, c.layers);
        c.gdn = GdnConfig{16, 16, 128, 4};  // Qwen3.5-0.8B: linear_num_key/value_heads, head dims, conv
      }
    }
    c.resolve();
    c.validate();
    return c;
  }
  fail("[init] unknown shape '{}'; valid pairs:\n{}", printable(shape), model_shape_pairs());
}

std::string shape_pretokenizer(const std::string& arch, const std::string& shape) {
  if (shape == "smollm2-135m") return "smollm";
  if (arch == "qwen2" || arch == "qwen3") return "qwen2";
  if (arch == "qwen35") return "qwen35";
  if (arch == "gpt2") return "gpt-2";
  return "llama-bpe";
}

}  // namespace toy
