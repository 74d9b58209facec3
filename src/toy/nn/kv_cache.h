// Generation state owned by the caller: for every attention layer, the keys and values of
// the tokens seen so far, [batch, capacity, kv_heads, head_dim] in F32 or F16. One model can
// serve several sequences, each with its own cache; the sequences of one cache advance
// together. Writing past the capacity is a toy::Error that says how to size the cache,
// never an overrun.
#pragma once
#include <cstdint>
#include <vector>

#include "toy/core/tensor.h"

namespace toy::nn {

class KVCache {
 public:
  KVCache() = default;
  // Checks the memory it needs against what the machine has before allocating.
  KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
          DType dtype = DType::F32);

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return len_; }  // tokens cached per sequence
  DType dtype() const { return dtype_; }
  bool empty() const { return keys_.empty(); }
  void clear() { len_ = 0; }

  // Throws unless `tokens` more fit.
  void check_room(int64_t tokens) const;
  Tensor& keys(int64_t layer) { return keys_[size_t(layer)]; }
  Tensor& values(int64_t layer) { return values_[size_t(layer)]; }
  // Called once every layer has written its `tokens` new keys and values.
  void advance(int64_t tokens) { len_ += tokens; }

  // Bytes a cache of this shape takes.
  static double bytes(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                      DType dtype);

 private:
  std::vector<Tensor> keys_, values_;
  int64_t batch_ = 0, capacity_ = 0, len_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace toy::nn
