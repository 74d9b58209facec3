// The bookkeeping every caching allocator shares (allocator.h): freed blocks kept in lists by
// size class for the next allocation of that class, and the counts AllocatorStats reports.
// Not thread-safe: the allocator holding it locks around every call.
#pragma once
#include <algorithm>
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "toy/core/allocator.h"

namespace toy {

class BlockCache {
 public:
  // A cached block of size class `cls` (counted as a hit and in use), or nullptr.
  void* take(size_t cls) {
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cache_hits++;
    stats_.bytes_cached -= int64_t(cls);
    in_use(cls);
    return p;
  }
  // A block just obtained from the system.
  void allocated(size_t cls) {
    stats_.system_allocs++;
    in_use(cls);
  }
  // A freed block: out of use, into the cache now (put) or later (released then put).
  void released(size_t cls) {
    stats_.bytes_in_use -= int64_t(cls);
    stats_.bytes_cached += int64_t(cls);
  }
  void put(void* p, size_t cls) { free_[cls].push_back(p); }
  // Hands every cached block to `give_back` and forgets them.
  template <class GiveBack>
  void empty(GiveBack&& give_back) {
    for (auto& [cls, list] : free_) {
      for (void* p : list) give_back(p);
      stats_.bytes_cached -= int64_t(cls * list.size());
    }
    free_.clear();
  }
  AllocatorStats& stats() { return stats_; }
  const AllocatorStats& stats() const { return stats_; }

 private:
  void in_use(size_t cls) {
    stats_.bytes_in_use += int64_t(cls);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  }
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

}  // namespace toy
