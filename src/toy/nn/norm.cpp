#include "toy/nn/norm.h"

#include "toy/ops/ops.h"

namespace toy::nn {

Tensor Norm::operator()(const Tensor& x) const {
  return kind == Kind::RMS ? rms_norm(x, weight, eps) : layer_norm(x, weight, bias, eps);
}

}  // namespace toy::nn
