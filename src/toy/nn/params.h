// A model's parameters: one ordered list of named tensors, each named by its GGUF tensor
// name ("blk.3.attn_q.weight"). Optimizers, checkpoints, events and traces key on the name;
// lookups check the shape ("[params] blk.3.attn_q.weight: expected [768, 768], got ...").
#pragma once
#include <string>
#include <vector>

#include "toy/core/tensor.h"

namespace toy {

class ParamStore {
 public:
  // Adds a parameter (marked requires_grad unless frozen) and returns it.
  Tensor& add(const std::string& name, Tensor t, bool trainable = true);
  bool has(const std::string& name) const;
  Tensor& get(const std::string& name);
  const Tensor& get(const std::string& name) const;
  // Same, checking the shape.
  Tensor& get(const std::string& name, const Shape& expect);

  std::vector<Tensor>& all() { return params_; }
  const std::vector<Tensor>& all() const { return params_; }
  size_t size() const { return params_.size(); }
  int64_t numel() const;
  void zero_grad();

 private:
  std::vector<Tensor> params_;
};

}  // namespace toy
