#include "toy/nn/kv_cache.h"

#include "toy/core/error.h"
#include "toy/core/machine.h"

namespace toy::nn {

double KVCache::bytes(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim,
                      DType dtype) {
  return 2.0 * double(layers) * double(batch) * double(capacity) * double(kv_heads) * double(head_dim) *
         double(element_size(dtype));
}

KVCache::KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim, DType dtype)
    : batch_(batch), capacity_(capacity), dtype_(dtype) {
  TOY_CHECK(dtype == DType::F32 || dtype == DType::F16, "[kv cache] dtype must be f32 or f16, got {}", name(dtype));
  TOY_CHECK(layers >= 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0,
            "[kv cache] needs batch, capacity, kv heads and head dim > 0 (got {}, {}, {}, {})", batch, capacity,
            kv_heads, head_dim);
  const double need = bytes(layers, batch, capacity, kv_heads, head_dim, dtype);
  const uint64_t avail = available_memory_bytes();
  TOY_CHECK(need <= double(avail), "[kv cache] {} tokens x {} sequences need {}, more than the {} available: use a "
            "smaller context (--ctx)", capacity, batch, format_bytes(need), format_bytes(double(avail)));
  for (int64_t l = 0; l < layers; ++l) {
    keys_.push_back(zeros(Shape{batch, capacity, kv_heads, head_dim}, dtype));
    values_.push_back(zeros(Shape{batch, capacity, kv_heads, head_dim}, dtype));
  }
}

void KVCache::check_room(int64_t tokens) const {
  TOY_CHECK(!keys_.empty(), "[kv cache] the cache is empty: create it with the model's new_cache()");
  TOY_CHECK(len_ + tokens <= capacity_, "[kv cache] full: {} cached + {} new tokens exceed its capacity of {}; create "
            "a larger cache (--ctx) or start over with a shorter history", len_, tokens, capacity_);
}

}  // namespace toy::nn
