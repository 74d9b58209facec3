// nn::Norm — RMSNorm (weight) or LayerNorm (weight and bias) over the last axis.
#pragma once
#include "toy/core/tensor.h"

namespace toy::nn {

struct Norm {
  enum class Kind { RMS, Layer };
  Kind kind = Kind::RMS;
  Tensor weight;  // [D]
  Tensor bias;    // [D] (LayerNorm with biases), or undefined
  float eps = 1e-5f;

  bool defined() const { return weight.defined(); }
  Tensor operator()(const Tensor& x) const;
};

}  // namespace toy::nn
