#include "toy/nn/linear.h"

#include "toy/ops/ops.h"

namespace toy::nn {

namespace {
thread_local Generator* training_gen = nullptr;
}

TrainingScope::TrainingScope(Generator& gen) : previous_(training_gen) { training_gen = &gen; }
TrainingScope::~TrainingScope() { training_gen = previous_; }
Generator* TrainingScope::current() { return training_gen; }

Tensor Linear::operator()(const Tensor& x) const {
  const bool rounded = compute != DType::F32 && weight.dtype() == DType::F32;
  Tensor y = linear(x, rounded ? cast(weight, compute) : weight, bias);
  if (!lora.defined()) return y;
  Tensor in = x;
  if (lora.dropout > 0 && training_gen) in = dropout(x, lora.dropout, true, *training_gen);
  Tensor low = linear(linear(in, lora.a), lora.b);
  return add(y, lora.scale == 1.0f ? low : scale(low, lora.scale));
}

}  // namespace toy::nn
