#include "toy/nn/kv_cache.h"

#include <algorithm>

#include "toy/core/error.h"
#include "toy/core/machine.h"
#include "toy/ops/ops.h"

namespace toy::nn {

double KVCache::bytes(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                      DType dtype) {
  return 2.0 * double(layers) * double(batch) * double(capacity) * double(kv_heads) * double(head_dim) *
         double(element_size(dtype));
}

KVCache::KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim, DType dtype,
                 std::vector<RecurrentShape> recurrent, Device device, std::vector<int64_t> windows)
    : layers_(layers), batch_(batch), capacity_(capacity), dtype_(dtype) {
  TOY_CHECK(dtype == DType::F32 || dtype == DType::F16, "[kv cache] dtype must be f32 or f16, got {}", name(dtype));
  TOY_CHECK(layers >= 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0,
            "[kv cache] needs batch, capacity, kv heads and head dim > 0 (got {}, {}, {}, {})", batch, capacity,
            kv_heads, head_dim);
  TOY_CHECK(recurrent.empty() || int64_t(recurrent.size()) == layers, "[kv cache] {} recurrent shapes for {} layers",
            recurrent.size(), layers);
  TOY_CHECK(windows.empty() || int64_t(windows.size()) == layers, "[kv cache] {} windows for {} layers",
            windows.size(), layers);
  recurrent.resize(size_t(layers));
  windows.resize(size_t(layers), 0);
  // Positions each attention layer keeps: the capacity, or its window's ring.
  auto slots_of = [&](size_t l) { return windows[l] > 0 ? std::min(capacity, windows[l]) : capacity; };
  double need = 0;
  for (size_t l = 0; l < recurrent.size(); ++l) {
    const RecurrentShape& r = recurrent[l];
    if (!r.defined()) {
      need += bytes(1, batch, slots_of(l), kv_heads, head_dim, dtype);
      continue;
    }
    need += double(batch) * double(r.conv_tail * r.conv_channels + (r.state.ndim() > 0 ? r.state.numel() : 0)) *
            sizeof(float);
  }
  const uint64_t avail = available_memory_bytes();
  TOY_CHECK(need <= double(avail), "[kv cache] {} tokens x {} sequences need {}, more than the {} available: use a "
            "smaller context (--ctx)", capacity, batch, format_bytes(need), format_bytes(double(avail)));
  for (size_t l = 0; l < recurrent.size(); ++l) {
    const RecurrentShape& r = recurrent[l];
    if (r.defined()) {
      keys_.emplace_back(), values_.emplace_back();
      conv_.push_back(zeros(Shape{batch, r.conv_tail, r.conv_channels}, DType::F32, device));
      std::vector<int64_t> dims{batch};
      for (int d = 0; d < r.state.ndim(); ++d) dims.push_back(r.state[d]);
      state_.push_back(r.state.ndim() > 0 ? zeros(Shape(dims), DType::F32, device) : Tensor());
      continue;
    }
    keys_.push_back(zeros(Shape{batch, slots_of(l), kv_heads, head_dim}, dtype, device));
    values_.push_back(zeros(Shape{batch, slots_of(l), kv_heads, head_dim}, dtype, device));
    conv_.emplace_back(), state_.emplace_back();
  }
}

double KVCache::bytes() const {
  double total = 0;
  for (const auto* v : {&keys_, &values_, &conv_, &state_})
    for (const Tensor& t : *v)
      if (t.defined()) total += double(t.numel()) * double(element_size(t.dtype()));
  return total;
}

void KVCache::clear() {
  len_ = 0;
  for (Tensor& t : conv_)
    if (t.defined()) fill_(t, 0.0);
  for (Tensor& t : state_)
    if (t.defined()) fill_(t, 0.0);
}

void KVCache::check_room(int64_t tokens) const {
  TOY_CHECK(layers_ > 0, "[kv cache] the cache is empty: create it with the model's new_cache()");
  TOY_CHECK(len_ + tokens <= capacity_, "[kv cache] full: {} cached + {} new tokens exceed its capacity of {}; create "
            "a larger cache (--ctx) or start over with a shorter history", len_, tokens, capacity_);
}

}  // namespace toy::nn
