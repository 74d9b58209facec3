// A process-wide pool for the small objects every op creates — tensor handles and storage
// records with their shared_ptr control blocks. Freed blocks stay on a free list per size
// class and are handed out again, so a warm loop (a generated token, a training step) makes
// its tensors without calling operator new. Blocks are never returned to the system: the
// pool holds at most the peak number of live objects, a few hundred KB.
#pragma once
#include <cstddef>
#include <new>

namespace toy {

namespace detail {
void* pool_allocate(size_t bytes);              // bytes <= kMaxPooledBytes, else operator new
void pool_deallocate(void* p, size_t bytes) noexcept;
inline constexpr size_t kMaxPooledBytes = 512;
}  // namespace detail

// An allocator for std::allocate_shared: single objects come from the pool.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    static_assert(alignof(T) <= alignof(std::max_align_t), "over-aligned types are not pooled");
    return static_cast<T*>(detail::pool_allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { detail::pool_deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept { return true; }
};

}  // namespace toy
