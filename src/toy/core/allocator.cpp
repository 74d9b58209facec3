#include "toy/core/allocator.h"

#include "toy/core/block_cache.h"

#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#include "toy/core/device_access.h"
#include "toy/core/error.h"
#include "toy/core/registry.h"

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

StreamEvents* g_stream_events[kNumDevices] = {nullptr, nullptr, nullptr};

class CpuCachingAllocator final : public Allocator {
 public:
  explicit CpuCachingAllocator(Device d) : device_(d) {}
  ~CpuCachingAllocator() override { empty_cache(); }

  void* allocate(size_t bytes, size_t* capacity) override {
    size_t cls = allocation_size_class(bytes);
    *capacity = cls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reap_pending();
      if (void* p = cache_.take(cls)) return p;
    }
    void* p = std::aligned_alloc(64, cls);
    if (!p) {
      // Give the cache back to the system and try once more before giving up.
      empty_cache();
      p = std::aligned_alloc(64, cls);
      TOY_CHECK(p != nullptr, "[allocator] out of memory allocating {} bytes", cls);
    }
    std::lock_guard<std::mutex> lock(mu_);
    cache_.allocated(cls);
    return p;
  }

  void deallocate(void* p, size_t capacity, uint64_t other_streams) override {
    StreamEvents* events = g_stream_events[int(device_)];
    Pending pending{p, capacity, {}};
    if (events)  // recorded outside the lock: a device's event call may take its own
      for (StreamId s = 1; s < kMaxStreams; ++s)
        if (other_streams >> s & 1) pending.events.push_back(events->record(s));
    std::lock_guard<std::mutex> lock(mu_);
    cache_.released(capacity);
    if (pending.events.empty()) {
      cache_.put(p, capacity);
    } else {
      pending_.push_back(std::move(pending));
      cache_.stats().blocks_awaiting_streams = int64_t(pending_.size());
    }
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.stats();
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    reap_pending();
    cache_.empty([](void* p) { std::free(p); });  // (blocks other streams may still read stay pending)
  }

 private:
  struct Pending {
    void* p;
    size_t capacity;
    std::vector<std::unique_ptr<StreamEvent>> events;
  };
  // Blocks whose streams have finished with them join the free lists (under mu_).
  void reap_pending() {
    for (size_t i = 0; i < pending_.size();) {
      bool done = true;
      for (const auto& e : pending_[i].events) done = done && e->done();
      if (!done) {
        ++i;
        continue;
      }
      cache_.put(pending_[i].p, pending_[i].capacity);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
    cache_.stats().blocks_awaiting_streams = int64_t(pending_.size());
  }

  Device device_;
  mutable std::mutex mu_;
  BlockCache cache_;
  std::vector<Pending> pending_;  // freed blocks other streams may still be reading
};

class MissingAllocator final : public Allocator {
 public:
  // (the same words --device cuda gives, so a user reads one reason wherever they meet it)
  void* allocate(size_t, size_t*) override { fail("[allocator] {}", device_unavailable(Device::CUDA)); }
  void deallocate(void*, size_t, uint64_t) override {}
  AllocatorStats stats() const override { return {}; }
  void empty_cache() override {}
};

Allocator* g_allocators[kNumDevices] = {nullptr, nullptr, nullptr};

}  // namespace

Allocator& allocator(Device d) {
  // The CPU allocator lives forever: tensors in static storage may be freed at exit.
  static CpuCachingAllocator* cpu = new CpuCachingAllocator(Device::CPU);
  static CpuCachingAllocator* sim = new CpuCachingAllocator(Device::SIM);  // host memory of its own, its own stats
  static MissingAllocator* missing = new MissingAllocator();
  if (d == Device::CUDA && !g_allocators[int(d)]) (void)registry();  // (the CUDA backend installs its allocator)
  if (Allocator* a = g_allocators[int(d)]) return *a;
  if (d == Device::CPU) return *cpu;
  if (d == Device::SIM) return *sim;
  return *missing;
}

void set_allocator(Device d, Allocator* a) { g_allocators[int(d)] = a; }

void set_stream_events(Device d, StreamEvents* events) { g_stream_events[int(d)] = events; }

}  // namespace toy
