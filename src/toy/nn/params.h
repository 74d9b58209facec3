// A model's parameters: one ordered list of records, one per named tensor, each named by its
// GGUF tensor name ("blk.3.attn_q.weight"). The record is the one inventory the optimizer,
// gradient clipping, checkpoints, the trainer and the fine-tuner share (llm.c's
// ParameterTensors in spirit: one layout for parameters, gradients and moments):
//   value     the master tensor: F32 when it trains; a frozen weight may keep its file's
//             dtype (F16, BF16, a GGUF block type; a view of the mapped file)
//   compute   what the modules bind to: `value` itself (under mixed precision the module
//             rounds it to BF16/F16 at each forward — nn::Linear::compute — so the gradient
//             reaches the F32 master without a second stored copy)
//   trainable whether it gets a gradient and optimizer state
//   decay     whether AdamW's decoupled weight decay applies (matrices; not norms, biases)
//   m, v      AdamW's moments, allocated for trainable parameters only (AdamW does it)
// The flat arena (pack(); AdamW packs its store): the trainable parameters' values,
// gradients and moments in four contiguous buffers in parameter order, each parameter's
// value, m and v a view of its range and its gradient accumulated into its range of the
// gradient buffer. The optimizer updates the arena in one kernel call; data-parallel buckets
// and optimizer shards are ranges of it. Adding, replacing, removing or (un)freezing a
// parameter unpacks the store (the views stay valid; the next pack() copies them into a new
// arena).
// Lookups check the shape ("[params] blk.3.attn_q.weight: expected [768, 768], got ...").
#pragma once
#include <string>
#include <vector>

#include "toy/core/tensor.h"

namespace toy {

struct Param {
  std::string name;
  Tensor value;
  Tensor compute;
  bool trainable = true;
  bool decay = false;
  Tensor m, v;
  int64_t arena_offset = -1;  // its first element in the arena (-1: not packed)
};

struct ParamArena {
  Tensor values, grads;  // F32 [numel] each, on the trainable parameters' device
  // AdamW's moments: F32 [moment_end - moment_begin], the arena's elements from moment_begin
  // (all of them, unless a data-parallel rank keeps only its shard's: set_moment_range).
  Tensor m, v;
  int64_t moment_begin = 0, moment_end = 0;
  int64_t numel() const { return values.numel(); }
};

class ParamStore {
 public:
  // Adds a parameter and returns the tensor the modules bind to (its `compute`). Trainable
  // parameters are marked requires_grad; decay defaults to "a matrix that trains".
  Tensor& add(const std::string& name, Tensor t, bool trainable = true);
  Tensor& add(const std::string& name, Tensor t, bool trainable, bool decay);
  // Replaces a parameter's tensor (value and compute; same name, any shape or dtype) and
  // returns it: modules holding the old tensor must be rebound by the caller.
  Tensor& replace(const std::string& name, Tensor t);
  void remove(const std::string& name);
  // Freezes or unfreezes a parameter (its tensor's requires_grad follows; a frozen one drops
  // its gradient and optimizer state; decay follows add()'s rule: a matrix that trains).
  void set_trainable(const std::string& name, bool trainable);
  bool has(const std::string& name) const;
  Param& record(const std::string& name);
  const Param& record(const std::string& name) const;
  // The master tensor of a parameter; the second form also checks its shape.
  Tensor& get(const std::string& name) { return record(name).value; }
  const Tensor& get(const std::string& name) const { return record(name).value; }
  Tensor& get(const std::string& name, const Shape& expect);

  std::vector<Param>& all() { return params_; }
  const std::vector<Param>& all() const { return params_; }
  // The master tensors alone, in order (for code that reads or writes weights, not state).
  // (A hand-written view: clang 14 cannot compile libstdc++ 12's std::views.)
  template <class P, class T>
  class Values {
   public:
    class iterator {
     public:
      explicit iterator(P* p) : p_(p) {}
      T& operator*() const { return p_->value; }
      iterator& operator++() {
        ++p_;
        return *this;
      }
      bool operator==(const iterator& o) const { return p_ == o.p_; }
      bool operator!=(const iterator& o) const { return p_ != o.p_; }

     private:
      P* p_;
    };
    Values(P* begin, P* end) : begin_(begin), end_(end) {}
    iterator begin() const { return iterator(begin_); }
    iterator end() const { return iterator(end_); }

   private:
    P* begin_;
    P* end_;
  };
  Values<Param, Tensor> values() { return {params_.data(), params_.data() + params_.size()}; }
  Values<const Param, const Tensor> values() const { return {params_.data(), params_.data() + params_.size()}; }
  size_t size() const { return params_.size(); }
  int64_t numel() const;            // every parameter's elements
  int64_t trainable_numel() const;  // those of the parameters that train
  void zero_grad();
  // Moves every parameter's memory (and AdamW's moments) to device d in place: the modules
  // holding them see the move. Weights are made (and initialised) on the CPU, then moved once.
  void move_to(Device d);
  // Where the parameters live (the first's device; the CPU for an empty store).
  Device device() const { return params_.empty() ? Device::CPU : params_.front().value.device(); }
  // Packs the trainable parameters into the arena (no-op when packed): their values, m and v
  // (zeros where undefined) and gradients are copied into it. Every trainable parameter must
  // be a contiguous F32 tensor, all on one device.
  void pack();
  // Keeps AdamW's moments only for the parameters whose arena range lies in [begin, end) (a
  // data-parallel rank's shard, ZeRO-1); the others' m and v are dropped. Repacks the store.
  // (-1, -1): moments for every parameter again.
  void set_moment_range(int64_t begin, int64_t end);
  // The arena, or null when the store is not packed.
  const ParamArena* arena() const { return packed_ ? &arena_ : nullptr; }

 private:
  void unpack();
  std::vector<Param> params_;
  ParamArena arena_;
  bool packed_ = false;
  int64_t moment_begin_ = -1, moment_end_ = -1;  // -1: every parameter's
};

}  // namespace toy
