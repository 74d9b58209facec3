// nn::Mlp — the feed-forward block: SwiGLU (down(silu(gate x) * up x), llama/qwen) or GELU
// (down(gelu(up x)), GPT-2 with tanh's approximation, ViT with erf).
#pragma once
#include "toy/nn/linear.h"
#include "toy/ops/ops.h"

namespace toy::nn {

struct Mlp {
  enum class Kind { SwiGLU, GELU };
  Kind kind = Kind::SwiGLU;
  GeluApprox gelu_approx = GeluApprox::Tanh;  // GPT-2's tanh form; a ViT uses the exact erf form
  Linear gate, up, down;  // gate only for SwiGLU

  Tensor operator()(const Tensor& x) const;
};

}  // namespace toy::nn
