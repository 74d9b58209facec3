// Caching allocator: freed blocks go back to a per-size free list and are handed out again,
// so a training step or a generated token allocates nothing from the system once warm.
// Sizes are rounded up to a size class (at most 1/8 waste) so that shapes that vary a little
// (the last batch, a growing KV view) still reuse blocks. 64-byte aligned.
#pragma once
#include <cstddef>
#include <cstdint>

#include "toy/core/device.h"

namespace toy {

struct AllocatorStats {
  int64_t system_allocs = 0;  // blocks obtained from the system (cache misses)
  int64_t cache_hits = 0;     // allocations served from the cache
  int64_t bytes_in_use = 0;
  int64_t bytes_cached = 0;   // free blocks kept for reuse
  int64_t peak_bytes_in_use = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least `bytes` bytes; `*capacity` receives the block's real size.
  virtual void* allocate(size_t bytes, size_t* capacity) = 0;
  virtual void deallocate(void* p, size_t capacity) = 0;
  virtual AllocatorStats stats() const = 0;
  // Returns every cached block to the system.
  virtual void empty_cache() = 0;
};

// The allocator for a device; CUDA's is installed by the CUDA backend.
Allocator& allocator(Device d);
void set_allocator(Device d, Allocator* a);

// Size class used by the caching allocators (exposed for tests).
size_t allocation_size_class(size_t bytes);

}  // namespace toy
