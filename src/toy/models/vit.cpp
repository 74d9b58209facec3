#include "toy/models/vit.h"

#include <cmath>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/rng.h"
#include "toy/core/text.h"
#include "toy/ops/ops.h"

namespace toy {

// ---- config -------------------------------------------------------------------------------

const std::vector<std::string>& VitConfig::preset_names() {
  static const std::vector<std::string> n = {"vit-tiny", "vit-mnist", "vit-digits"};
  return n;
}

VitConfig VitConfig::from_preset(const std::string& name) {
  VitConfig c;
  if (name == "vit-tiny") {  // DeiT-Tiny
    c.image = 224, c.channels = 3, c.patch = 16, c.dim = 192, c.layers = 12, c.heads = 3, c.mlp = 768, c.classes = 1000;
  } else if (name == "vit-mnist") {
    c.image = 28, c.channels = 1, c.patch = 4, c.dim = 128, c.layers = 6, c.heads = 4, c.mlp = 256, c.classes = 10;
  } else if (name == "vit-digits") {
    c.image = 8, c.channels = 1, c.patch = 2, c.dim = 64, c.layers = 4, c.heads = 4, c.mlp = 128, c.classes = 10;
  } else {
    fail("[vit] unknown preset '{}' (expected vit-tiny, vit-mnist or vit-digits)", printable(name));
  }
  return c;
}

void VitConfig::resolve() {
  if (class_names.empty())
    for (int64_t i = 0; i < classes; ++i) class_names.push_back(std::to_string(i));
  if (mean.empty()) mean.assign(size_t(std::max<int64_t>(channels, 0)), 0.5f);
  if (std.empty()) std.assign(size_t(std::max<int64_t>(channels, 0)), 0.5f);
}

void VitConfig::validate() const {
  TOY_CHECK(channels == 1 || channels == 3, "[vit] channels must be 1 or 3, got {}", channels);
  TOY_CHECK(image >= 1 && image <= 4096, "[vit] the image size must be in 1..4096 pixels, got {}", image);
  TOY_CHECK(patch >= 1 && patch <= image && image % patch == 0,
            "[vit] --patch {} must divide the image size {}", patch, image);
  TOY_CHECK(dim >= 1 && dim <= 16384, "[vit] --dim must be in 1..16384, got {}", dim);
  TOY_CHECK(layers >= 1 && layers <= 256, "[vit] --layers must be in 1..256, got {}", layers);
  TOY_CHECK(heads >= 1 && dim % heads == 0, "[vit] --heads {} must divide --dim {}", heads, dim);
  TOY_CHECK(mlp >= 1 && mlp <= 65536, "[vit] --mlp must be in 1..65536, got {}", mlp);
  TOY_CHECK(classes >= 2 && classes <= 100000, "[vit] classes must be in 2..100000, got {}", classes);
  TOY_CHECK(pool == "cls" || pool == "mean", "[vit] --pool must be cls or mean, got '{}'", printable(pool));
  TOY_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps < 1, "[vit] norm eps must be in (0, 1), got {}",
            norm_eps);
  TOY_CHECK(class_names.empty() || int64_t(class_names.size()) == classes,
            "[vit] {} class names for {} classes", class_names.size(), classes);
  TOY_CHECK(mean.empty() || int64_t(mean.size()) == channels, "[vit] {} mean values for {} channels", mean.size(),
            channels);
  TOY_CHECK(std.empty() || int64_t(std.size()) == channels, "[vit] {} std values for {} channels", std.size(),
            channels);
  for (size_t c = 0; c < mean.size(); ++c) TOY_CHECK(std::isfinite(mean[c]), "[vit] mean[{}] is not finite", c);
  for (size_t c = 0; c < std.size(); ++c)
    TOY_CHECK(std::isfinite(std[c]) && std[c] > 0, "[vit] std[{}] must be positive, got {}", c, std[c]);
}

nlohmann::json VitConfig::to_json() const {
  return {{"image", image},   {"channels", channels}, {"patch", patch},           {"dim", dim},
          {"layers", layers}, {"heads", heads},       {"mlp", mlp},               {"classes", classes},
          {"pool", pool},     {"norm_eps", norm_eps}, {"class_names", class_names}, {"mean", mean},
          {"std", std}};
}

VitConfig VitConfig::from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  VitConfig c;
  c.image = get_int(j, "image", where);
  c.channels = get_int(j, "channels", where);
  c.patch = get_int(j, "patch", where);
  c.dim = get_int(j, "dim", where);
  c.layers = get_int(j, "layers", where);
  c.heads = get_int(j, "heads", where);
  c.mlp = get_int(j, "mlp", where);
  c.classes = get_int(j, "classes", where);
  c.pool = get_string(j, "pool", where);
  c.norm_eps = get_float(j, "norm_eps", where);
  for (const auto& n : get_array(j, "class_names", where)) {
    TOY_CHECK(n.is_string(), "{}: class_names must be strings", where);
    c.class_names.push_back(n.get<std::string>());
  }
  for (const char* key : {"mean", "std"}) {
    std::vector<float>& dst = std::string(key) == "mean" ? c.mean : c.std;
    for (const auto& v : get_array(j, key, where)) {
      TOY_CHECK(v.is_number(), "{}: {} must be numbers", where, key);
      dst.push_back(v.get<float>());
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  return c;
}

// ---- model --------------------------------------------------------------------------------

Vit::Vit(VitConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.resolve();
  cfg_.validate();
  const int64_t D = cfg_.dim, F = cfg_.mlp, C = cfg_.channels, p = cfg_.patch;
  auto add = [&](const std::string& name, Shape s) -> Tensor { return params_.add(name, zeros(s)); };
  auto norm = [&](const std::string& base) {
    return nn::Norm{nn::Norm::Kind::Layer, add(base + ".weight", Shape{D}), add(base + ".bias", Shape{D}),
                    cfg_.norm_eps};
  };
  auto linear = [&](const std::string& base, int64_t out, int64_t in) {
    Tensor w = add(base + ".weight", Shape{out, in});
    return nn::Linear{w, add(base + ".bias", Shape{out})};
  };
  patch_ = linear("patch_embd", D, C * p * p);
  if (cfg_.pool == "cls") cls_ = add("cls_embd.weight", Shape{1, D});
  pos_ = add("position_embd.weight", Shape{cfg_.tokens(), D});
  for (int64_t l = 0; l < cfg_.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    Block blk;
    blk.attn_norm = norm(b + "attn_norm");
    blk.attn.heads = blk.attn.kv_heads = cfg_.heads;
    blk.attn.head_dim = D / cfg_.heads;
    blk.attn.causal = false;  // every patch sees every other
    blk.attn.qkv = linear(b + "attn_qkv", 3 * D, D);
    blk.attn.out = linear(b + "attn_output", D, D);
    blk.ffn_norm = norm(b + "ffn_norm");
    blk.mlp.kind = nn::Mlp::Kind::GELU;
    blk.mlp.gelu_approx = GeluApprox::None;
    blk.mlp.up = linear(b + "ffn_up", F, D);
    blk.mlp.down = linear(b + "ffn_down", D, F);
    blocks_.push_back(std::move(blk));
  }
  out_norm_ = norm("output_norm");
  head_ = linear("cls_head", cfg_.classes, D);
}

void Vit::init(uint64_t seed) {
  NoGradGuard ng;
  uint64_t stream = 0;
  for (Tensor& t : params_.values()) {
    Generator g(seed, ++stream);
    const std::string& n = t.name();
    if (n.ends_with(".bias") || n.starts_with("cls_head.")) {
      fill_(t, 0.0);
    } else if (n.find("norm.") != std::string::npos) {
      fill_(t, 1.0);
    } else {
      // Truncated normal: N(0, 0.02) redrawn (from the same stream, in order) outside 2 std.
      fill_normal_(t, g, 0.0f, 0.02f);
      float* v = t.data<float>();
      std::vector<int64_t> bad;
      for (int64_t i = 0; i < t.numel(); ++i)
        if (std::fabs(v[i]) > 0.04f) bad.push_back(i);
      while (!bad.empty()) {
        Tensor r = randn(Shape{int64_t(bad.size())}, g, 0.0f, 0.02f);
        const float* rv = r.data<float>();
        std::vector<int64_t> still;
        for (size_t k = 0; k < bad.size(); ++k) {
          v[bad[k]] = rv[k];
          if (std::fabs(rv[k]) > 0.04f) still.push_back(bad[k]);
        }
        bad.swap(still);
      }
    }
  }
}

Tensor Vit::input(const uint8_t* pixels, int64_t n) const {
  const int64_t C = cfg_.channels, hw = cfg_.image * cfg_.image;
  Tensor x = empty(Shape{n, C, cfg_.image, cfg_.image});
  float* dst = x.data<float>();
  for (int64_t c = 0; c < C; ++c) {
    // (p / 255 - mean) / std = p * a + b
    const float a = 1.0f / (255.0f * cfg_.std[size_t(c)]), b = -cfg_.mean[size_t(c)] / cfg_.std[size_t(c)];
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* src = pixels + (i * C + c) * hw;
      float* d = dst + (i * C + c) * hw;
      for (int64_t k = 0; k < hw; ++k) d[k] = float(src[k]) * a + b;
    }
  }
  return x;
}

Device Vit::device() const { return patch_.weight.device(); }

void Vit::set_mixed_precision(DType compute) {
  for (nn::Linear* l : {&patch_, &head_}) l->compute = compute;
  for (Block& b : blocks_)
    for (nn::Linear* l : {&b.attn.qkv, &b.attn.q, &b.attn.k, &b.attn.v, &b.attn.out, &b.mlp.gate, &b.mlp.up,
                          &b.mlp.down})
      l->compute = compute;
}

Tensor Vit::logits(const Tensor& images_in) const {
  const Tensor images = to(images_in, device());
  const int64_t N = images.size(0), D = cfg_.dim, p = cfg_.patch;
  TOY_CHECK(images.ndim() == 4 && images.size(1) == cfg_.channels && images.size(2) == cfg_.image &&
                images.size(3) == cfg_.image,
            "[vit] expected images [N, {}, {}, {}], got {}", cfg_.channels, cfg_.image, cfg_.image,
            images.shape().str());
  Conv2dOptions co;
  co.stride_h = co.stride_w = int(p);
  Tensor x = patch_(im2col(images, int(p), int(p), co));  // [N, P, D]
  if (cls_.defined()) x = concat({expand(reshape(cls_, Shape{1, 1, D}), Shape{N, 1, D}), x}, 1);
  x = add(x, pos_);
  for (const Block& b : blocks_) {
    x = add(x, b.attn(b.attn_norm(x), Tensor()));
    x = add(x, b.mlp(b.ffn_norm(x)));
  }
  x = out_norm_(x);
  Tensor pooled = cls_.defined() ? reshape(slice(x, 1, 0, 1), Shape{N, D}) : mean(x, 1);
  return head_(pooled);
}

Tensor classification_loss(const Tensor& logits, const Tensor& labels, float label_smoothing) {
  // Labels made on the host are checked there before their upload (the op on a device then
  // need not read them back).
  const int32_t ignore = CrossEntropyOptions{}.ignore_index;
  const Tensor on_device = !is_host(logits.device()) && is_host(labels.device()) && logits.ndim() >= 1
                               ? upload_checked_ids(labels, logits.device(), logits.size(logits.ndim() - 1), "vit",
                                                    "labels", &ignore)
                               : to(labels, logits.device());
  Tensor ce = cross_entropy(logits, on_device);
  if (label_smoothing <= 0) return ce;
  Tensor uniform = neg(mean(log_softmax(logits)));
  return add(scale(ce, 1.0f - label_smoothing), scale(uniform, label_smoothing));
}

}  // namespace toy
