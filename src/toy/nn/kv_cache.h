// Generation state owned by the caller: for every attention layer, the keys and values of
// the tokens seen so far, [batch, capacity, kv_heads, head_dim] in F32 or F16; for every
// recurrent layer, the last inputs of its causal conv [batch, conv_tail, channels] and (Gated
// DeltaNet; LFM2's short conv has none) its state [batch, ...], both F32 and fixed in size
// whatever the position.
// One model can serve several sequences, each with its own cache; the sequences of one cache
// advance together. Writing past the capacity is a toy::Error that says how to size the
// cache, never an overrun. A recurrent state cannot be cut back to a shorter prefix: clear()
// starts over. A sliding-window layer (Gemma 3's local layers) keeps only its window: its keys
// and values are a ring of min(capacity, window) positions, position p at slot p % ring.
#pragma once
#include <cstdint>
#include <vector>

#include "toy/core/tensor.h"

namespace toy::nn {

// What a recurrent layer keeps (all zero at the start).
struct RecurrentShape {
  int64_t conv_tail = 0, conv_channels = 0;  // the last conv_tail inputs of conv_channels
  Shape state;                               // per sequence (e.g. [V heads, Dk, Dv]); none: a conv tail only
  bool defined() const { return conv_channels > 0 || state.ndim() > 0; }
};

class KVCache {
 public:
  KVCache() = default;
  // Checks the memory it needs against what the machine has before allocating. `recurrent`
  // (empty, or one entry per layer) marks the layers that keep a recurrent state instead of
  // keys and values.
  // `windows` (empty, or one entry per layer, 0 = the whole context) sizes the sliding layers' rings.
  KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
          DType dtype = DType::F32, std::vector<RecurrentShape> recurrent = {}, Device device = Device::CPU,
          std::vector<int64_t> windows = {});

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t size() const { return len_; }  // tokens cached per sequence
  DType dtype() const { return dtype_; }
  bool empty() const { return layers_ == 0; }
  // Starts over: no tokens, recurrent states back to zero.
  void clear();

  // Throws unless `tokens` more fit.
  void check_room(int64_t tokens) const;
  Tensor& keys(int64_t layer) { return keys_[size_t(layer)]; }
  Tensor& values(int64_t layer) { return values_[size_t(layer)]; }
  // Positions a layer's keys hold: the capacity, or a sliding layer's ring (< capacity).
  int64_t slots(int64_t layer) const { return keys_[size_t(layer)].size(1); }
  bool ring(int64_t layer) const { return slots(layer) < capacity_; }
  // Bytes this cache holds (keys, values and recurrent states).
  double bytes() const;
  bool recurrent(int64_t layer) const { return size_t(layer) < conv_.size() && conv_[size_t(layer)].defined(); }
  Tensor& conv_tail(int64_t layer) { return conv_[size_t(layer)]; }  // [batch, conv_tail, channels]
  Tensor& state(int64_t layer) { return state_[size_t(layer)]; }     // [batch, ...state]
  // Called once every layer has written its `tokens` new keys and values.
  void advance(int64_t tokens) { len_ += tokens; }

  // Bytes a cache of this shape takes (attention layers only, each holding every position).
  static double bytes(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                      DType dtype);

 private:
  std::vector<Tensor> keys_, values_, conv_, state_;
  int64_t layers_ = 0, batch_ = 0, capacity_ = 0, len_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace toy::nn
