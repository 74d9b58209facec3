// ViT: a Vision Transformer image classifier (Dosovitskiy et al. 2021; DeiT's recipe) on the
// same nn modules as the language models:
//   image [N, C, S, S] -> patches (a strided conv: im2col + one matmul) [N, P, D]
//   -> a class token in front (pool cls) -> + learned positions -> L pre-norm blocks
//      (x + Attention(LayerNorm x), non-causal; x + MLP(LayerNorm x), exact GELU)
//   -> final LayerNorm -> the class token's row (cls) or the mean over patches (mean)
//   -> linear head -> logits [N, classes].
// Input: 8-bit pixels scaled to [0, 1], then (x - mean[c]) / std[c] per channel; the model
// stores mean and std (measured on its training set) so a file classifies raw images alone.
// Parameter (GGUF tensor) names:
//   patch_embd.weight [D, C*p*p] (rows in (c, ky, kx) order), patch_embd.bias [D]
//   cls_embd.weight [1, D] (pool cls only)         position_embd.weight [T, D]
//   blk.N.attn_norm.weight/.bias [D]   blk.N.attn_qkv.weight [3D, D] / .bias [3D] (q, k, v rows)
//   blk.N.attn_output.weight [D, D] / .bias        blk.N.ffn_norm.weight/.bias [D]
//   blk.N.ffn_up.weight [F, D] / .bias [F]         blk.N.ffn_down.weight [D, F] / .bias [D]
//   output_norm.weight/.bias [D]                   cls_head.weight [K, D] / .bias [K]
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "toy/nn/attention.h"
#include "toy/nn/linear.h"
#include "toy/nn/mlp.h"
#include "toy/nn/norm.h"
#include "toy/nn/params.h"

namespace toy {

struct VitConfig {
  int64_t image = 28, channels = 1, patch = 4;
  int64_t dim = 128, layers = 6, heads = 4, mlp = 256;
  int64_t classes = 10;
  std::string pool = "cls";  // cls | mean
  float norm_eps = 1e-6f;
  std::vector<std::string> class_names;  // classes entries (empty: "0", "1", ... when saved)
  std::vector<float> mean, std;          // per channel (empty: 0.5 / 0.5)

  int64_t grid() const { return image / patch; }
  int64_t patches() const { return grid() * grid(); }
  int64_t tokens() const { return patches() + (pool == "cls" ? 1 : 0); }
  // vit-tiny (DeiT-Tiny, 224x224x3), vit-mnist (28x28x1), vit-digits (8x8x1).
  static VitConfig from_preset(const std::string& name);
  static const std::vector<std::string>& preset_names();
  // Fills what is left empty (class names, mean/std) and checks every field.
  void resolve();
  void validate() const;  // toy::Error naming the first bad field
  nlohmann::json to_json() const;
  static VitConfig from_json(const nlohmann::json& j, const std::string& where);
};

class Vit {
 public:
  explicit Vit(VitConfig cfg);  // F32 zero parameters, trainable; call init()
  const VitConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  // DeiT's init: truncated normal (std 0.02, cut at 2 std) for the patch embedding, class
  // token, positions and every block matrix; zero biases; LayerNorm 1 and 0; a zero head.
  // Each parameter draws from its own stream of the seed.
  void init(uint64_t seed);
  // images F32 [N, C, S, S], already normalised -> logits [N, classes].
  Tensor logits(const Tensor& images) const;  // images made on the host are uploaded once
  Device device() const;  // where the weights live (params().move_to moves them)
  // 8-bit planar images (n of them, C x S x S each) -> the normalised F32 [n, C, S, S] input.
  Tensor input(const uint8_t* pixels, int64_t n) const;
  // Mixed precision: the patch embedding, every block projection and the head multiply in
  // `compute` (BF16) over their F32 masters (nn::Linear::compute); F32 turns it off.
  void set_mixed_precision(DType compute);

 private:
  struct Block {
    nn::Norm attn_norm, ffn_norm;
    nn::Attention attn;
    nn::Mlp mlp;
  };
  VitConfig cfg_;
  ParamStore params_;
  nn::Linear patch_;
  Tensor cls_, pos_;
  std::vector<Block> blocks_;
  nn::Norm out_norm_;
  nn::Linear head_;
};

// Label-smoothed cross-entropy (PyTorch's definition): (1 - eps) * CE(logits, y) + eps * mean
// over classes of -log softmax(logits); logits [N, K], labels I32 [N].
Tensor classification_loss(const Tensor& logits, const Tensor& labels, float label_smoothing);

}  // namespace toy
