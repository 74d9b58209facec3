// nn::Linear — y = x W^T + b with the weight in whatever dtype it is stored in: F32 (trained
// by toy), F16, BF16 or a GGUF block type (loaded from a file and kept as the file has it),
// plus an optional LoRA adapter: y += scale * (dropout(x) A^T) B^T, A [rank, in], B [out,
// rank] (llama.cpp's lora_a / lora_b). The base weight may be frozen and quantized while A
// and B train: the gradient to x flows through the stored weight's transpose.
#pragma once
#include "toy/core/rng.h"
#include "toy/core/tensor.h"

namespace toy::nn {

struct Lora {
  Tensor a;            // [rank, in] (an expert tensor's: [E, rank, in])
  Tensor b;            // [out, rank] ([E, out, rank])
  float scale = 1.0f;  // alpha / rank, times a user's scale
  float dropout = 0;   // on the adapter's input, while training

  bool defined() const { return a.defined(); }
  int64_t rank() const { return a.size(a.ndim() - 2); }
};

struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out], or undefined
  Lora lora;      // undefined unless an adapter is attached
  // Mixed precision: an F32 weight is rounded to this type (F16 or BF16) at each forward and
  // the product runs on the rounded weight and activations; the gradient reaches the F32
  // weight (the master) in F32. F32: off.
  DType compute = DType::F32;

  bool defined() const { return weight.defined(); }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
  // x [..., in] -> [..., out]
  Tensor operator()(const Tensor& x) const;
};

// While one is alive on this thread, forwards are training forwards: LoRA dropout draws its
// masks from `gen` (the model's dropout generator). Scopes nest; the innermost wins.
class TrainingScope {
 public:
  explicit TrainingScope(Generator& gen);
  ~TrainingScope();
  TrainingScope(const TrainingScope&) = delete;
  TrainingScope& operator=(const TrainingScope&) = delete;
  // The generator of the innermost scope, or nullptr outside any.
  static Generator* current();

 private:
  Generator* previous_;
};

}  // namespace toy::nn
