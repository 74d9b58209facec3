// A ViT's GGUF file (architecture "vit"; toy's own keys, documented in the README):
//   general.architecture "vit", general.name
//   vit.image_size, vit.num_channels, vit.patch_size, vit.embedding_length, vit.block_count,
//   vit.attention.head_count, vit.feed_forward_length (u32), vit.attention.layer_norm_epsilon
//   (f32), vit.pooling ("cls" | "mean"), vit.class_names (string array, one per class),
//   vit.image_mean, vit.image_std (f32 arrays, one per channel: the input normalisation)
// and the tensors named in models/vit.h (F32).
#pragma once
#include <memory>
#include <string>

#include "toy/io/gguf.h"
#include "toy/models/vit.h"

namespace toy {

void add_vit_to_gguf(gguf::Writer& w, const Vit& m, const std::string& name);
void save_vit(const std::string& path, const Vit& m, const std::string& name = "toy vit");
// The config a file describes (checked), without its tensors.
VitConfig vit_config_from_gguf(const gguf::Reader& r);
// The model with its weights copied in (F32, trainable). Throws toy::Error naming the file.
std::unique_ptr<Vit> load_vit(const gguf::Reader& r);
std::unique_ptr<Vit> load_vit(const std::string& path);

}  // namespace toy
