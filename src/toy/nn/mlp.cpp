#include "toy/nn/mlp.h"

#include "toy/autograd/grad_mode.h"
#include "toy/ops/ops.h"

namespace toy::nn {

Tensor Mlp::operator()(const Tensor& x) const {
  if (kind == Kind::GELU) return down(gelu(up(x), gelu_approx));
  if (kind == Kind::GeGLU) return down(mul(gelu(gate(x), GeluApprox::Tanh), up(x)));
  if (!gate.defined()) return down(swiglu(up(x)));  // gate and up fused in one [2F, D] weight
  // Training: one matmul for gate and up together, then the packed swiglu (its backward
  // returns one packed gradient). Inference: two products (no per-call weight copy).
  if (grad_enabled() && gate.weight.requires_grad()) {
    Linear gate_up{concat({gate.weight, up.weight}, 0),
                   gate.bias.defined() ? concat({gate.bias, up.bias}, 0) : Tensor()};
    return down(swiglu(gate_up(x)));
  }
  return down(swiglu(gate(x), up(x)));
}

}  // namespace toy::nn
