// nn::Embedding — rows of a table [rows, D] in any stored dtype (block types are dequantized
// row by row), always returned as f32 activations.
#pragma once
#include "toy/core/tensor.h"

namespace toy::nn {

struct Embedding {
  Tensor weight;  // [rows, D]

  // ids I32 [...] -> f32 [..., D]
  Tensor operator()(const Tensor& ids) const;
};

}  // namespace toy::nn
