#include "toy/core/allocator.h"

#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "toy/core/error.h"

namespace toy {

size_t allocation_size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= 4096) return (bytes + 63) & ~size_t(63);
  // Above 4 KiB: round up to a multiple of 1/8 of the enclosing power of two.
  size_t p = std::bit_floor(bytes);
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

namespace {

class CpuCachingAllocator final : public Allocator {
 public:
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t bytes, size_t* capacity) override {
    size_t cls = allocation_size_class(bytes);
    *capacity = cls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cache_hits++;
        stats_.bytes_cached -= int64_t(cls);
        note_use(cls);
        return p;
      }
    }
    void* p = std::aligned_alloc(64, cls);
    if (!p) {
      // Give the cache back to the system and try once more before giving up.
      empty_cache();
      p = std::aligned_alloc(64, cls);
      TOY_CHECK(p != nullptr, "[allocator] out of memory allocating {} bytes", cls);
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.system_allocs++;
    note_use(cls);
    return p;
  }

  void deallocate(void* p, size_t capacity) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= int64_t(capacity);
    stats_.bytes_cached += int64_t(capacity);
    free_[capacity].push_back(p);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, list] : free_)
      for (void* p : list) std::free(p);
    free_.clear();
    stats_.bytes_cached = 0;
  }

 private:
  void note_use(size_t cls) {
    stats_.bytes_in_use += int64_t(cls);
    if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

class MissingAllocator final : public Allocator {
 public:
  void* allocate(size_t, size_t*) override { fail("[allocator] toy was built without CUDA"); }
  void deallocate(void*, size_t) override {}
  AllocatorStats stats() const override { return {}; }
  void empty_cache() override {}
};

Allocator* g_allocators[kNumDevices] = {nullptr, nullptr, nullptr};

}  // namespace

Allocator& allocator(Device d) {
  // The CPU allocator lives forever: tensors in static storage may be freed at exit.
  static CpuCachingAllocator* cpu = new CpuCachingAllocator();
  static CpuCachingAllocator* sim = new CpuCachingAllocator();  // host memory of its own, its own stats
  static MissingAllocator* missing = new MissingAllocator();
  if (Allocator* a = g_allocators[int(d)]) return *a;
  if (d == Device::CPU) return *cpu;
  if (d == Device::SIM) return *sim;
  return *missing;
}

void set_allocator(Device d, Allocator* a) { g_allocators[int(d)] = a; }

}  // namespace toy
