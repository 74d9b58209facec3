// nn::Mlp — the feed-forward block: SwiGLU (down(silu(gate x) * up x), llama/qwen) or GELU
// (down(gelu(up x)), GPT-2).
#pragma once
#include "toy/nn/linear.h"

namespace toy::nn {

struct Mlp {
  enum class Kind { SwiGLU, GELU };
  Kind kind = Kind::SwiGLU;
  Linear gate, up, down;  // gate only for SwiGLU

  Tensor operator()(const Tensor& x) const;
};

}  // namespace toy::nn
