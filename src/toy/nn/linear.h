// nn::Linear — y = x W^T + b with the weight in whatever dtype it is stored in: F32 (trained
// by toy), F16, BF16 or a GGUF block type (loaded from a file and kept as the file has it).
// The one place a LoRA adapter will attach (the fine-tuning issue).
#pragma once
#include "toy/core/tensor.h"

namespace toy::nn {

struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out], or undefined

  bool defined() const { return weight.defined(); }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
  // x [..., in] -> [..., out]
  Tensor operator()(const Tensor& x) const;
};

}  // namespace toy::nn
