#include "toy/nn/linear.h"

#include "toy/ops/ops.h"

namespace toy::nn {

Tensor Linear::operator()(const Tensor& x) const { return linear(x, weight, bias); }

}  // namespace toy::nn
