#include "toy/io/model_file.h"

#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/ops/ops.h"

namespace toy {

void add_model_to_gguf(gguf::Writer& w, const DecoderLM& m, const Tokenizer& tok, const std::string& name) {
  const ModelConfig& c = m.config();
  const std::string arch = c.gguf_arch(tok.kind() != "char");
  using gguf::Value;
  w.set("general.architecture", Value::str(arch));
  w.set("general.name", Value::str(name));
  w.set("general.file_type", Value::u32(0));  // all F32
  w.set(arch + ".vocab_size", Value::u32(uint32_t(c.vocab)));
  w.set(arch + ".context_length", Value::u32(uint32_t(c.ctx)));
  w.set(arch + ".embedding_length", Value::u32(uint32_t(c.dim)));
  w.set(arch + ".block_count", Value::u32(uint32_t(c.layers)));
  w.set(arch + ".feed_forward_length", Value::u32(uint32_t(c.ffn)));
  w.set(arch + ".attention.head_count", Value::u32(uint32_t(c.heads)));
  w.set(arch + ".attention.head_count_kv", Value::u32(uint32_t(c.kv_heads)));
  if (c.norm == NormKind::RMS)
    w.set(arch + ".attention.layer_norm_rms_epsilon", Value::f32(c.norm_eps));
  else
    w.set(arch + ".attention.layer_norm_epsilon", Value::f32(c.norm_eps));
  if (c.pos == PosKind::RoPE) {
    w.set(arch + ".rope.dimension_count", Value::u32(uint32_t(c.head_dim())));
    w.set(arch + ".rope.freq_base", Value::f32(c.rope_base));
  }
  w.set("toy.config", Value::str(c.to_json().dump()));
  tok.save(w);
  for (const Tensor& p : m.params().all()) w.add_tensor(p.name(), p.detach());
}

void save_model(const std::string& path, const DecoderLM& m, const Tokenizer& tok, const std::string& name) {
  gguf::Writer w;
  add_model_to_gguf(w, m, tok, name);
  w.write(path);
}

LoadedModel load_model(const gguf::Reader& r) {
  LoadedModel out;
  const std::string shown = printable(r.path());
  out.arch = r.has("general.architecture") ? r.get_str("general.architecture") : "";
  TOY_CHECK(r.has("toy.config"), "[model] '{}' has no toy.config key: only models written by toy can be loaded so far "
            "(architecture '{}')", shown, printable(out.arch));
  const std::string where = fmt::format("[model] '{}' key toy.config", shown);
  ModelConfig cfg = ModelConfig::from_json(json_fields::parse_object(r.get_str("toy.config"), where), where);
  // Every tensor is checked against the config before anything is allocated: a config that
  // claims a huge context or width fails here, not after allocating gigabytes.
  const auto shapes = DecoderLM::parameter_shapes(cfg);
  uint64_t bytes = 0;
  for (const auto& [name, shape] : shapes) {
    const gguf::TensorInfo* ti = r.find_tensor(name);
    TOY_CHECK(ti != nullptr, "[model] '{}': missing tensor '{}'", shown, name);
    TOY_CHECK(ti->shape == shape, "[model] '{}': tensor '{}' has shape {}, the config says {}", shown, name,
              ti->shape.str(), shape.str());
    bytes += uint64_t(shape.numel()) * sizeof(float);
  }
  const uint64_t avail = available_memory_bytes();
  TOY_CHECK(bytes <= avail, "[model] '{}': its weights need {} as F32, more than the {} available", shown,
            format_bytes(double(bytes)), format_bytes(double(avail)));
  out.tokenizer = Tokenizer::load(r);
  TOY_CHECK(out.tokenizer->vocab_size() == cfg.vocab, "[model] '{}': tokenizer has {} tokens, the model {}", shown,
            out.tokenizer->vocab_size(), cfg.vocab);
  out.model = std::make_unique<DecoderLM>(cfg);
  NoGradGuard ng;
  for (Tensor& p : out.model->params().all()) copy_(p, r.tensor(p.name()));  // converts f16/bf16/blocks
  return out;
}

LoadedModel load_model(const std::string& path) {
  gguf::Reader r(path);
  return load_model(r);
}

}  // namespace toy
