// nn::Mlp — the feed-forward block: SwiGLU (down(silu(gate x) * up x), llama/qwen), GeGLU
// (down(gelu_tanh(gate x) * up x), Gemma) or GELU (down(gelu(up x)), GPT-2 with tanh's
// approximation, ViT with erf). A SwiGLU without `gate` has gate and up fused in `up`
// ([2F, D]: gate rows, then up rows; Phi-3).
#pragma once
#include "toy/nn/linear.h"
#include "toy/ops/ops.h"

namespace toy::nn {

struct Mlp {
  enum class Kind { SwiGLU, GELU, GeGLU };
  Kind kind = Kind::SwiGLU;
  GeluApprox gelu_approx = GeluApprox::Tanh;  // GPT-2's tanh form; a ViT uses the exact erf form
  Linear gate, up, down;  // gate only for SwiGLU (unless fused into up) and GeGLU

  Tensor operator()(const Tensor& x) const;
};

}  // namespace toy::nn
