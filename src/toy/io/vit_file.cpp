#include "toy/io/vit_file.h"

#include <fmt/core.h>

#include "toy/autograd/grad_mode.h"
#include "toy/core/text.h"
#include "toy/ops/ops.h"

namespace toy {

using gguf::Value;

void add_vit_to_gguf(gguf::Writer& w, const Vit& m, const std::string& name) {
  const VitConfig& c = m.config();
  w.set("general.architecture", Value::str("vit"));
  w.set("general.name", Value::str(name));
  w.set("general.file_type", Value::u32(0));
  w.set("vit.image_size", Value::u32(uint32_t(c.image)));
  w.set("vit.num_channels", Value::u32(uint32_t(c.channels)));
  w.set("vit.patch_size", Value::u32(uint32_t(c.patch)));
  w.set("vit.embedding_length", Value::u32(uint32_t(c.dim)));
  w.set("vit.block_count", Value::u32(uint32_t(c.layers)));
  w.set("vit.attention.head_count", Value::u32(uint32_t(c.heads)));
  w.set("vit.feed_forward_length", Value::u32(uint32_t(c.mlp)));
  w.set("vit.attention.layer_norm_epsilon", Value::f32(c.norm_eps));
  w.set("vit.pooling", Value::str(c.pool));
  w.set("vit.class_names", Value::str_array(c.class_names));
  w.set("vit.image_mean", Value::f32_array(c.mean));
  w.set("vit.image_std", Value::f32_array(c.std));
  for (const Tensor& p : m.params().values()) w.add_tensor(p.name(), p.detach());
}

void save_vit(const std::string& path, const Vit& m, const std::string& name) {
  gguf::Writer w;
  add_vit_to_gguf(w, m, name);
  w.write(path);
}

VitConfig vit_config_from_gguf(const gguf::Reader& r) {
  const std::string shown = printable(r.path());
  const std::string arch = r.has("general.architecture") ? r.get_str("general.architecture") : "";
  TOY_CHECK(arch == "vit", "[vit] '{}' is not a ViT image classifier (architecture '{}'; toy vision train makes one)",
            shown, printable(arch));
  try {
    VitConfig c;
    c.image = r.get_u32("vit.image_size");
    c.channels = r.get_u32("vit.num_channels");
    c.patch = r.get_u32("vit.patch_size");
    c.dim = r.get_u32("vit.embedding_length");
    c.layers = r.get_u32("vit.block_count");
    c.heads = r.get_u32("vit.attention.head_count");
    c.mlp = r.get_u32("vit.feed_forward_length");
    c.norm_eps = r.get_f32("vit.attention.layer_norm_epsilon");
    c.pool = r.get_str("vit.pooling");
    const Value* names = r.find("vit.class_names");
    TOY_CHECK(names && names->type == gguf::Type::ARRAY && names->elem == gguf::Type::STRING,
              "key vit.class_names (an array of strings) is missing");
    c.class_names = names->as;
    c.classes = int64_t(c.class_names.size());
    for (const char* key : {"vit.image_mean", "vit.image_std"}) {
      const Value* v = r.find(key);
      TOY_CHECK(v && v->type == gguf::Type::ARRAY && v->elem == gguf::Type::F32, "key {} (an f32 array) is missing",
                key);
      std::vector<float>& dst = std::string(key) == "vit.image_mean" ? c.mean : c.std;
      for (double x : v->af) dst.push_back(float(x));
    }
    c.validate();
    return c;
  } catch (const Error& e) {
    fail("[vit] '{}': {}", shown, e.what());
  }
}

std::unique_ptr<Vit> load_vit(const gguf::Reader& r) {
  auto m = std::make_unique<Vit>(vit_config_from_gguf(r));
  const std::string shown = printable(r.path());
  NoGradGuard ng;
  for (Param& p : m->params().all()) {
    const gguf::TensorInfo* ti = r.find_tensor(p.name);
    TOY_CHECK(ti != nullptr, "[vit] '{}': missing tensor '{}'", shown, p.name);
    TOY_CHECK(ti->shape == p.value.shape(), "[vit] '{}': tensor '{}' has shape {}, expected {}", shown, p.name,
              ti->shape.str(), p.value.shape().str());
    copy_(p.value, r.tensor(p.name));
  }
  TOY_CHECK(r.tensors().size() == m->params().size(), "[vit] '{}' holds {} tensors; a ViT of its config has {}",
            shown, r.tensors().size(), m->params().size());
  return m;
}

std::unique_ptr<Vit> load_vit(const std::string& path) {
  gguf::Reader r(path);
  return load_vit(r);
}

}  // namespace toy
